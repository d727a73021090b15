//! Many spawns at once against a real two-node Ray cluster on this machine (see `common`):
//! spawns that time out leave no actor behind, and control calls are not queued behind them.
//!
//! It needs `TRAINYARD_RAY_PYTHON`, so it is ignored unless asked for, and fails when it is
//! missing.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RayCluster;
use serde_json::json;
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime_ray::{ActorLaunch, Bridge, BridgeError, ClusterView, RayNodeInfo};

/// How many spawns are fired at once: twice the bridge's 32 worker threads, so that half of
/// them wait for a thread.
const SPAWNS: usize = 64;
/// The bridge's call timeout. A spawn call waits this long and 5 s more; the bridge's own
/// wait for an actor to start is this long, so a spawn that waited for a thread would, without
/// deadlines, still be waiting for its actor after the call gave up.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// What a spawn call may take at most: the call timeout, the call's slack, and scheduling.
const CALL_BOUND: Duration = Duration::from_secs(17);
/// How long the cluster may take to be back to where it started once every call returned.
const SETTLE: Duration = Duration::from_secs(30);
/// The run's actor names start with this.
const PREFIX: &str = "leak-";
/// One CPU per actor: the cluster has three, so at most three actors run at once.
const DEMAND: &str = r#"{"CPU": 1}"#;

fn launch(python: &std::path::Path, index: usize) -> ActorLaunch {
    let resources: Resources = DEMAND.parse().expect("valid resources");
    ActorLaunch {
        name: format!("{PREFIX}{index}"),
        placement: None,
        options: ActorOptions::try_from(&resources).expect("valid options"),
        program: python.display().to_string(),
        args: vec![
            "-c".to_owned(),
            "import sys, time; sys.stdin.readline(); time.sleep(600)".to_owned(),
        ],
        env: BTreeMap::new(),
        config: json!({"driver": "127.0.0.1:1"}),
        token: format!("token-of-{index}"),
        cwd: None,
    }
}

/// The run's actors that are not dead, as the GCS sees them.
fn not_dead(view: &ClusterView) -> Vec<String> {
    view.actors
        .iter()
        .filter(|a| a.name.starts_with(PREFIX) && a.state != "DEAD")
        .map(|a| format!("{} {}", a.name, a.state))
        .collect()
}

/// The CPUs of the alive nodes that are not available.
fn cpus_in_use(nodes: &[RayNodeInfo]) -> f64 {
    nodes
        .iter()
        .filter(|n| n.alive)
        .map(|n| {
            n.total.get("CPU").copied().unwrap_or(0.0)
                - n.available.get("CPU").copied().unwrap_or(0.0)
        })
        .sum()
}

#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_ray_spawns_leak_nothing() {
    let cluster = RayCluster::start(false).unwrap_or_else(|error| panic!("{error}"));
    let (bridge, _) = Bridge::start(cluster.bridge_config().request_timeout(CALL_TIMEOUT))
        .await
        .expect("bridge starts");
    let (observer, _) = Bridge::start(cluster.bridge_config().namespace("observer"))
        .await
        .expect("observer starts");
    let nodes = cluster
        .wait_for_nodes(&observer, 2)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    assert!(cpus_in_use(&nodes).abs() < 1e-9, "{nodes:?}");
    let bridge = Arc::new(bridge);

    let started = Instant::now();
    let spawns: Vec<_> = (0..SPAWNS)
        .map(|index| {
            let bridge = Arc::clone(&bridge);
            let launch = launch(&cluster.python, index);
            tokio::spawn(async move {
                let result = bridge.spawn_actor(&launch).await;
                (launch.name, result.map(|(started, _end)| started))
            })
        })
        .collect();

    // While every worker thread of the bridge is blocked in a spawn, control calls answer.
    let mut registered = 0;
    let busy = tokio::time::timeout(CALL_BOUND, async {
        loop {
            let view = observer.cluster().await.expect("cluster view");
            registered = view
                .actors
                .iter()
                .filter(|a| a.name.starts_with(PREFIX))
                .count();
            if registered >= 32 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        busy.is_ok(),
        "only {registered} actors registered within {CALL_BOUND:?}"
    );
    let asked = Instant::now();
    let held = tokio::time::timeout(Duration::from_secs(5), bridge.actors())
        .await
        .expect("the holdings come within 5 s while spawns block")
        .expect("holdings");
    let answered = asked.elapsed();
    eprintln!(
        "holdings answered in {answered:?} with {} actors held",
        held.actors.len()
    );
    assert!(
        answered < Duration::from_secs(2),
        "a control call waited {answered:?} behind spawns"
    );

    let mut spawned = Vec::new();
    let mut failed = Vec::new();
    for spawn in spawns {
        let (name, result) = spawn.await.expect("the spawn task does not panic");
        match result {
            Ok(started) => spawned.push((name, started)),
            Err(error) => failed.push((name, error)),
        }
    }
    let took = started.elapsed();
    eprintln!(
        "{} spawns started, {} failed, all returned in {took:?}",
        spawned.len(),
        failed.len()
    );
    assert!(
        took < CALL_BOUND,
        "the spawn calls took {took:?}, past their bound"
    );
    assert!(
        spawned.len() <= 3,
        "more actors than CPUs: {:?}",
        spawned.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    for (name, error) in &failed {
        assert!(
            matches!(error, BridgeError::Ray { kind, .. } if kind == "timeout" || kind == "deadline")
                || matches!(error, BridgeError::Timeout { .. }),
            "{name}: {error}"
        );
    }

    // The run ends what it got, as the runtime does; nothing else of it may stay.
    for (name, _) in &spawned {
        bridge.kill_actor(name).await.expect("kill");
    }
    let settle = Instant::now();
    let (left, in_use) = loop {
        let left = not_dead(&observer.cluster().await.expect("cluster view"));
        let in_use = cpus_in_use(&observer.nodes().await.expect("nodes"));
        if (left.is_empty() && in_use.abs() < 1e-9) || settle.elapsed() > SETTLE {
            break (left, in_use);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("settled in {:?}", settle.elapsed());
    let holdings = bridge.actors().await.expect("holdings");
    let live: Vec<_> = holdings
        .actors
        .iter()
        .filter(|a| a.state == "starting" || a.state == "alive")
        .collect();
    assert!(
        left.is_empty() && in_use.abs() < 1e-9,
        "{SETTLE:?} after the calls returned, the run's actors {left:?} are not dead and \
         {in_use} CPUs are in use (the bridge holds {live:?})"
    );
    assert!(
        live.is_empty(),
        "the bridge still holds live actors: {live:?}"
    );

    let bridge = Arc::into_inner(bridge).expect("every spawn task has ended");
    bridge
        .shutdown(Duration::from_secs(20))
        .await
        .expect("shutdown");
    observer
        .shutdown(Duration::from_secs(20))
        .await
        .expect("observer shuts down");
}
