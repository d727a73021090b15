//! Behaviour of the simulated cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime::placement::PlacementError;
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{
    ACCELERATOR_RESOURCES, ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, DeathCause,
    FunctionRegistry, NodeId, PlacementGroupId, Request, RuntimeError, Stream, TaskEvent, TaskExit,
    TaskFailure, TaskRejection, TaskSpec, TaskStatus,
};

const WAIT: Duration = Duration::from_secs(5);

fn res(text: &str) -> Resources {
    text.parse().expect("valid resources")
}

fn factory(bundles: &[&str], strategy: PlacementStrategy) -> PlacementGroupFactory {
    PlacementGroupFactory {
        bundles: bundles.iter().map(|b| res(b)).collect(),
        strategy,
    }
}

fn spec(name: &str, demand: &str, placement: Option<(PlacementGroupId, usize)>) -> ActorSpec {
    ActorSpec {
        name: name.to_owned(),
        options: ActorOptions::try_from(&res(demand)).expect("valid options"),
        placement,
        env: BTreeMap::new(),
    }
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn function(name: &str, arg: Value) -> TaskSpec {
    TaskSpec::Function {
        name: name.to_owned(),
        arg,
        env: BTreeMap::new(),
    }
}

async fn ready_group(
    sim: &SimRuntime,
    f: &PlacementGroupFactory,
) -> (PlacementGroupId, Vec<NodeId>) {
    let pg = sim.create_placement_group(f).await.expect("feasible");
    let info = sim
        .wait_placement_group_ready(pg, WAIT)
        .await
        .expect("ready");
    (pg, info.bundle_nodes)
}

/// Polls until the task has finished (bounded by the paused or real clock).
async fn finish(sim: &SimRuntime, actor: ActorId) -> (Vec<TaskEvent>, TaskStatus) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut events = Vec::new();
    loop {
        let poll = sim.poll(actor).await.expect("poll");
        events.extend(poll.events);
        if poll.status.is_finished() {
            return (events, poll.status);
        }
        assert!(Instant::now() < deadline, "the task did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn assert_all_free(sim: &SimRuntime) {
    let cluster = sim.cluster().await.expect("cluster");
    assert_eq!(
        cluster.available(),
        cluster.total(),
        "resources were not all returned"
    );
}

/// Ray's five-node memory fixture: four nodes with 500 bytes of memory, one with 2 000.
fn memory_cluster() -> SimRuntime {
    SimRuntime::new([
        SimNode::new("small-0").cpus(4).memory(500),
        SimNode::new("small-1").cpus(4).memory(500),
        SimNode::new("big").cpus(4).memory(2_000),
        SimNode::new("small-2").cpus(4).memory(500),
        SimNode::new("small-3").cpus(4).memory(500),
    ])
}

#[tokio::test]
async fn two_memory_workers_land_on_the_only_node_with_enough_memory_and_hold_exactly_it() {
    let sim = memory_cluster();
    let f = factory(&[r#"{"memory": 1000}"#; 2], PlacementStrategy::Pack);
    let (pg, nodes) = ready_group(&sim, &f).await;
    assert_eq!(nodes, [NodeId::from("big"), NodeId::from("big")]);
    for index in 0..2 {
        let actor = sim
            .spawn(spec("w", r#"{"memory": 1000}"#, Some((pg, index))))
            .await
            .expect("spawn");
        assert_eq!(sim.actor_node(actor), Some(NodeId::from("big")));
        assert_eq!(
            sim.assigned_resources(actor),
            Some(res("memory=1000")),
            "no CPU, only memory"
        );
        assert_eq!(
            sim.node_info(actor).await.expect("info").node_id,
            NodeId::from("big")
        );
    }
    let big = sim.cluster().await.expect("cluster");
    assert_eq!(
        big.node(&"big".into()).expect("node").available,
        res("CPU=4,memory=0")
    );
}

#[tokio::test]
async fn an_unpinned_memory_actor_goes_to_the_first_node_with_room() {
    let sim = memory_cluster();
    let actor = sim
        .spawn(spec("w", "memory=1000", None))
        .await
        .expect("spawn");
    assert_eq!(sim.actor_node(actor), Some(NodeId::from("big")));
    let second = sim
        .spawn(spec("w", "memory=1000", None))
        .await
        .expect("spawn");
    assert_eq!(sim.actor_node(second), Some(NodeId::from("big")));
    let third = sim.spawn(spec("w", "memory=1000", None)).await.unwrap_err();
    assert!(matches!(third, RuntimeError::SpawnFailed { .. }), "{third}");
    sim.kill(actor, Duration::ZERO).await.expect("kill");
    sim.kill(second, Duration::ZERO).await.expect("kill");
    assert_all_free(&sim).await;
}

#[tokio::test]
async fn a_group_that_can_never_fit_fails_at_once_with_an_explanation() {
    let sim = memory_cluster();
    let err = sim
        .create_placement_group(&factory(&["CPU=1", "memory=3000"], PlacementStrategy::Pack))
        .await
        .unwrap_err();
    let RuntimeError::Infeasible(why) = &err else {
        panic!("expected Infeasible, got {err}")
    };
    assert_eq!(
        why.to_string(),
        "bundle 1 needs memory=3KB but the most memory any node has is 2KB"
    );
    assert!(matches!(
        why,
        PlacementError::BundleTooLarge { bundle: 1, .. }
    ));
    assert_eq!(sim.placement_group_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn waiting_for_a_group_that_cannot_fit_now_times_out_after_exactly_the_timeout() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(2)]);
    let (_held, _) = ready_group(&sim, &factory(&["CPU=2"], PlacementStrategy::Pack)).await;
    let queued = sim
        .create_placement_group(&factory(&["CPU=1"], PlacementStrategy::Pack))
        .await
        .expect("feasible");
    let started = Instant::now();
    let err = sim
        .wait_placement_group_ready(queued, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert!(
        matches!(err, RuntimeError::PlacementTimeout { pg, waited } if pg == queued && waited == Duration::from_secs(30)),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_group_becomes_ready_when_another_is_removed_in_creation_order() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(2), SimNode::new("b").cpus(2)]);
    let (first, _) = ready_group(
        &sim,
        &factory(&["CPU=2", "CPU=2"], PlacementStrategy::Spread),
    )
    .await;
    let second = sim
        .create_placement_group(&factory(&["CPU=2"], PlacementStrategy::Pack))
        .await
        .expect("feasible");
    let third = sim
        .create_placement_group(&factory(&["CPU=2", "CPU=2"], PlacementStrategy::Pack))
        .await
        .expect("feasible");

    let waiter = {
        let sim = sim.clone();
        tokio::spawn(async move {
            sim.wait_placement_group_ready(second, Duration::from_secs(60))
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !waiter.is_finished(),
        "the second group cannot be ready while the first holds everything"
    );
    sim.remove_placement_group(first).await.expect("remove");
    let placed = waiter
        .await
        .expect("join")
        .expect("the second group is ready");
    assert_eq!(placed.bundle_nodes, [NodeId::from("a")]);
    // The third needs both nodes; only one is free.
    let err = sim
        .wait_placement_group_ready(third, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::PlacementTimeout { .. }));
    sim.remove_placement_group(second).await.expect("remove");
    sim.wait_placement_group_ready(third, Duration::ZERO)
        .await
        .expect("the third is ready");
}

#[tokio::test]
async fn reserving_takes_the_whole_group_and_removing_returns_it_and_kills_the_actors() {
    let sim = SimRuntime::new([
        SimNode::new("a").cpus(4).gpus(2),
        SimNode::new("b").cpus(4).gpus(2),
    ]);
    let f = factory(&["CPU=1,GPU=1"; 3], PlacementStrategy::Pack);
    let (pg, nodes) = ready_group(&sim, &f).await;
    assert_eq!(
        nodes,
        [NodeId::from("a"), NodeId::from("a"), NodeId::from("b")]
    );
    let cluster = sim.cluster().await.expect("cluster");
    assert_eq!(cluster.available(), res("CPU=5,GPU=1"));
    let actor = sim
        .spawn(spec("w", "CPU=1,GPU=1", Some((pg, 2))))
        .await
        .expect("spawn");
    // An actor inside a bundle uses the bundle's reservation, not the node's.
    assert_eq!(
        sim.cluster().await.expect("cluster").available(),
        res("CPU=5,GPU=1")
    );

    sim.remove_placement_group(pg).await.expect("remove");
    assert_eq!(sim.placement_group_count(), 0);
    assert!(sim.live_actors().is_empty());
    let err = sim.node_info(actor).await.unwrap_err();
    assert!(matches!(err, RuntimeError::ActorDied { .. }), "{err}");
    assert_all_free(&sim).await;
    sim.remove_placement_group(pg)
        .await
        .expect("removing twice is harmless");
    let never = PlacementGroupId(99);
    assert!(matches!(
        sim.remove_placement_group(never).await,
        Err(RuntimeError::UnknownPlacementGroup(_))
    ));
}

#[tokio::test]
async fn a_pinned_spawn_needs_a_ready_group_an_existing_bundle_and_room_in_it() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(2)]);
    let (pg, _) = ready_group(&sim, &factory(&["CPU=2"], PlacementStrategy::Pack)).await;
    let err = sim
        .spawn(spec("w", "CPU=1", Some((PlacementGroupId(7), 0))))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::UnknownPlacementGroup(PlacementGroupId(7))
        ),
        "{err}"
    );
    let err = sim
        .spawn(spec("w", "CPU=1", Some((pg, 1))))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::NoSuchBundle {
                index: 1,
                bundles: 1,
                ..
            }
        ),
        "{err}"
    );
    let err = sim
        .spawn(spec("w-3", "CPU=3", Some((pg, 0))))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "actor `w-3` needs CPU=3 but bundle 0 of pg-0 has 2 left"
    );

    let queued = sim
        .create_placement_group(&factory(&["CPU=1"], PlacementStrategy::Pack))
        .await
        .expect("feasible");
    let err = sim
        .spawn(spec("w", "CPU=1", Some((queued, 0))))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RuntimeError::PlacementGroupNotReady(p) if p == queued),
        "{err}"
    );

    // Two 1-CPU actors share the 2-CPU bundle; a third does not fit until one is killed.
    let one = sim
        .spawn(spec("w", "CPU=1", Some((pg, 0))))
        .await
        .expect("spawn");
    let _two = sim
        .spawn(spec("w", "CPU=1", Some((pg, 0))))
        .await
        .expect("spawn");
    assert!(matches!(
        sim.spawn(spec("w", "CPU=1", Some((pg, 0)))).await,
        Err(RuntimeError::BundleTooSmall { .. })
    ));
    sim.kill(one, Duration::ZERO).await.expect("kill");
    sim.spawn(spec("w", "CPU=1", Some((pg, 0))))
        .await
        .expect("the freed CPU is reused");
}

#[tokio::test]
async fn node_info_reports_the_node_a_fake_pid_and_every_accelerator_name() {
    let sim = SimRuntime::new([
        SimNode::new("node-a")
            .ip("10.0.0.1")
            .hostname("host-a")
            .cpus(4)
            .gpus(2),
        SimNode::new("node-b")
            .ip("10.0.0.1")
            .cpus(4)
            .accelerators("neuron_cores", 2),
    ]);
    let gpu = sim
        .spawn(spec("gpu", "CPU=1,GPU=1", None))
        .await
        .expect("spawn");
    let neuron = sim
        .spawn(spec("neuron", "neuron_cores=1", None))
        .await
        .expect("spawn");
    let info = sim.node_info(gpu).await.expect("info");
    assert_eq!(info.node_id, NodeId::from("node-a"));
    assert_eq!(
        (info.node_ip.as_str(), info.hostname.as_str()),
        ("10.0.0.1", "host-a")
    );
    assert_eq!(info.pid, 10_000 + u32::try_from(gpu.0).expect("small id"));
    assert_eq!(
        info.accelerator_ids
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        {
            let mut names = ACCELERATOR_RESOURCES.to_vec();
            names.sort_unstable();
            names
        }
    );
    assert_eq!(info.accelerator_ids["GPU"], ["0"]);
    assert!(info.accelerator_ids["neuron_cores"].is_empty());

    let info = sim.node_info(neuron).await.expect("info");
    assert_eq!(
        (info.node_id.as_str(), info.hostname.as_str()),
        ("node-b", "node-b")
    );
    assert_eq!(info.accelerator_ids["neuron_cores"], ["0"]);
    assert!(info.accelerator_ids["GPU"].is_empty());
}

#[tokio::test]
async fn half_gpu_bundles_on_one_node_share_device_zero() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(4).gpus(2)]);
    let (pg, _) = ready_group(&sim, &factory(&["GPU=0.5"; 3], PlacementStrategy::Pack)).await;
    let mut ids = Vec::new();
    for index in 0..3 {
        let actor = sim
            .spawn(spec("w", "GPU=0.5", Some((pg, index))))
            .await
            .expect("spawn");
        ids.push(sim.node_info(actor).await.expect("info").accelerator_ids["GPU"].clone());
    }
    assert_eq!(ids, [["0"], ["0"], ["1"]]);
}

#[tokio::test]
async fn free_ports_are_distinct_per_node_and_start_at_29500() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(2), SimNode::new("b").cpus(2)]);
    let a1 = sim.spawn(spec("w", "CPU=1", None)).await.expect("spawn");
    let a2 = sim.spawn(spec("w", "CPU=1", None)).await.expect("spawn");
    let b = sim.spawn(spec("w", "CPU=2", None)).await.expect("spawn");
    assert_eq!(sim.find_free_port(a1).await.expect("port"), 29_500);
    assert_eq!(sim.find_free_port(a2).await.expect("port"), 29_501);
    assert_eq!(sim.find_free_port(a1).await.expect("port"), 29_502);
    assert_eq!(sim.find_free_port(b).await.expect("port"), 29_500);
}

#[tokio::test]
async fn spawn_env_set_env_and_task_env_reach_the_task_later_ones_winning() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]);
    let mut s = spec("w", "CPU=1", None);
    s.env = env(&[("A", "spawn"), ("B", "spawn")]);
    let actor = sim.spawn(s).await.expect("spawn");
    sim.set_env(actor, env(&[("B", "set"), ("C", "set")]))
        .await
        .expect("set_env");
    assert_eq!(
        sim.actor_env(actor),
        Some(env(&[("A", "spawn"), ("B", "set"), ("C", "set")]))
    );
    let task = TaskSpec::Function {
        name: "trainyard.env".into(),
        arg: Value::Null,
        env: env(&[("C", "task")]),
    };
    sim.run_task(actor, task).await.expect("run");
    let (_, status) = finish(&sim, actor).await;
    assert_eq!(
        status,
        TaskStatus::Exited {
            exit: TaskExit::Succeeded {
                value: json!({"A": "spawn", "B": "set", "C": "task"})
            }
        }
    );
}

#[tokio::test]
async fn reports_and_log_lines_are_drained_in_order_by_poll() {
    let functions = FunctionRegistry::new().register("chatty", |ctx| async move {
        ctx.log(Stream::Stdout, "hello");
        ctx.report(
            json!({"loss": 0.5})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        ctx.log(Stream::Stderr, "bye");
        Ok(json!(7))
    });
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]).with_functions(functions);
    let actor = sim.spawn(spec("w", "CPU=1", None)).await.expect("spawn");
    assert_eq!(
        sim.poll(actor).await.expect("poll").status,
        TaskStatus::Idle
    );
    sim.run_task(actor, function("chatty", Value::Null))
        .await
        .expect("run");
    let (events, status) = finish(&sim, actor).await;
    assert_eq!(
        status,
        TaskStatus::Exited {
            exit: TaskExit::Succeeded { value: json!(7) }
        }
    );
    assert_eq!(
        events,
        [
            TaskEvent::Log {
                stream: Stream::Stdout,
                line: "hello".into()
            },
            TaskEvent::Report {
                metrics: json!({"loss": 0.5})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                checkpoint: None,
            },
            TaskEvent::Log {
                stream: Stream::Stderr,
                line: "bye".into()
            },
        ]
    );
    assert!(
        sim.poll(actor).await.expect("poll").events.is_empty(),
        "events are drained once"
    );
    // A finished task makes room for the next one; the builtins are still there.
    sim.run_task(actor, function("trainyard.echo", json!([1, 2])))
        .await
        .expect("run");
    assert_eq!(
        finish(&sim, actor).await.1,
        TaskStatus::Exited {
            exit: TaskExit::Succeeded {
                value: json!([1, 2])
            }
        }
    );
}

#[tokio::test]
async fn failing_and_panicking_functions_end_as_failed_tasks_and_unknown_ones_are_rejected() {
    let functions = FunctionRegistry::new().register("boom", |_| async { panic!("kaboom") });
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]).with_functions(functions);
    let actor = sim.spawn(spec("w", "", None)).await.expect("spawn");

    sim.run_task(actor, function("trainyard.fail", json!("bad input")))
        .await
        .expect("run");
    assert_eq!(
        finish(&sim, actor).await.1,
        TaskStatus::Exited {
            exit: TaskExit::Failed {
                failure: TaskFailure::Error {
                    message: "bad input".into()
                }
            }
        }
    );

    sim.run_task(actor, function("boom", Value::Null))
        .await
        .expect("run");
    let TaskStatus::Exited {
        exit: TaskExit::Failed {
            failure: TaskFailure::Error { message },
        },
    } = finish(&sim, actor).await.1
    else {
        panic!("expected a failure")
    };
    assert!(message.contains("kaboom"), "{message}");

    let err = sim
        .run_task(actor, function("nope", Value::Null))
        .await
        .unwrap_err();
    let RuntimeError::TaskRejected {
        rejection: TaskRejection::UnknownFunction { name, registered },
        ..
    } = &err
    else {
        panic!("expected a rejection, got {err}")
    };
    assert_eq!(name, "nope");
    assert!(
        registered.iter().any(|n| n == "boom") && registered.iter().any(|n| n == "trainyard.env"),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_task_while_one_runs_is_refused_and_commands_are_unsupported() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]);
    let actor = sim.spawn(spec("w", "CPU=1", None)).await.expect("spawn");
    sim.run_task(actor, function("trainyard.sleep", json!(5)))
        .await
        .expect("run");
    let err = sim
        .run_task(actor, function("trainyard.echo", Value::Null))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RuntimeError::TaskRejected { actor: a, rejection: TaskRejection::AlreadyRunning } if a == actor),
        "{err}"
    );
    assert_eq!(
        sim.poll(actor).await.expect("poll").status,
        TaskStatus::Running
    );
    let started = Instant::now();
    assert_eq!(
        finish(&sim, actor).await.1,
        TaskStatus::Exited {
            exit: TaskExit::Succeeded { value: Value::Null }
        }
    );
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "slept {:?}",
        started.elapsed()
    );

    let command = TaskSpec::Command {
        program: "true".into(),
        args: vec![],
        env: BTreeMap::new(),
    };
    let err = sim.run_task(actor, command).await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::TaskRejected {
                rejection: TaskRejection::Unsupported { .. },
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn stop_ends_the_running_task_and_the_actor_and_frees_its_resources() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]);
    let actor = sim.spawn(spec("w", "CPU=1", None)).await.expect("spawn");
    sim.run_task(actor, function("trainyard.sleep", json!(1_000)))
        .await
        .expect("run");
    sim.stop(actor).await.expect("stop");
    assert!(sim.live_actors().is_empty());
    assert_all_free(&sim).await;
    let err = sim.poll(actor).await.unwrap_err();
    assert!(matches!(err, RuntimeError::ActorDied { .. }), "{err}");
    assert!(err.is_actor_death());
    sim.kill(actor, Duration::ZERO)
        .await
        .expect("killing a dead actor is fine");
    sim.kill(ActorId(1_000), Duration::ZERO)
        .await
        .expect("killing an unknown actor is fine");
    let err = sim
        .call(ActorId(1_000), Request::NodeInfo)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RuntimeError::UnknownActor(ActorId(1_000))),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn losing_a_node_kills_its_actors_removes_its_resources_and_replaces_lost_bundles() {
    let sim = SimRuntime::new([
        SimNode::new("a").cpus(2),
        SimNode::new("b").cpus(2),
        SimNode::new("c").cpus(2),
    ]);
    let (pg, nodes) = ready_group(
        &sim,
        &factory(&["CPU=1"; 2], PlacementStrategy::StrictSpread),
    )
    .await;
    assert_eq!(nodes, [NodeId::from("a"), NodeId::from("b")]);
    let on_a = sim
        .spawn(spec("w0", "CPU=1", Some((pg, 0))))
        .await
        .expect("spawn");
    let on_b = sim
        .spawn(spec("w1", "CPU=1", Some((pg, 1))))
        .await
        .expect("spawn");

    sim.lose_node(&NodeId::from("b"));
    let err = sim.node_info(on_b).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::ActorDied { cause: DeathCause::NodeLost { node }, .. } if node.as_str() == "b"),
        "{err}"
    );
    assert_eq!(sim.live_actors(), [on_a]);
    let cluster = sim.cluster().await.expect("cluster");
    assert!(cluster.node(&"b".into()).is_none());
    assert_eq!(cluster.total(), res("CPU=4"));

    // Bundle 1 moves to the free node c, away from bundle 0 as STRICT_SPREAD requires.
    let placed = sim
        .wait_placement_group_ready(pg, Duration::from_secs(1))
        .await
        .expect("re-reserved");
    assert_eq!(placed.bundle_nodes, [NodeId::from("a"), NodeId::from("c")]);
    assert_eq!(cluster.available(), res("CPU=2"));

    // With no node left for it, the lost bundle waits.
    sim.lose_node(&NodeId::from("c"));
    let err = sim
        .wait_placement_group_ready(pg, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RuntimeError::PlacementTimeout { .. }),
        "{err}"
    );
    assert!(matches!(
        sim.spawn(spec("w", "CPU=1", Some((pg, 1)))).await,
        Err(RuntimeError::PlacementGroupNotReady(_))
    ));
    sim.remove_placement_group(pg).await.expect("remove");
    assert_all_free(&sim).await;
}

#[tokio::test]
async fn clones_share_one_cluster_and_debug_names_it() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]);
    let handle = sim.clone();
    let as_dyn: std::sync::Arc<dyn ActorRuntime> = std::sync::Arc::new(sim.clone());
    let actor = as_dyn.spawn(spec("w", "CPU=1", None)).await.expect("spawn");
    assert_eq!(handle.live_actors(), [actor]);
    let text = format!("{sim:?}");
    assert!(text.contains("SimRuntime") && text.contains('a'), "{text}");
}

/// Runs `rounds` on a thread of its own and fails when it does not finish within `limit`
/// (a hung call cannot be cancelled, so the thread is left behind then).
fn finishes_within(limit: Duration, what: &str, rounds: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        rounds();
        let _ = done.send(());
    });
    match finished.recv_timeout(limit) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// A multi-threaded runtime for races between threads that call into the simulated cluster.
fn threaded_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn calls_racing_a_kill_of_their_actor_all_return_ok_or_actor_died() {
    use std::sync::{Arc, Barrier};

    let runtime = threaded_runtime();
    let handle = runtime.handle().clone();
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]);
    let live = sim.clone();
    finishes_within(Duration::from_secs(30), "calls racing kills", move || {
        for round in 0..4_000u32 {
            let actor = handle
                .block_on(sim.spawn(spec("w", "CPU=1", None)))
                .expect("spawn");
            let start = Arc::new(Barrier::new(4));
            // Each caller keeps calling until the actor is gone, so calls are in flight at
            // every moment of the kill.
            let callers: Vec<_> = (0..3)
                .map(|i| {
                    let (sim, handle, start) = (sim.clone(), handle.clone(), Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        loop {
                            let answer = if i % 2 == 0 {
                                handle.block_on(sim.node_info(actor)).map(drop)
                            } else {
                                handle.block_on(sim.poll(actor)).map(drop)
                            };
                            match answer {
                                Ok(()) => {}
                                Err(RuntimeError::ActorDied { .. }) => return,
                                Err(other) => panic!("a call racing a kill failed with {other}"),
                            }
                        }
                    })
                })
                .collect();
            start.wait();
            for _ in 0..(round % 64) * 50 {
                std::hint::spin_loop();
            }
            handle
                .block_on(sim.kill(actor, Duration::ZERO))
                .expect("kill");
            for caller in callers {
                caller.join().expect("the caller does not panic");
            }
        }
    });
    assert!(live.live_actors().is_empty());
}

#[test]
fn a_task_started_just_before_a_kill_stops_running_once_the_kill_returns() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};

    let ticks = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&ticks);
    let registry = FunctionRegistry::new().register("tick", move |_| {
        let counter = Arc::clone(&counter);
        async move {
            loop {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    let runtime = threaded_runtime();
    let handle = runtime.handle().clone();
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]).with_functions(registry);
    finishes_within(Duration::from_secs(60), "tasks racing kills", move || {
        for round in 0..1_000u32 {
            let actor = handle
                .block_on(sim.spawn(spec("w", "CPU=1", None)))
                .expect("spawn");
            let start = Arc::new(Barrier::new(2));
            let runner = {
                let (sim, handle, start) = (sim.clone(), handle.clone(), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    handle.block_on(sim.run_task(actor, function("tick", Value::Null)))
                })
            };
            start.wait();
            for _ in 0..(round % 64) * 50 {
                std::hint::spin_loop();
            }
            handle
                .block_on(sim.kill(actor, Duration::ZERO))
                .expect("kill");
            match runner.join().expect("join") {
                Ok(_) | Err(RuntimeError::ActorDied { .. }) => {}
                Err(other) => panic!("run_task racing a kill failed with {other}"),
            }
        }
    });
    // Every kill has returned. A tick in progress on another thread at the last kill may
    // still land; after that the count must stand still.
    std::thread::sleep(Duration::from_millis(10));
    let before = ticks.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        before,
        "a task of a killed actor is still ticking"
    );
    drop(runtime);
}

#[tokio::test(start_paused = true)]
async fn waiting_with_the_largest_timeout_waits_without_a_deadline() {
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]);
    let (first, _) = ready_group(&sim, &factory(&["CPU=1"], PlacementStrategy::Pack)).await;
    let second = sim
        .create_placement_group(&factory(&["CPU=1"], PlacementStrategy::Pack))
        .await
        .expect("feasible");
    let remover = {
        let sim = sim.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3_600)).await;
            sim.remove_placement_group(first).await
        })
    };
    let placed = sim
        .wait_placement_group_ready(second, Duration::MAX)
        .await
        .expect("ready once the first group is removed");
    assert_eq!(placed.bundle_nodes, [NodeId::from("a")]);
    remover.await.expect("join").expect("remove");
}

#[tokio::test(start_paused = true)]
async fn task_events_are_pushed_as_they_happen_and_end_with_the_actors_death() {
    use futures::StreamExt;
    use trainyard_runtime::events::ActorEvent;

    let functions = FunctionRegistry::new().register("slow", |ctx| async move {
        ctx.log(Stream::Stdout, "first");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(Value::Null)
    });
    let sim = SimRuntime::new([SimNode::new("a").cpus(1)]).with_functions(functions);
    let actor = sim.spawn(spec("w", "CPU=1", None)).await.expect("spawn");
    let mut events = sim
        .task_events(actor)
        .await
        .expect("subscribe")
        .expect("the sim pushes");
    assert!(
        sim.task_events(actor).await.is_err(),
        "a second subscription is refused"
    );
    sim.run_task(actor, function("slow", Value::Null))
        .await
        .expect("run");
    let started = Instant::now();
    assert!(matches!(
        events.next().await,
        Some(ActorEvent::Task { event: TaskEvent::Log { line, .. }, .. }) if line == "first"
    ));
    assert!(
        started.elapsed() < Duration::from_millis(1),
        "pushed, not polled"
    );
    sim.lose_node(&NodeId::from("a"));
    assert_eq!(
        events.next().await,
        Some(ActorEvent::Died(DeathCause::NodeLost {
            node: NodeId::from("a")
        }))
    );
}
