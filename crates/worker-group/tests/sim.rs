//! Behaviour on a simulated cluster: Ray Train's `test_worker_group.py`, ported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use trainyard_resources::{ResourceAmount, Resources};
use trainyard_runtime::sim::faults::{FailSpawn, KillActorAfterCalls};
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{
    ActorRuntime, NodeId, PlacementGroupFactory, PlacementGroupId, PlacementStrategy, Request,
    Response,
};
use trainyard_worker_group::{WorkerGroup, WorkerGroupError};

/// A bound for every wait; with paused time it costs nothing.
const BOUND: Duration = Duration::from_secs(60);

fn res(text: &str) -> Resources {
    text.parse().expect("valid resources")
}

/// Reserves `bundles` (PACK) and waits until the group is ready.
async fn reserve(runtime: &dyn ActorRuntime, bundles: &[Resources]) -> PlacementGroupId {
    let factory = PlacementGroupFactory {
        bundles: bundles.to_vec(),
        strategy: PlacementStrategy::Pack,
    };
    let pg = runtime
        .create_placement_group(&factory)
        .await
        .expect("feasible placement group");
    runtime
        .wait_placement_group_ready(pg, BOUND)
        .await
        .expect("placement group is ready");
    pg
}

/// A started group with one worker per dictionary, in its own placement group.
async fn start_group(runtime: Arc<dyn ActorRuntime>, per_worker: &[Resources]) -> WorkerGroup {
    let pg = reserve(runtime.as_ref(), per_worker).await;
    let mut group = WorkerGroup::new(runtime, pg, per_worker.to_vec()).expect("valid group");
    tokio::time::timeout(BOUND, group.start())
        .await
        .expect("start returns")
        .expect("started");
    group
}

async fn available(sim: &SimRuntime, resource: &str) -> ResourceAmount {
    sim.cluster()
        .await
        .expect("snapshot")
        .available()
        .amount(resource)
}

fn two_cpus() -> SimRuntime {
    SimRuntime::new([SimNode::new("node-0").cpus(2)])
}

fn ids(group: &WorkerGroup, worker: usize, resource: &str) -> Vec<String> {
    group.workers()[worker]
        .metadata
        .accelerator_ids
        .get(resource)
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn worker_creation_consumes_the_cpus() {
    let sim = two_cpus();
    let group = start_group(Arc::new(sim.clone()), &[res("CPU=1"), res("CPU=1")]).await;

    assert_eq!(group.len(), 2);
    assert_eq!(sim.live_actors().len(), 2);
    assert!(available(&sim, "CPU").await.is_zero());
    for worker in group.workers() {
        assert_eq!(sim.assigned_resources(worker.actor), Some(res("CPU=1")));
    }
}

#[tokio::test(start_paused = true)]
async fn one_worker_with_two_cpus_uses_both() {
    let sim = two_cpus();
    let group = start_group(Arc::new(sim.clone()), &[res("CPU=2")]).await;

    assert_eq!(group.len(), 1);
    assert!(available(&sim, "CPU").await.is_zero());
    assert_eq!(
        sim.assigned_resources(group.workers()[0].actor),
        Some(res("CPU=2"))
    );
}

#[tokio::test(start_paused = true)]
async fn memory_workers_land_on_the_node_with_memory_and_hold_only_memory() {
    let mut nodes: Vec<SimNode> = (0..4)
        .map(|i| SimNode::new(&format!("node-{i}")).cpus(4).memory(500))
        .collect();
    nodes.push(SimNode::new("node-big").cpus(4).memory(2_000));
    let sim = SimRuntime::new(nodes);
    let memory = res(r#"{"memory": 1000}"#);
    let group = start_group(Arc::new(sim.clone()), &[memory.clone(), memory.clone()]).await;

    for worker in group.workers() {
        assert_eq!(worker.metadata.node_id, NodeId::from("node-big"));
        assert_eq!(sim.actor_node(worker.actor), Some(NodeId::from("node-big")));
        assert_eq!(sim.assigned_resources(worker.actor), Some(memory.clone()));
        assert!(worker.options.num_cpus.is_zero());
        assert_eq!(worker.options.memory, 1_000);
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_returns_the_resources_and_execute_errors_afterwards() {
    let sim = two_cpus();
    let runtime: Arc<dyn ActorRuntime> = Arc::new(sim.clone());
    let mut group = start_group(Arc::clone(&runtime), &[res("CPU=1"), res("CPU=1")]).await;
    assert_eq!(sim.live_actors().len(), 2);

    tokio::time::timeout(BOUND, group.shutdown(Duration::from_secs(5)))
        .await
        .expect("shutdown returns");

    assert!(sim.live_actors().is_empty());
    assert!(group.is_empty());
    let error = group
        .execute(Request::NodeInfo)
        .await
        .expect_err("group is shut down");
    assert!(matches!(error, WorkerGroupError::NotActive), "{error:?}");
    // The bundles are whole again: a new group fits into the same placement group.
    let mut again = WorkerGroup::new(
        Arc::clone(&runtime),
        group.placement_group(),
        vec![res("CPU=1"); 2],
    )
    .expect("valid group");
    again.start().await.expect("the bundles have room again");
    again.shutdown(Duration::ZERO).await;
    // The placement group is its owner's: still there until removed.
    assert_eq!(sim.placement_group_count(), 1);
    runtime
        .remove_placement_group(group.placement_group())
        .await
        .expect("removed");
    assert_eq!(available(&sim, "CPU").await, ResourceAmount::from(2u32));
}

#[tokio::test(start_paused = true)]
async fn starting_twice_errors_and_a_shut_down_group_starts_again() {
    let sim = two_cpus();
    let mut group = start_group(Arc::new(sim.clone()), &[res("CPU=1"), res("CPU=1")]).await;
    let first: Vec<_> = group.workers().iter().map(|w| w.actor).collect();

    let error = group.start().await.expect_err("already started");
    assert!(
        matches!(error, WorkerGroupError::AlreadyStarted),
        "{error:?}"
    );
    assert_eq!(sim.live_actors(), first);

    group.shutdown(Duration::ZERO).await;
    assert!(sim.live_actors().is_empty());
    tokio::time::timeout(BOUND, group.start())
        .await
        .expect("start returns")
        .expect("restarts");

    assert_eq!(group.len(), 2);
    let second: BTreeSet<_> = group.workers().iter().map(|w| w.actor).collect();
    assert!(
        second.iter().all(|actor| !first.contains(actor)),
        "new actors"
    );
    assert_eq!(
        sim.live_actors().into_iter().collect::<BTreeSet<_>>(),
        second
    );
}

#[tokio::test(start_paused = true)]
async fn gpu_workers_see_their_own_gpu_ids_and_no_neuron_cores() {
    let sim = SimRuntime::new([SimNode::new("node-0").cpus(2).gpus(2)]);
    let group = start_group(Arc::new(sim.clone()), &[res("GPU=1"), res("GPU=1")]).await;

    assert!(available(&sim, "GPU").await.is_zero());
    let mut seen = BTreeSet::new();
    for worker in 0..2 {
        let gpus = ids(&group, worker, "GPU");
        assert_eq!(gpus.len(), 1);
        assert!(gpus.iter().all(|id| id == "0" || id == "1"), "{gpus:?}");
        seen.extend(gpus);
        let neuron = group.workers()[worker]
            .metadata
            .accelerator_ids
            .get("neuron_cores");
        assert_eq!(neuron, Some(&Vec::new()));
    }
    assert_eq!(seen.len(), 2, "each worker holds a GPU of its own");
}

#[tokio::test(start_paused = true)]
async fn neuron_core_workers_see_their_own_core_ids_and_no_gpus() {
    let sim = SimRuntime::new([SimNode::new("node-0")
        .cpus(2)
        .accelerators("neuron_cores", 2)]);
    let per_worker = res("neuron_cores=1");
    let group = start_group(Arc::new(sim.clone()), &[per_worker.clone(), per_worker]).await;

    assert!(available(&sim, "neuron_cores").await.is_zero());
    let mut seen = BTreeSet::new();
    for worker in 0..2 {
        let cores = ids(&group, worker, "neuron_cores");
        assert_eq!(cores.len(), 1);
        assert!(cores.iter().all(|id| id == "0" || id == "1"), "{cores:?}");
        seen.extend(cores);
        assert_eq!(
            group.workers()[worker].metadata.accelerator_ids.get("GPU"),
            Some(&Vec::new())
        );
        assert!(
            group.workers()[worker]
                .options
                .resources
                .contains("neuron_cores")
        );
    }
    assert_eq!(seen.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn execute_and_execute_async_answer_in_worker_order() {
    let sim = SimRuntime::new([
        SimNode::new("node-0").cpus(2),
        SimNode::new("node-1").cpus(2),
    ]);
    let group = start_group(Arc::new(sim), &vec![res("CPU=1"); 4]).await;
    let expected: Vec<Response> = group
        .workers()
        .iter()
        .map(|w| Response::NodeInfo(w.metadata.clone()))
        .collect();
    let pids: BTreeSet<u32> = group.workers().iter().map(|w| w.metadata.pid).collect();
    assert_eq!(pids.len(), 4, "every worker is its own process");

    let answers = group
        .execute(Request::NodeInfo)
        .await
        .expect("every worker answers");
    assert_eq!(answers, expected);

    let pending = group
        .execute_async(Request::NodeInfo)
        .expect("group is active");
    assert_eq!(pending.len(), 4);
    let answers = futures::future::try_join_all(pending)
        .await
        .expect("every worker answers");
    assert_eq!(answers, expected);

    let single = group
        .execute_single(2, Request::NodeInfo)
        .await
        .expect("worker 2 answers");
    assert_eq!(single, expected[2]);
}

#[tokio::test(start_paused = true)]
async fn execute_single_changes_only_that_workers_env() {
    let sim = two_cpus();
    let shared = BTreeMap::from([("RUN_ID".to_owned(), "7".to_owned())]);
    let runtime: Arc<dyn ActorRuntime> = Arc::new(sim.clone());
    let pg = reserve(runtime.as_ref(), &[res("CPU=1"), res("CPU=1")]).await;
    let mut group = WorkerGroup::new(runtime, pg, vec![res("CPU=1"); 2])
        .expect("valid group")
        .with_env(shared);
    group.start().await.expect("started");

    let vars = BTreeMap::from([("TEST".to_owned(), "1".to_owned())]);
    let answer = group
        .execute_single(1, Request::SetEnv { vars })
        .await
        .expect("set on worker 1");
    assert_eq!(answer, Response::Done);

    let seen: Vec<String> = group
        .workers()
        .iter()
        .map(|w| {
            let env = sim.actor_env(w.actor).expect("live actor");
            assert_eq!(env.get("RUN_ID").map(String::as_str), Some("7"));
            env.get("TEST").cloned().unwrap_or_else(|| "0".to_owned())
        })
        .collect();
    assert_eq!(seen, ["0", "1"]);
}

#[tokio::test(start_paused = true)]
async fn sorting_groups_workers_by_node_with_the_first_node_first() {
    // SPREAD over three nodes: bundles 0, 1, 2 on node-a, node-b, node-c, and so on.
    let sim = SimRuntime::new([
        SimNode::new("node-a").cpus(2),
        SimNode::new("node-b").cpus(2),
        SimNode::new("node-c").cpus(2),
    ]);
    let runtime: Arc<dyn ActorRuntime> = Arc::new(sim);
    let factory = PlacementGroupFactory {
        bundles: vec![res("CPU=1"); 6],
        strategy: PlacementStrategy::Spread,
    };
    let pg = runtime
        .create_placement_group(&factory)
        .await
        .expect("feasible");
    runtime
        .wait_placement_group_ready(pg, BOUND)
        .await
        .expect("ready");
    let mut group = WorkerGroup::new(runtime, pg, factory.bundles).expect("valid group");
    group.start().await.expect("started");
    let nodes = |group: &WorkerGroup| -> Vec<String> {
        group
            .workers()
            .iter()
            .map(|w| w.metadata.node_id.0.clone())
            .collect()
    };
    let before = nodes(&group);
    let first_seen: Vec<String> = before.iter().fold(Vec::new(), |mut seen, node| {
        if !seen.contains(node) {
            seen.push(node.clone());
        }
        seen
    });
    assert_eq!(first_seen.len(), 3, "spread over three nodes: {before:?}");

    group.sort_workers_by_node_and_gpu(Some(&NodeId::from(first_seen[2].as_str())));
    let after = nodes(&group);
    let expected: Vec<String> = [&first_seen[2], &first_seen[0], &first_seen[1]]
        .into_iter()
        .flat_map(|node| std::iter::repeat_n(node.clone(), 2))
        .collect();
    assert_eq!(after, expected);

    // Answers follow the new order.
    let answers = group
        .execute(Request::NodeInfo)
        .await
        .expect("every worker answers");
    let answered: Vec<String> = answers
        .into_iter()
        .map(|a| match a {
            Response::NodeInfo(info) => info.node_id.0,
            other => panic!("unexpected answer {other:?}"),
        })
        .collect();
    assert_eq!(answered, expected);
}

#[tokio::test(start_paused = true)]
async fn a_removed_worker_can_be_replaced_in_its_bundle_without_hanging() {
    let sim = two_cpus();
    let mut group = start_group(Arc::new(sim.clone()), &[res("CPU=1"), res("CPU=1")]).await;
    let removed = group.workers()[0].actor;
    let kept = group.workers()[1].actor;

    group.remove_workers(&[0]).await.expect("valid index");
    assert_eq!(group.len(), 1);
    assert_eq!(sim.live_actors(), [kept]);

    tokio::time::timeout(BOUND, group.add_workers(vec![res("CPU=1")]))
        .await
        .expect("add_workers does not hang")
        .expect("bundle 0 is free again");
    assert_eq!(group.len(), 2);
    let added = &group.workers()[1];
    assert_eq!(added.bundle_index, 0);
    assert_ne!(added.actor, removed);
    assert_eq!(sim.live_actors().len(), 2);

    let error = group
        .add_workers(vec![res("CPU=1")])
        .await
        .expect_err("no bundle is free");
    assert!(
        matches!(
            error,
            WorkerGroupError::NoFreeBundle {
                bundles: 2,
                free: 0,
                requested: 1
            }
        ),
        "{error:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn asking_for_more_workers_than_free_bundles_says_how_many_are_free_and_adds_none() {
    let sim = SimRuntime::new([SimNode::new("node-0").cpus(3)]);
    let mut group = start_group(Arc::new(sim.clone()), &vec![res("CPU=1"); 3]).await;
    group.remove_workers(&[1]).await.expect("valid index");

    let error = tokio::time::timeout(BOUND, group.add_workers(vec![res("CPU=1"); 2]))
        .await
        .expect("add_workers returns")
        .expect_err("one bundle is free, two workers are asked for");
    assert!(
        matches!(
            error,
            WorkerGroupError::NoFreeBundle {
                bundles: 3,
                free: 1,
                requested: 2
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "cannot add workers: 2 asked for, but only 1 of the placement group's 3 bundles are free"
    );
    assert_eq!(group.len(), 2, "no worker was added");
    assert_eq!(sim.live_actors().len(), 2, "no actor was spawned");
}

#[tokio::test(start_paused = true)]
async fn a_failed_spawn_leaks_no_actor_and_keeps_the_placement_group() {
    let sim = SimRuntime::new([SimNode::new("node-0").cpus(4)]);
    let runtime: Arc<dyn ActorRuntime> = Arc::new(FailSpawn::new(Arc::new(sim.clone()), 2));
    let pg = reserve(runtime.as_ref(), &vec![res("CPU=1"); 4]).await;
    let mut group =
        WorkerGroup::new(Arc::clone(&runtime), pg, vec![res("CPU=1"); 4]).expect("valid group");

    let error = group.start().await.expect_err("the third spawn fails");
    assert!(
        matches!(error, WorkerGroupError::Start { worker: 2, .. }),
        "{error:?}"
    );
    assert!(sim.live_actors().is_empty(), "survivors were killed");
    assert_eq!(
        sim.placement_group_count(),
        1,
        "the owner removes the placement group"
    );

    // Nothing is held: the group starts on a second try.
    group.start().await.expect("starts on a second try");
    assert_eq!(sim.live_actors().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_dies_fails_execute_with_its_index_and_shutdown_still_ends() {
    let sim = SimRuntime::new([SimNode::new("node-0").cpus(4)]);
    // The second actor dies after its metadata call.
    let runtime: Arc<dyn ActorRuntime> =
        Arc::new(KillActorAfterCalls::new(Arc::new(sim.clone()), 1, 1));
    let mut group = start_group(runtime, &vec![res("CPU=1"); 3]).await;

    let error = group
        .execute(Request::NodeInfo)
        .await
        .expect_err("worker 1 died");
    assert!(
        matches!(error, WorkerGroupError::Worker { worker: 1, .. }),
        "{error:?}"
    );
    assert!(error.is_actor_death());

    tokio::time::timeout(BOUND, group.shutdown(Duration::from_secs(30)))
        .await
        .expect("shutdown does not wait on the dead worker");
    assert!(sim.live_actors().is_empty());
}

#[tokio::test(start_paused = true)]
async fn losing_a_node_does_not_hang_shutdown() {
    let sim = SimRuntime::new([
        SimNode::new("node-0").cpus(2),
        SimNode::new("node-1").cpus(2),
    ]);
    let runtime: Arc<dyn ActorRuntime> = Arc::new(sim.clone());
    let factory = PlacementGroupFactory {
        bundles: vec![res("CPU=1"); 2],
        strategy: PlacementStrategy::StrictSpread,
    };
    let pg = runtime
        .create_placement_group(&factory)
        .await
        .expect("feasible");
    runtime
        .wait_placement_group_ready(pg, BOUND)
        .await
        .expect("ready");
    let mut group = WorkerGroup::new(runtime, pg, factory.bundles).expect("valid group");
    group.start().await.expect("started");
    let lost = group.workers()[1].metadata.node_id.clone();

    sim.lose_node(&lost);
    let error = group
        .execute_single(1, Request::NodeInfo)
        .await
        .expect_err("its node is gone");
    assert!(error.is_actor_death(), "{error:?}");

    tokio::time::timeout(BOUND, group.shutdown(Duration::from_secs(30)))
        .await
        .expect("shutdown does not hang");
    assert!(sim.live_actors().is_empty());
}
