//! The Ray runtime on a real two-node Ray cluster on this machine: the conformance suite that
//! sim and local pass, workers that Ray places and that see what Ray assigned them, fast
//! refusals of what can never fit, and nothing left in Ray afterwards. The tests need
//! `TRAINYARD_RAY_PYTHON` (an interpreter with `ray`), so they are ignored unless asked for
//! (`cargo nextest run --run-ignored only`), and fail when it is missing.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::RayCluster;
use futures::StreamExt as _;
use tokio::time::timeout;
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_hub::AgentCommand;
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime::events::ActorEvent;
use trainyard_runtime::{
    ActorRuntime, ActorRuntimeExt as _, ActorSpec, DeathCause, RuntimeError, TaskSpec, conformance,
};
use trainyard_runtime_ray::{Bridge, GroupState, RayConfig, RayRuntime};

/// The bound of every scenario.
const LIMIT: Duration = Duration::from_secs(300);

/// The stand-alone agent of `examples/ray_agent.rs`, built beside the test binary.
fn agent() -> AgentCommand {
    AgentCommand::new(
        trainyard_test_support::processes::example("ray_agent"),
        Vec::<String>::new(),
    )
}

async fn runtime(cluster: &RayCluster, run: &str) -> RayRuntime {
    let config = RayConfig::new(run)
        .expect("config")
        .bridge(cluster.bridge_config().namespace(run))
        .address(&cluster.address)
        .agent(agent())
        .stop_grace(Duration::from_secs(2));
    let runtime = RayRuntime::start(config).await.expect("the runtime starts");
    cluster
        .wait_for_nodes(runtime.placer().bridge(), 2)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    runtime
}

fn resources(json: &str) -> Resources {
    Resources::parse_json(json).expect("valid resources")
}

/// What the cluster still holds whose name starts with `prefix`, seen from another driver.
async fn leftovers(observer: &Bridge, prefix: &str) -> (Vec<String>, Vec<String>) {
    let view = observer.cluster().await.expect("the GCS view");
    let actors = view
        .actors
        .iter()
        .filter(|a| a.name.starts_with(prefix) && a.state != "DEAD")
        .map(|a| format!("{} {}", a.name, a.state))
        .collect();
    let groups = view
        .groups
        .iter()
        .filter(|g| g.name.starts_with(prefix) && g.state != GroupState::Removed)
        .map(|g| format!("{} {:?}", g.name, g.state))
        .collect();
    (actors, groups)
}

async fn nothing_left(observer: &Bridge, prefix: &str) {
    let start = Instant::now();
    loop {
        let (actors, groups) = leftovers(observer, prefix).await;
        if actors.is_empty() && groups.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "left in Ray after the run: actors {actors:?}, groups {groups:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SPREAD puts two workers on two nodes; each sees the `memory` and custom resource Ray
/// assigned it, and its node as Ray reports it.
async fn spread_workers_land_on_both_nodes_with_their_memory(runtime: &RayRuntime) {
    let factory = PlacementGroupFactory {
        bundles: vec![resources(r#"{"CPU": 1, "memory": 100000000}"#); 2],
        strategy: PlacementStrategy::Spread,
    };
    let pg = runtime
        .create_placement_group(&factory)
        .await
        .expect("group");
    let placed = runtime
        .wait_placement_group_ready(pg, Duration::from_secs(30))
        .await
        .expect("ready");
    let distinct: BTreeSet<_> = placed.bundle_nodes.iter().collect();
    assert_eq!(distinct.len(), 2, "SPREAD over two nodes: {placed:?}");
    for (index, node) in placed.bundle_nodes.iter().enumerate() {
        let options = ActorOptions::try_from(&factory.bundles[index]).expect("options");
        let spec = ActorSpec {
            name: format!("spread-{index}"),
            options,
            placement: Some((pg, index)),
            env: Default::default(),
        };
        let actor = runtime.spawn(spec).await.expect("spawn");
        let info = runtime.node_info(actor).await.expect("node info");
        assert_eq!(
            &info.node_id, node,
            "worker {index} runs where bundle {index} is"
        );
        // Ray's own view from inside the actor: the memory option is assigned, not a custom
        // resource; the agent prints what its actor was given.
        let mut events = runtime
            .task_events(actor)
            .await
            .expect("events")
            .expect("a stream");
        let probe = TaskSpec::Command {
            program: "sh".into(),
            args: vec!["-c".into(), "echo node=$TRAINYARD_TEST_NODE".into()],
            env: [("TRAINYARD_TEST_NODE".to_owned(), info.node_id.to_string())].into(),
        };
        runtime.run_task(actor, probe).await.expect("task");
        let mut lines = Vec::new();
        while let Ok(Some(event)) = timeout(Duration::from_secs(30), events.next()).await {
            match event {
                ActorEvent::Task {
                    event: trainyard_runtime::TaskEvent::Log { line, .. },
                    ..
                } => {
                    lines.push(line);
                }
                ActorEvent::TaskExited { exit, .. } => {
                    assert_eq!(exit, trainyard_runtime::TaskExit::from_code(0), "{exit:?}");
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(lines, [format!("node={node}")]);
    }
    let view = runtime.placer().bridge().actors().await.expect("holdings");
    let alive = view.actors.iter().filter(|a| a.state == "alive").count();
    assert_eq!(alive, 2, "{view:?}");
    runtime.remove_placement_group(pg).await.expect("removed");
}

/// A bundle larger than every node is refused at once, naming the bundle and the largest
/// node's memory; Ray itself would wait forever.
async fn a_request_no_node_can_hold_fails_at_once(runtime: &RayRuntime) {
    let factory = PlacementGroupFactory {
        bundles: vec![resources(r#"{"CPU": 1, "memory": "100GB"}"#); 2],
        strategy: PlacementStrategy::Pack,
    };
    let started = Instant::now();
    let error = runtime
        .create_placement_group(&factory)
        .await
        .expect_err("no node has 100 GB");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let RuntimeError::Infeasible(why) = &error else {
        panic!("not infeasible: {error}");
    };
    let text = why.to_string();
    assert!(
        text.contains("bundle 0") && text.contains("memory"),
        "{text}"
    );
    eprintln!("refused: {text}");
}

/// A worker's Ray actor killed from outside: the death reaches the driver as data.
async fn a_worker_actor_killed_from_outside_dies_as_data(runtime: &RayRuntime) {
    let spec = ActorSpec {
        name: "victim".into(),
        options: ActorOptions::try_from(&resources(r#"{"CPU": 1}"#)).expect("options"),
        placement: None,
        env: Default::default(),
    };
    let actor = runtime.spawn(spec).await.expect("spawn");
    let mut events = runtime
        .task_events(actor)
        .await
        .expect("events")
        .expect("a stream");
    let sleep = TaskSpec::Command {
        program: "sleep".into(),
        args: vec!["600".into()],
        env: Default::default(),
    };
    runtime.run_task(actor, sleep).await.expect("task");
    let holdings = runtime.placer().bridge().actors().await.expect("holdings");
    let name = holdings
        .actors
        .iter()
        .find(|a| a.name.contains("victim"))
        .map(|a| a.name.clone())
        .expect("the victim's actor");
    runtime
        .placer()
        .bridge()
        .kill_actor(&name)
        .await
        .expect("ray.kill");
    let death = timeout(Duration::from_secs(30), async {
        while let Some(event) = events.next().await {
            if let ActorEvent::Died(cause) = event {
                return cause;
            }
        }
        panic!("the stream ended without a death");
    })
    .await
    .expect("the death is seen");
    assert!(
        matches!(
            death,
            DeathCause::ProcessExited {
                signal: Some(9),
                ..
            } | DeathCause::ConnectionLost
        ),
        "{death:?}"
    );
}

#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ray_runtime_conforms_places_refuses_and_leaves_nothing_behind() {
    let cluster = RayCluster::start(false).unwrap_or_else(|error| panic!("{error}"));
    let run = "tyray-conform";
    let runtime = runtime(&cluster, run).await;
    timeout(LIMIT, async {
        conformance::run_all(&runtime).await;
        conformance::run_commands(&runtime).await;
        spread_workers_land_on_both_nodes_with_their_memory(&runtime).await;
        a_request_no_node_can_hold_fails_at_once(&runtime).await;
        a_worker_actor_killed_from_outside_dies_as_data(&runtime).await;
    })
    .await
    .expect("the scenarios end in time");
    runtime.shutdown().await;
    let (observer, _) = Bridge::start(cluster.bridge_config().namespace("observer"))
        .await
        .expect("an observer");
    nothing_left(&observer, run).await;
    observer
        .shutdown(Duration::from_secs(10))
        .await
        .expect("observer stops");
}
