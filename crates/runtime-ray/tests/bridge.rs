//! The bridge against a real two-node Ray cluster on this machine (see `common`).
//!
//! Cluster start-ups are expensive, so one test runs the scenarios that share a cluster, one
//! covers token auth, and one a throwaway local head. They need `TRAINYARD_RAY_PYTHON`, so
//! they are ignored unless asked for, and fail when it is missing.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{HEAD_MEMORY, RayCluster, WORKER_MEMORY, eventually};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::sync::oneshot;
use trainyard_config::PlacementStrategy;
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime_ray::{
    ActorEnded, ActorLaunch, Bridge, BridgeError, DeathKind, GroupState, RayPlacementGroupId,
    Started,
};
use trainyard_sys::procfs::is_alive;

/// The agent stand-in: records its config, role, token and process group, then sleeps; with
/// `TY_TEST_TASK` set it first starts a task (`sleep`) in a process group of its own, as the
/// agent does, and records its pid.
const AGENT: &str = r#"
import json, os, subprocess, sys, time
token = sys.stdin.readline().strip()
out = os.environ["TY_TEST_OUT"]
record = {
    "config": json.loads(os.environ["TRAINYARD_AGENT_CONFIG"]),
    "role": os.environ.get("TRAINYARD_ROLE"),
    "token": token,
    "pid": os.getpid(),
    "pgid": os.getpgid(0),
}
if os.environ.get("TY_TEST_TASK"):
    record["task"] = subprocess.Popen(["sleep", "600"], preexec_fn=os.setpgrp).pid
with open(out + ".tmp", "w") as f:
    json.dump(record, f)
os.rename(out + ".tmp", out)
time.sleep(600)
"#;

const BOUND: Duration = Duration::from_secs(20);

fn resources(json: &str) -> Resources {
    json.parse().expect("valid resources")
}

fn launch(
    cluster: &RayCluster,
    dir: &Path,
    name: &str,
    placement: Option<(RayPlacementGroupId, u32)>,
    dict: &str,
) -> ActorLaunch {
    ActorLaunch {
        name: name.to_owned(),
        placement,
        options: ActorOptions::try_from(&resources(dict)).expect("valid options"),
        program: cluster.python.display().to_string(),
        args: vec!["-c".to_owned(), AGENT.to_owned()],
        env: BTreeMap::from([(
            "TY_TEST_OUT".to_owned(),
            dir.join(format!("{name}.json")).display().to_string(),
        )]),
        config: json!({"driver": "127.0.0.1:1", "name": name}),
        token: format!("token-of-{name}"),
        cwd: None,
    }
}

/// Waits for the agent's record file and returns it.
async fn agent_record(dir: &Path, name: &str) -> serde_json::Value {
    let path: PathBuf = dir.join(format!("{name}.json"));
    assert!(
        eventually(BOUND, || path.exists()).await,
        "agent {name} did not start within {BOUND:?}"
    );
    serde_json::from_str(&std::fs::read_to_string(&path).expect("read record")).expect("json")
}

async fn ended(rx: oneshot::Receiver<ActorEnded>, what: &str) -> ActorEnded {
    tokio::time::timeout(BOUND, rx)
        .await
        .unwrap_or_else(|_| panic!("{what}: no actor_ended within {BOUND:?}"))
        .unwrap_or_else(|_| panic!("{what}: end channel dropped"))
}

/// The end says the actor died of `kind`, and its agent process is gone (bounded).
async fn died_with_its_agent(end: &ActorEnded, kind: DeathKind, agent_pid: u32) {
    assert_eq!(end.died.as_ref().map(|d| d.kind), Some(kind), "{end:?}");
    assert!(
        eventually(BOUND, || !is_alive(agent_pid, None)).await,
        "agent {agent_pid} outlived its actor ({kind:?})"
    );
}

/// Polls the GCS (through `observer`) until no actor named with `prefix` is alive and no group
/// named with it is left; fails with what remains.
async fn nothing_left(observer: &Bridge, prefix: &str) {
    let start = Instant::now();
    loop {
        let view = observer.cluster().await.expect("cluster view");
        let actors: Vec<_> = view
            .actors
            .iter()
            .filter(|a| a.name.starts_with(prefix) && a.state != "DEAD")
            .collect();
        let groups: Vec<_> = view
            .groups
            .iter()
            .filter(|g| g.name.starts_with(prefix) && g.state != GroupState::Removed)
            .collect();
        if actors.is_empty() && groups.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < BOUND,
            "left behind after {BOUND:?}: actors {actors:?}, groups {groups:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn node<'a>(
    nodes: &'a [trainyard_runtime_ray::RayNodeInfo],
    resource: &str,
) -> &'a trainyard_runtime_ray::RayNodeInfo {
    nodes
        .iter()
        .find(|n| n.alive && n.total.contains_key(resource))
        .unwrap_or_else(|| panic!("no alive node with {resource}: {nodes:?}"))
}

/// Creates a group and waits until it is placed; returns it with its bundles' nodes.
async fn ready_group(
    bridge: &Bridge,
    name: &str,
    bundles: &[&str],
    strategy: PlacementStrategy,
) -> (RayPlacementGroupId, Vec<String>) {
    let bundles: Vec<Resources> = bundles.iter().map(|b| resources(b)).collect();
    let pg = bridge
        .create_placement_group(name, &bundles, strategy)
        .await
        .expect("group created");
    let readiness = bridge.wait_placement_group(&pg, BOUND).await.expect("wait");
    assert!(readiness.ready, "group {name} not ready: {readiness:?}");
    (pg, readiness.bundle_nodes)
}

/// One bundle's worth for the two-agent scenario.
const BUNDLE: &str = r#"{"CPU": 1, "memory": 500000000}"#;

/// A started actor with its end receiver.
type Running = (Started, oneshot::Receiver<ActorEnded>);

/// A cluster, a bridge on it and a directory for the agents' records.
struct Scene {
    cluster: RayCluster,
    bridge: Bridge,
    dir: tempfile::TempDir,
}

impl Scene {
    fn launch(
        &self,
        name: &str,
        placement: Option<(RayPlacementGroupId, u32)>,
        dict: &str,
    ) -> ActorLaunch {
        launch(&self.cluster, self.dir.path(), name, placement, dict)
    }

    /// Both nodes alive, with the memory and custom resources they were started with.
    async fn nodes_are_listed_as_started(&self) -> (String, String) {
        let nodes = self
            .cluster
            .wait_for_nodes(&self.bridge, 2)
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        let head = node(&nodes, "head_res");
        let worker = node(&nodes, "worker_res");
        assert_ne!(head.node_id, worker.node_id);
        assert_eq!(head.total.get("memory"), Some(&(HEAD_MEMORY as f64)));
        assert_eq!(worker.total.get("memory"), Some(&(WORKER_MEMORY as f64)));
        assert_eq!(head.total.get("CPU"), Some(&2.0));
        assert_eq!(worker.total.get("worker_res"), Some(&2.0));
        assert_eq!(worker.total.get("GPU"), Some(&1.0));
        assert!(
            nodes
                .iter()
                .flat_map(|n| n.total.keys().chain(n.available.keys()))
                .all(|k| !k.starts_with("node:") && !k.contains("_group_")),
            "node:* and group entries are dropped: {nodes:?}"
        );
        (head.node_id.clone(), worker.node_id.clone())
    }

    /// A SPREAD group of two bundles lands on two nodes; one actor per bundle starts the agent
    /// stand-in with the filled-in configuration, its token and its `memory`.
    async fn spread_group_runs_two_agents(&self) -> (RayPlacementGroupId, Vec<Running>) {
        let t = Instant::now();
        let (pg, bundle_nodes) = ready_group(
            &self.bridge,
            "e2e-spread",
            &[BUNDLE, BUNDLE],
            PlacementStrategy::Spread,
        )
        .await;
        eprintln!("timing: SPREAD group create+ready {:?}", t.elapsed());
        assert_eq!(bundle_nodes.len(), 2);
        assert_ne!(bundle_nodes[0], bundle_nodes[1]);
        let status = self.bridge.placement_group_state(&pg).await.expect("state");
        assert_eq!(status.state, GroupState::Created);
        assert_eq!(status.bundle_nodes, bundle_nodes);

        let mut running = Vec::new();
        for (i, bundle_node) in (0..2u32).zip(&bundle_nodes) {
            let name = format!("e2e-w{i}");
            let t = Instant::now();
            let mut launch = self.launch(&name, Some((pg.clone(), i)), BUNDLE);
            if i == 0 {
                launch.env.insert("TY_TEST_TASK".to_owned(), "1".to_owned());
            }
            let (started, end) = self
                .bridge
                .spawn_actor(&launch)
                .await
                .expect("actor spawns");
            let record = agent_record(self.dir.path(), &name).await;
            eprintln!(
                "timing: actor {name} spawn to agent running {:?}",
                t.elapsed()
            );
            assert_eq!(&started.node_id, bundle_node);
            assert_eq!(record["config"]["node_id"], json!(started.node_id));
            assert_eq!(record["config"]["parent"], json!(started.actor_pid));
            assert_eq!(
                record["config"]["name"],
                json!(name),
                "the template is kept"
            );
            assert_eq!(record["config"]["node_ip"], json!(started.node_ip));
            assert_eq!(record["pid"], json!(started.pid));
            assert_eq!(
                record["pgid"],
                json!(started.actor_pid),
                "agent in the actor's group"
            );
            assert_eq!(record["role"], json!("agent"));
            assert_eq!(record["token"], json!(format!("token-of-{name}")));
            assert_eq!(started.assigned.get("memory"), Some(&500_000_000.0));
            assert_eq!(started.assigned.get("CPU"), Some(&1.0));
            running.push((started, end));
        }
        let held = self.bridge.actors().await.expect("actors");
        assert_eq!(held.groups, vec![pg.clone()]);
        assert!(held.actors.iter().all(|a| a.state == "alive"), "{held:?}");
        (pg, running)
    }

    /// A signal reaches the agent, after the agent's task's process group (the actor lives
    /// on); `ray.kill` ends an actor as `killed` and takes its agent along.
    async fn signal_and_kill_end_what_they_should(&self, w0: Running, w1: Running) {
        let (w0_started, w0_end) = w0;
        // SIGKILL with a task group: the agent's task goes first.
        let record = agent_record(self.dir.path(), "e2e-w0").await;
        let task = record["task"]
            .as_u64()
            .and_then(|task| u32::try_from(task).ok())
            .expect("the agent of e2e-w0 records its task");
        let task_pgid = i32::try_from(task).expect("pid fits");
        let sent = self
            .bridge
            .signal_actor("e2e-w0", Signal::SIGKILL, Some(task_pgid))
            .await;
        assert!(sent.expect("signal"), "the agent was running");
        let end = ended(w0_end, "SIGKILL to the agent").await;
        assert_eq!(
            (end.exit_code, end.signal, end.died.clone()),
            (None, Some(9), None),
            "{end:?}"
        );
        assert!(
            eventually(BOUND, || !is_alive(task, None)).await,
            "the agent's task group was not killed"
        );
        assert!(
            is_alive(w0_started.actor_pid, None),
            "the actor outlives its agent"
        );

        let (w1_started, w1_end) = w1;
        self.bridge.kill_actor("e2e-w1").await.expect("kill");
        let end = ended(w1_end, "ray.kill").await;
        died_with_its_agent(&end, DeathKind::Killed, w1_started.pid).await;

        let err = self
            .bridge
            .spawn_actor(&self.launch("e2e-w0", None, BUNDLE))
            .await
            .expect_err("a name in use");
        assert!(
            matches!(err, BridgeError::Ray { ref kind, .. } if kind == "name_taken"),
            "{err}"
        );
    }

    /// Custom resources and the GPU id come through exactly; removing the group ends the actor
    /// and its agent.
    async fn a_gpu_actor_ends_with_its_group(&self, worker_node: &str) {
        let dict = r#"{"GPU": 1, "worker_res": 1}"#;
        let (pg, _) = ready_group(&self.bridge, "e2e-gpu", &[dict], PlacementStrategy::Pack).await;
        let (gpu, end) = self
            .bridge
            .spawn_actor(&self.launch("e2e-gpu0", Some((pg.clone(), 0)), dict))
            .await
            .expect("gpu actor spawns");
        assert_eq!(gpu.node_id, worker_node);
        assert_eq!(gpu.accelerator_ids.get("GPU"), Some(&vec!["0".to_owned()]));
        assert_eq!(gpu.assigned.get("worker_res"), Some(&1.0));
        let record = agent_record(self.dir.path(), "e2e-gpu0").await;
        assert_eq!(record["config"]["accelerator_ids"]["GPU"], json!(["0"]));

        self.bridge
            .remove_placement_group(&pg)
            .await
            .expect("remove");
        let end = ended(end, "group removal").await;
        eprintln!(
            "group removal ended the actor with {:?} (signal {:?})",
            end.died, end.signal
        );
        assert!(end.died.is_some(), "{end:?}");
        assert!(
            eventually(BOUND, || !is_alive(gpu.pid, None)).await,
            "agent survived group removal"
        );
    }
}

/// SIGKILL of a bridge: its client sees it lost, and Ray removes its job's actors and groups.
async fn a_killed_bridge_leaves_nothing(cluster: &RayCluster, observer: &Bridge, dir: &Path) {
    let (victim, _) = Bridge::start(cluster.bridge_config())
        .await
        .expect("victim starts");
    let (pg, _) = ready_group(&victim, "kill-pg", &[BUNDLE], PlacementStrategy::Pack).await;
    let (started, end) = victim
        .spawn_actor(&launch(cluster, dir, "kill-a0", Some((pg, 0)), BUNDLE))
        .await
        .expect("actor");
    let pid = i32::try_from(victim.pid().expect("pid")).expect("pid fits");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).expect("kill");
    let end = ended(end, "bridge SIGKILL").await;
    assert_eq!(
        end.died.as_ref().map(|d| d.kind),
        Some(DeathKind::BridgeLost)
    );
    let err = victim.nodes().await.expect_err("the bridge is gone");
    assert!(matches!(err, BridgeError::Lost { .. }), "{err}");
    nothing_left(observer, "kill-").await;
    assert!(
        eventually(BOUND, || !is_alive(started.pid, None)).await,
        "agent survived"
    );
}

/// A lost node: the unavailable actor is reported once Ray declares the node dead.
async fn node_loss_is_reported_as_node_died(cluster: &mut RayCluster, bridge: &Bridge, dir: &Path) {
    let on_worker = r#"{"CPU": 1, "worker_res": 1}"#;
    let (pg, _) = ready_group(bridge, "lost-pg", &[on_worker], PlacementStrategy::Pack).await;
    let (started, end) = bridge
        .spawn_actor(&launch(
            cluster,
            dir,
            "lost-a0",
            Some((pg.clone(), 0)),
            on_worker,
        ))
        .await
        .expect("actor on the worker");
    let t = Instant::now();
    cluster.kill_worker_node();
    // Ray declares a node dead after about 15 s of missed health checks.
    let end = tokio::time::timeout(Duration::from_secs(45), end)
        .await
        .expect("an end within 45 s of the node loss")
        .expect("end channel");
    eprintln!("timing: node loss reported after {:?}", t.elapsed());
    died_with_its_agent(&end, DeathKind::NodeDied, started.pid).await;
    let nodes = bridge.nodes().await.expect("nodes");
    assert!(
        nodes
            .iter()
            .any(|n| !n.alive && n.node_id == started.node_id),
        "the lost node stays listed as dead: {nodes:?}"
    );
    bridge.remove_placement_group(&pg).await.expect("remove");
}

#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_cluster_places_starts_ends_and_cleans_up_through_the_bridge() {
    let cluster = RayCluster::start(false).unwrap_or_else(|error| panic!("{error}"));
    let t = Instant::now();
    let (bridge, ready) = Bridge::start(cluster.bridge_config())
        .await
        .expect("bridge starts");
    eprintln!(
        "timing: first bridge start {:?} (ray.init {:.3} s)",
        t.elapsed(),
        ready.init_s
    );
    assert_eq!(ready.ray_version, "2.60.0");
    assert!(!ready.started_head);
    let dir = tempfile::tempdir().expect("temp dir");
    let scene = Scene {
        cluster,
        bridge,
        dir,
    };

    let (_, worker_node) = scene.nodes_are_listed_as_started().await;
    let (_pg, mut running) = scene.spread_group_runs_two_agents().await;
    let w1 = running.pop().expect("two actors");
    let w0 = running.pop().expect("two actors");
    let w0_actor = w0.0.actor_pid;
    scene.signal_and_kill_end_what_they_should(w0, w1).await;
    scene.a_gpu_actor_ends_with_its_group(&worker_node).await;

    // shutdown: nothing of this bridge is left in the GCS.
    let Scene {
        mut cluster,
        bridge,
        dir,
    } = scene;
    let t = Instant::now();
    let (observer, ready) = Bridge::start(cluster.bridge_config().namespace("observer"))
        .await
        .expect("observer starts");
    eprintln!(
        "timing: a second bridge start {:?} (ray.init {:.3} s)",
        t.elapsed(),
        ready.init_s
    );
    let t = Instant::now();
    bridge.shutdown(BOUND).await.expect("shutdown");
    nothing_left(&observer, "e2e-").await;
    eprintln!("timing: shutdown to nothing left {:?}", t.elapsed());
    assert!(!is_alive(w0_actor, None), "actor process survived shutdown");

    a_killed_bridge_leaves_nothing(&cluster, &observer, dir.path()).await;
    node_loss_is_reported_as_node_died(&mut cluster, &observer, dir.path()).await;
    observer.shutdown(BOUND).await.expect("observer shuts down");

    // The fixture stops exactly its own processes.
    let temp = cluster.temp_dir.display().to_string();
    drop(cluster);
    let left = common::processes_mentioning(&temp);
    assert!(left.is_empty(), "cluster processes left: {left:?}");
}

#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_rejects_a_wrong_or_missing_token_fast_and_accepts_the_right_one() {
    let cluster = RayCluster::start(true).unwrap_or_else(|error| panic!("{error}"));
    let token = cluster.token.clone().expect("auth cluster");

    let t = Instant::now();
    let err = Bridge::start(
        cluster
            .bridge_config()
            .env("RAY_AUTH_TOKEN", "0".repeat(64)),
    )
    .await
    .expect_err("a wrong token");
    let took = t.elapsed();
    eprintln!("timing: wrong token rejected in {took:?}: {err}");
    assert!(matches!(err, BridgeError::Auth { .. }), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    let t = Instant::now();
    let err = Bridge::start(
        cluster
            .bridge_config()
            .env("RAY_AUTH_TOKEN", "")
            .env("RAY_AUTH_MODE", "token")
            .env("RAY_AUTH_TOKEN_PATH", "/nonexistent/trainyard-token"),
    )
    .await
    .expect_err("no token");
    eprintln!("timing: missing token rejected in {:?}: {err}", t.elapsed());
    assert!(matches!(err, BridgeError::Auth { .. }), "{err}");
    assert!(
        err.to_string().contains("/nonexistent/trainyard-token"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));

    let t = Instant::now();
    let (bridge, _) = Bridge::start(cluster.bridge_config().env("RAY_AUTH_TOKEN", &token))
        .await
        .expect("the right token");
    eprintln!("timing: bridge start with token {:?}", t.elapsed());
    cluster
        .wait_for_nodes(&bridge, 2)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    bridge.shutdown(BOUND).await.expect("shutdown");
}

/// Starts a bridge with a throwaway local head.
async fn throwaway(python: &Path) -> Bridge {
    let t = Instant::now();
    let (bridge, ready) = Bridge::start(
        trainyard_runtime_ray::BridgeConfig::default()
            .python(python)
            .start_timeout(Duration::from_secs(90)),
    )
    .await
    .expect("throwaway head starts");
    eprintln!(
        "timing: throwaway head ready in {:?} (ray.init {:.3} s)",
        t.elapsed(),
        ready.init_s
    );
    assert!(ready.started_head);
    let nodes = bridge.nodes().await.expect("nodes");
    assert_eq!(nodes.iter().filter(|n| n.alive).count(), 1);
    bridge
}

/// Every process the bridge started (its process group) is gone, within a bound.
async fn its_processes_are_gone(bridge_pid: u32, how: &str) {
    let mut left = Vec::new();
    let gone = eventually(BOUND, || {
        left = common::processes_in_group(bridge_pid);
        left.is_empty()
    })
    .await;
    assert!(
        gone,
        "after {how}, processes of the throwaway head remain: {left:?}"
    );
}

#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throwaway_head_writes_no_token_file_and_stops_with_its_bridge() {
    let python = common::python().unwrap_or_else(|error| panic!("{error}"));
    let token_file = std::env::var_os("HOME").map(|h| Path::new(&h).join(".ray/auth_token"));
    let had_token = token_file.as_deref().is_some_and(Path::exists);

    let bridge = throwaway(&python).await;
    let pid = bridge.pid().expect("pid");
    assert!(
        common::processes_in_group(pid).len() > 1,
        "the head's processes are in the bridge's group"
    );
    bridge.shutdown(BOUND).await.expect("shutdown");
    its_processes_are_gone(pid, "shutdown").await;
    if had_token {
        common::skip("~/.ray/auth_token existed before the test: its absence cannot be checked");
    } else if let Some(file) = token_file {
        assert!(!file.exists(), "ray.init() wrote {}", file.display());
    }

    // A bridge that dies: the client sweeps its process group (Ray's agents would outlive it).
    let bridge = throwaway(&python).await;
    let pid = bridge.pid().expect("pid");
    let raw = i32::try_from(pid).expect("pid fits");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), Signal::SIGKILL).expect("kill");
    its_processes_are_gone(pid, "SIGKILL of the bridge").await;
    let err = bridge.actors().await.expect_err("lost");
    assert!(matches!(err, BridgeError::Lost { .. }), "{err}");
}

#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_dies_with_its_parent_and_refuses_a_parent_it_was_not_meant_for() {
    let python = common::python().unwrap_or_else(|error| panic!("{error}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("bridge.py");
    std::fs::write(&script, trainyard_runtime_ray::BRIDGE_SCRIPT).expect("write the script");
    // Nothing listens there: the bridge stays busy connecting, or is still importing ray.
    let closed = format!("127.0.0.1:{}", common::free_port().expect("a free port"));

    // A parent (sh) that starts the bridge and is then SIGKILLed.
    let mut parent = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"TRAINYARD_BRIDGE_PARENT=$$ "$0" "$1" <&0 & wait"#)
        .arg(&python)
        .arg(&script)
        .env("TRAINYARD_RAY_ADDRESS", &closed)
        .stdin(std::process::Stdio::piped()) // held open below: the bridge reads it
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("sh");
    let _stdin = parent.stdin.take();
    let sh = parent.id();
    let script_text = script.display().to_string();
    let mut bridge = Vec::new();
    assert!(
        eventually(BOUND, || {
            bridge = common::processes_mentioning(&script_text);
            !bridge.is_empty()
        })
        .await,
        "the bridge did not start"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(sh).expect("pid fits")),
        Signal::SIGKILL,
    )
    .expect("kill the parent");
    parent.wait().expect("reap sh");
    let mut left = Vec::new();
    let gone = eventually(Duration::from_secs(5), || {
        left = common::processes_mentioning(&script_text);
        left.is_empty()
    })
    .await;
    for pid in &left {
        // Do not leave a failed run's bridge hanging in ray.init for minutes.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(*pid).expect("pid fits")),
            Signal::SIGKILL,
        );
    }
    assert!(
        gone,
        "the bridge outlived its parent: {left:?} (of {bridge:?})"
    );
    // A bridge whose parent is not the one named exits at once, before importing ray.
    let t = Instant::now();
    let status = std::process::Command::new(&python)
        .arg(&script)
        .env("TRAINYARD_BRIDGE_PARENT", "1")
        .env("TRAINYARD_RAY_ADDRESS", &closed)
        .stdin(std::process::Stdio::null())
        .status()
        .expect("python");
    assert_eq!(status.code(), Some(70), "{status}");
    assert!(t.elapsed() < Duration::from_secs(5));
}
