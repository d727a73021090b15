//! Fault injection wrappers around the simulated cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime::sim::faults::{
    DelayReady, FailSpawn, Fault, Faulty, KillActorAfterCalls, LoseNodeAfterCalls,
};
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, NodeId, RuntimeError};

fn spec(name: &str, cpus: &str) -> ActorSpec {
    let demand: Resources = format!("CPU={cpus}").parse().expect("valid");
    ActorSpec {
        name: name.to_owned(),
        options: ActorOptions::try_from(&demand).expect("valid"),
        placement: None,
        env: BTreeMap::new(),
    }
}

fn two_nodes() -> SimRuntime {
    SimRuntime::new([SimNode::new("a").cpus(2), SimNode::new("b").cpus(2)])
}

fn assert_died(result: Result<impl std::fmt::Debug, RuntimeError>) {
    match result {
        Err(RuntimeError::ActorDied { .. }) => {}
        other => panic!("expected ActorDied, got {other:?}"),
    }
}

#[tokio::test]
async fn the_chosen_actor_dies_after_answering_its_calls_and_the_others_live_on() {
    let sim = two_nodes();
    let runtime = KillActorAfterCalls::new(Arc::new(sim.clone()), 1, 2);
    let first = runtime.spawn(spec("w0", "1")).await.expect("spawn");
    let doomed = runtime.spawn(spec("w1", "1")).await.expect("spawn");
    assert_eq!(runtime.target(), Some(doomed));
    runtime
        .node_info(doomed)
        .await
        .expect("first call answered");
    runtime
        .find_free_port(doomed)
        .await
        .expect("second call answered");
    assert_died(runtime.node_info(doomed).await);
    assert_eq!(
        sim.live_actors(),
        [first],
        "killed in the inner runtime, resources freed"
    );
    assert_eq!(
        sim.cluster().await.expect("cluster").available(),
        "CPU=3".parse().expect("valid")
    );
    for _ in 0..5 {
        runtime
            .node_info(first)
            .await
            .expect("the other actor is unaffected");
    }
}

#[tokio::test]
async fn zero_calls_kills_the_chosen_actor_right_after_its_spawn() {
    let sim = two_nodes();
    let runtime = KillActorAfterCalls::new(Arc::new(sim.clone()), 0, 0);
    let actor = runtime
        .spawn(spec("w0", "1"))
        .await
        .expect("spawn succeeds");
    assert!(sim.live_actors().is_empty());
    assert_died(runtime.node_info(actor).await);
}

#[tokio::test]
async fn the_nth_spawn_fails_and_starts_nothing() {
    let sim = two_nodes();
    let runtime = FailSpawn::new(Arc::new(sim.clone()), 1);
    let first = runtime.spawn(spec("w0", "1")).await.expect("spawn 0");
    let err = runtime.spawn(spec("w1", "1")).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::SpawnFailed { name, .. } if name == "w1"),
        "{err}"
    );
    assert_eq!(sim.live_actors(), [first]);
    assert_eq!(
        sim.cluster().await.expect("cluster").available(),
        "CPU=3".parse().expect("valid")
    );
    runtime.spawn(spec("w2", "1")).await.expect("spawn 2");
    assert_eq!(sim.live_actors().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn readiness_is_delayed_and_the_delay_counts_against_the_timeout() {
    let sim = two_nodes();
    let runtime = DelayReady::new(Arc::new(sim), Duration::from_secs(3));
    let f = PlacementGroupFactory {
        bundles: vec!["CPU=1".parse().expect("valid")],
        strategy: PlacementStrategy::Pack,
    };
    let pg = runtime.create_placement_group(&f).await.expect("feasible");

    let started = Instant::now();
    runtime
        .wait_placement_group_ready(pg, Duration::from_secs(10))
        .await
        .expect("ready");
    assert_eq!(started.elapsed(), Duration::from_secs(3));

    let started = Instant::now();
    let err = runtime
        .wait_placement_group_ready(pg, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert!(
        matches!(err, RuntimeError::PlacementTimeout { waited, .. } if waited == Duration::from_secs(2)),
        "{err}"
    );
}

#[tokio::test]
async fn the_node_is_lost_after_the_given_number_of_calls() {
    let sim = two_nodes();
    let runtime = LoseNodeAfterCalls::new(sim.clone(), NodeId::from("a"), 3);
    let on_a = runtime.spawn(spec("w0", "2")).await.expect("spawn");
    let on_b = runtime.spawn(spec("w1", "2")).await.expect("spawn");
    assert_eq!(sim.actor_node(on_a), Some(NodeId::from("a")));
    runtime.node_info(on_a).await.expect("call 1");
    runtime.node_info(on_b).await.expect("call 2");
    runtime
        .node_info(on_a)
        .await
        .expect("call 3 is answered, then the node goes");
    assert_died(runtime.node_info(on_a).await);
    runtime.node_info(on_b).await.expect("node b lives");
    let cluster = runtime.cluster().await.expect("cluster");
    assert_eq!(cluster.nodes.len(), 1);
}

#[tokio::test]
async fn losing_a_node_after_zero_calls_loses_it_at_once() {
    let sim = two_nodes();
    let _runtime = LoseNodeAfterCalls::new(sim.clone(), NodeId::from("b"), 0);
    assert_eq!(
        sim.cluster().await.expect("cluster").total(),
        "CPU=2".parse().expect("valid")
    );
}

#[tokio::test]
async fn wrappers_stack_and_show_what_they_wrap_in_debug() {
    let sim = two_nodes();
    let runtime: Arc<dyn ActorRuntime> = Arc::new(FailSpawn::new(
        Arc::new(KillActorAfterCalls::new(Arc::new(sim.clone()), 0, 1)),
        5,
    ));
    let actor = runtime.spawn(spec("w0", "1")).await.expect("spawn");
    runtime.node_info(actor).await.expect("one call");
    assert_died(runtime.node_info(actor).await);
    let text = format!("{runtime:?}");
    assert!(
        text.contains("FailNthSpawn")
            && text.contains("KillAfterCalls")
            && text.contains("SimRuntime"),
        "{text}"
    );
    let delay = format!(
        "{:?}",
        DelayReady::new(Arc::new(sim.clone()), Duration::from_secs(1))
    );
    assert!(delay.contains("ReadyDelay"), "{delay}");
    let lose = format!("{:?}", LoseNodeAfterCalls::new(sim, NodeId::from("a"), 9));
    assert!(lose.contains("LoseNode"), "{lose}");
}

/// A fault of a test's own: every spawn is refused.
#[derive(Debug)]
struct NoSpawns;

#[async_trait::async_trait]
impl Fault for NoSpawns {
    async fn spawn(
        &self,
        _inner: &dyn ActorRuntime,
        spec: ActorSpec,
    ) -> Result<ActorId, RuntimeError> {
        Err(RuntimeError::SpawnFailed {
            name: spec.name,
            reason: "no spawns today".to_owned(),
        })
    }
}

/// A fault that changes nothing.
#[derive(Debug)]
struct Harmless;

impl Fault for Harmless {}

#[tokio::test]
async fn a_fault_of_ones_own_changes_its_hooks_and_passes_the_rest_through() {
    let sim = two_nodes();
    let runtime: Arc<dyn ActorRuntime> = Arc::new(Faulty::wrap(Arc::new(sim.clone()), NoSpawns));
    let err = runtime.spawn(spec("w0", "1")).await.unwrap_err();
    assert!(matches!(err, RuntimeError::SpawnFailed { .. }), "{err}");
    let f = PlacementGroupFactory {
        bundles: vec!["CPU=1".parse().expect("valid")],
        strategy: PlacementStrategy::Pack,
    };
    let pg = runtime.create_placement_group(&f).await.expect("feasible");
    runtime
        .wait_placement_group_ready(pg, Duration::from_secs(1))
        .await
        .expect("ready");
    assert_eq!(
        runtime.cluster().await.expect("cluster").available(),
        "CPU=3".parse().expect("valid")
    );
    runtime.remove_placement_group(pg).await.expect("removed");
    assert_eq!(sim.placement_group_count(), 0);

    let runtime: Arc<dyn ActorRuntime> = Arc::new(Faulty::wrap(Arc::new(sim.clone()), Harmless));
    let actor = runtime.spawn(spec("w0", "1")).await.expect("spawn");
    runtime.node_info(actor).await.expect("call");
    runtime.kill(actor, Duration::ZERO).await.expect("kill");
    assert!(sim.live_actors().is_empty());
}
