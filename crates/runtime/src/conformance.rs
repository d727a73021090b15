//! Checks that every [`ActorRuntime`] must pass (feature `conformance`).
//!
//! Each check is a `pub async fn` taking the runtime as `&dyn ActorRuntime`; it panics with
//! a message saying what went wrong, so it reads as a test failure wherever it runs. Requests
//! are derived from what [`ActorRuntime::cluster`] reports (1-CPU bundles, "more CPU than the
//! biggest node"), so the same suite runs on the simulated cluster, this machine or a Ray
//! cluster. A check cleans up what it created and leaves the cluster as it found it; the
//! cluster should be otherwise idle while the suite runs. Every wait is bounded.
//!
//! ```
//! use trainyard_runtime::{ActorRuntime, conformance};
//!
//! /// Part of a runtime's own test suite.
//! async fn my_runtime_conforms(runtime: &dyn ActorRuntime) {
//!     conformance::run_all(runtime).await;
//! }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ActorOptions, CPU, ResourceAmount, Resources};

use crate::events::ActorEvent;
use crate::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, AttemptNumber, ClusterSnapshot, NodeId,
    PlacementGroupId, PlacementInfo, RuntimeError, TaskEvent, TaskExit, TaskSpec, TaskStatus,
    builtins,
};
use futures::StreamExt;
use futures::stream::BoxStream;

/// How long a feasible group may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long resources may take to show up as available again after a kill or removal.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a task may take to finish, and an infeasible group to be refused.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound for "at once".
const FAST: Duration = Duration::from_secs(5);
/// Pause between two looks at a changing state.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Runs every check, in order.
pub async fn run_all(runtime: &dyn ActorRuntime) {
    reservation(runtime).await;
    pinning(runtime).await;
    accounting(runtime).await;
    pinned_actor_uses_its_bundle(runtime).await;
    full_bundle_refuses_another_actor(runtime).await;
    infeasible_fails_fast(runtime).await;
    env_reaches_actor(runtime).await;
    kill_racing_calls_returns_promptly(runtime).await;
    tasks_come_and_go_inside_an_actor(runtime).await;
    a_killed_actors_bundle_takes_a_new_actor(runtime).await;
}

/// Runs every check of command tasks, for runtimes that run programs (not the simulated
/// cluster): environment, output order, exit codes, signals, stop and kill. They use `sh`.
pub async fn run_commands(runtime: &dyn ActorRuntime) {
    command_sees_its_environment(runtime).await;
    command_output_arrives_line_by_line_in_order(runtime).await;
    command_exit_codes_and_signals_are_kept(runtime).await;
    a_missing_program_is_rejected_as_data(runtime).await;
    stop_ends_a_running_command(runtime).await;
    kill_ends_a_running_command(runtime).await;
    a_stopped_command_leaves_its_actor_for_the_next(runtime).await;
}

fn sh(script: &str, env: BTreeMap<String, String>) -> TaskSpec {
    TaskSpec::Command {
        program: "sh".to_owned(),
        args: vec!["-c".to_owned(), script.to_owned()],
        env,
    }
}

fn lines(events: &[TaskEvent], stream: crate::Stream) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            TaskEvent::Log { stream: s, line } if *s == stream => Some(line.clone()),
            _ => None,
        })
        .collect()
}

/// The spawn environment, `SetEnv` variables and the task's own variables reach the
/// command's process, later ones winning; the runtime's own secrets do not.
pub async fn command_sees_its_environment(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "command_sees_its_environment";
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let env = BTreeMap::from([pair("TY_SPAWN", "spawn"), pair("TY_WINS", "spawn")]);
    let actor = spawn(runtime, Resources::new(), None, env, CHECK).await;
    runtime
        .set_env(
            actor,
            BTreeMap::from([pair("TY_SET", "set"), pair("TY_WINS", "set")]),
        )
        .await
        .unwrap_or_else(|e| panic!("{CHECK}: set_env failed: {e}"));
    let task = sh(
        "echo spawn=$TY_SPAWN set=$TY_SET task=$TY_TASK wins=$TY_WINS private=${TRAINYARD_AGENT_CONFIG:-none}${TRAINYARD_ROLE:-}",
        BTreeMap::from([pair("TY_TASK", "task"), pair("TY_WINS", "task")]),
    );
    let (events, exit) = run_to_end(runtime, actor, task, CHECK).await;
    assert!(
        matches!(exit, TaskExit::Succeeded { .. }),
        "{CHECK}: the command failed: {exit:?}"
    );
    assert_eq!(
        lines(&events, crate::Stream::Stdout),
        ["spawn=spawn set=set task=task wins=task private=none"],
        "{CHECK}: the command saw the wrong environment"
    );
    kill(runtime, actor, CHECK).await;
}

/// Every line a command prints arrives, stdout and stderr apart, each in order.
pub async fn command_output_arrives_line_by_line_in_order(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "command_output_arrives_line_by_line_in_order";
    let actor = spawn(runtime, Resources::new(), None, BTreeMap::new(), CHECK).await;
    let task = sh(
        "i=1; while [ $i -le 500 ]; do echo out $i; echo err $i >&2; i=$((i+1)); done",
        BTreeMap::new(),
    );
    let (events, exit) = run_to_end(runtime, actor, task, CHECK).await;
    assert!(
        matches!(exit, TaskExit::Succeeded { .. }),
        "{CHECK}: the command failed: {exit:?}"
    );
    for (stream, word) in [
        (crate::Stream::Stdout, "out"),
        (crate::Stream::Stderr, "err"),
    ] {
        let want: Vec<String> = (1..=500).map(|i| format!("{word} {i}")).collect();
        assert_eq!(
            lines(&events, stream),
            want,
            "{CHECK}: the {word} lines arrived wrong"
        );
    }
    kill(runtime, actor, CHECK).await;
}

/// A command's exit code, and the signal that killed one, are kept as data.
pub async fn command_exit_codes_and_signals_are_kept(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "command_exit_codes_and_signals_are_kept";
    let cases = [
        ("exit 0", TaskExit::from_code(0)),
        ("exit 7", TaskExit::from_code(7)),
        (
            "kill -TERM $$",
            TaskExit::Failed {
                failure: crate::TaskFailure::Signal {
                    signal: 15,
                    core_dumped: false,
                },
            },
        ),
    ];
    // One actor per task: an actor's event stream has one subscriber.
    for (script, want) in cases {
        let actor = spawn(runtime, Resources::new(), None, BTreeMap::new(), CHECK).await;
        let (_, exit) = run_to_end(runtime, actor, sh(script, BTreeMap::new()), CHECK).await;
        assert_eq!(exit, want, "{CHECK}: `{script}` ended wrong");
        kill(runtime, actor, CHECK).await;
    }
}

/// A program that does not exist is refused with [`crate::TaskRejection::ProgramNotFound`].
pub async fn a_missing_program_is_rejected_as_data(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "a_missing_program_is_rejected_as_data";
    let actor = spawn(runtime, Resources::new(), None, BTreeMap::new(), CHECK).await;
    let task = TaskSpec::Command {
        program: "trainyard-conformance-no-such-program".to_owned(),
        args: Vec::new(),
        env: BTreeMap::new(),
    };
    match timeout(ANSWER_TIMEOUT, runtime.run_task(actor, task)).await {
        Ok(Err(RuntimeError::TaskRejected {
            rejection: crate::TaskRejection::ProgramNotFound { program },
            ..
        })) => assert_eq!(program, "trainyard-conformance-no-such-program"),
        other => panic!("{CHECK}: expected a ProgramNotFound rejection, got {other:?}"),
    }
    kill(runtime, actor, CHECK).await;
}

/// `Stop` ends a running command and its actor promptly.
pub async fn stop_ends_a_running_command(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "stop_ends_a_running_command";
    let before = snapshot(runtime, CHECK).await;
    let actor = spawn(runtime, Resources::new(), None, BTreeMap::new(), CHECK).await;
    runtime
        .run_task(actor, sh("exec sleep 300", BTreeMap::new()))
        .await
        .unwrap_or_else(|e| panic!("{CHECK}: run_task failed: {e}"));
    match timeout(ANSWER_TIMEOUT, runtime.stop(actor)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{CHECK}: stop failed: {e}"),
        Err(_) => panic!("{CHECK}: stop did not answer within {ANSWER_TIMEOUT:?}"),
    }
    let deadline = Instant::now() + FAST;
    loop {
        match runtime.node_info(actor).await {
            Err(e) if e.is_actor_death() => break,
            _ if Instant::now() > deadline => {
                panic!("{CHECK}: the actor still answers {FAST:?} after it was stopped")
            }
            _ => sleep(POLL_INTERVAL).await,
        }
    }
    kill(runtime, actor, CHECK).await;
    settle(runtime, &before, CHECK).await;
}

/// `kill` ends a running command and its actor promptly, and frees what it held.
pub async fn kill_ends_a_running_command(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "kill_ends_a_running_command";
    let before = snapshot(runtime, CHECK).await;
    let actor = spawn(runtime, one_cpu(), None, BTreeMap::new(), CHECK).await;
    runtime
        .run_task(actor, sh("trap '' TERM; exec sleep 300", BTreeMap::new()))
        .await
        .unwrap_or_else(|e| panic!("{CHECK}: run_task failed: {e}"));
    let started = Instant::now();
    kill(runtime, actor, CHECK).await;
    assert!(
        started.elapsed() < FAST,
        "{CHECK}: kill with no grace took {:?}",
        started.elapsed()
    );
    match runtime.node_info(actor).await {
        Err(e) if e.is_actor_death() => {}
        other => panic!("{CHECK}: a killed actor answered {other:?}"),
    }
    settle(runtime, &before, CHECK).await;
}

/// A feasible group becomes ready, and the available resources of the cluster (and of each
/// node) shrink by exactly what its bundles hold; removing it gives them back.
pub async fn reservation(runtime: &dyn ActorRuntime) {
    let before = snapshot(runtime, "reservation").await;
    let bundles = free_whole_cpus(&before).min(2);
    assert!(
        bundles > 0,
        "reservation: the conformance suite needs a node with at least 1 free CPU"
    );
    let factory = one_cpu_bundles(bundles, PlacementStrategy::Pack);
    let (pg, placed) = create_ready(runtime, &factory, "reservation").await;
    assert_eq!(
        placed.bundle_nodes.len(),
        bundles,
        "reservation: a group of {bundles} bundles reported {} bundle nodes",
        placed.bundle_nodes.len()
    );

    let after = snapshot(runtime, "reservation").await;
    let mut expected = before.available();
    subtract(
        &mut expected,
        &one_cpu().checked_mul(bundles as u64).unwrap_or_default(),
    );
    assert_same(
        &after.available(),
        &expected,
        &format!(
            "reservation: after reserving {bundles} 1-CPU bundles, the cluster's available resources"
        ),
    );
    for node in &before.nodes {
        let here = placed
            .bundle_nodes
            .iter()
            .filter(|n| **n == node.id)
            .count() as u64;
        let now = after
            .node(&node.id)
            .unwrap_or_else(|| panic!("reservation: node {} vanished from the cluster", node.id));
        let want = node
            .available
            .amount(CPU)
            .checked_sub(ResourceAmount::from_units(here));
        assert_eq!(
            Some(now.available.amount(CPU)),
            want,
            "reservation: node {} hosts {here} bundles of 1 CPU; its available CPU went from {} to {}",
            node.id,
            node.available.amount(CPU),
            now.available.amount(CPU)
        );
    }

    remove(runtime, pg, "reservation").await;
    settle(runtime, &before, "reservation: after removing the group").await;
}

/// Actors spawned into bundle `i` run on the node that placement chose for bundle `i`.
pub async fn pinning(runtime: &dyn ActorRuntime) {
    let before = snapshot(runtime, "pinning").await;
    let hosts = before
        .nodes
        .iter()
        .filter(|n| n.available.amount(CPU) >= ResourceAmount::ONE)
        .count();
    assert!(
        hosts > 0,
        "pinning: the conformance suite needs a node with at least 1 free CPU"
    );
    let bundles = hosts.min(3);
    let factory = one_cpu_bundles(bundles, PlacementStrategy::StrictSpread);
    let (pg, placed) = create_ready(runtime, &factory, "pinning").await;
    let distinct: BTreeSet<&NodeId> = placed.bundle_nodes.iter().collect();
    assert_eq!(
        distinct.len(),
        bundles,
        "pinning: STRICT_SPREAD put {bundles} bundles on nodes {:?}",
        placed.bundle_nodes
    );

    let mut actors = Vec::new();
    for index in 0..bundles {
        let actor = spawn(
            runtime,
            one_cpu(),
            Some((pg, index)),
            BTreeMap::new(),
            "pinning",
        )
        .await;
        actors.push(actor);
        let info = runtime.node_info(actor).await.unwrap_or_else(|e| {
            panic!("pinning: node_info of the actor in bundle {index} failed: {e}")
        });
        assert_eq!(
            info.node_id, placed.bundle_nodes[index],
            "pinning: the actor pinned to bundle {index} runs on {} but the bundle is on {}",
            info.node_id, placed.bundle_nodes[index]
        );
        if let Some(node) = before.node(&info.node_id) {
            assert_eq!(
                info.node_ip, node.ip,
                "pinning: the actor reports another IP than its node"
            );
        }
    }
    for actor in actors {
        kill(runtime, actor, "pinning").await;
    }
    remove(runtime, pg, "pinning").await;
    settle(
        runtime,
        &before,
        "pinning: after killing the actors and removing the group",
    )
    .await;
}

/// Resources come back when an unpinned actor is killed and when a group is removed (with
/// an actor still inside); a bundle whose actor was killed takes a new one.
pub async fn accounting(runtime: &dyn ActorRuntime) {
    let before = snapshot(runtime, "accounting").await;
    assert!(
        free_whole_cpus(&before) > 0,
        "accounting: the conformance suite needs a node with at least 1 free CPU"
    );

    // An unpinned actor holds its CPU on its node until it is killed.
    let actor = spawn(runtime, one_cpu(), None, BTreeMap::new(), "accounting").await;
    let node = runtime
        .node_info(actor)
        .await
        .unwrap_or_else(|e| panic!("accounting: node_info of an unpinned actor failed: {e}"))
        .node_id;
    let mut expected = before.clone();
    if let Some(info) = expected.nodes.iter_mut().find(|n| n.id == node) {
        subtract(&mut info.available, &one_cpu());
    }
    settle(
        runtime,
        &expected,
        "accounting: while an unpinned 1-CPU actor runs",
    )
    .await;
    kill(runtime, actor, "accounting").await;
    settle(
        runtime,
        &before,
        "accounting: after killing an unpinned actor",
    )
    .await;

    // Kill, then re-spawn into the same bundle.
    let factory = one_cpu_bundles(1, PlacementStrategy::Pack);
    let (pg, _) = create_ready(runtime, &factory, "accounting").await;
    let first = spawn(
        runtime,
        one_cpu(),
        Some((pg, 0)),
        BTreeMap::new(),
        "accounting",
    )
    .await;
    kill(runtime, first, "accounting").await;
    let second = spawn(
        runtime,
        one_cpu(),
        Some((pg, 0)),
        BTreeMap::new(),
        "accounting",
    )
    .await;
    runtime.node_info(second).await.unwrap_or_else(|e| {
        panic!("accounting: the actor re-spawned into bundle 0 does not answer: {e}")
    });

    // Removing the group ends the actor inside and gives everything back.
    remove(runtime, pg, "accounting").await;
    settle(
        runtime,
        &before,
        "accounting: after removing a group with an actor inside",
    )
    .await;
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    while runtime.node_info(second).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "accounting: an actor still answers {SETTLE_TIMEOUT:?} after its group was removed"
        );
        sleep(POLL_INTERVAL).await;
    }
}

/// An actor pinned to a bundle runs on what the bundle reserved: spawning it leaves every
/// node's available resources as they were once the group was reserved.
pub async fn pinned_actor_uses_its_bundle(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "pinned_actor_uses_its_bundle";
    let before = snapshot(runtime, CHECK).await;
    assert!(
        free_whole_cpus(&before) > 0,
        "{CHECK}: the conformance suite needs a node with at least 1 free CPU"
    );
    let factory = one_cpu_bundles(1, PlacementStrategy::Pack);
    let (pg, _) = create_ready(runtime, &factory, CHECK).await;
    let reserved = snapshot(runtime, CHECK).await;
    let actor = spawn(runtime, one_cpu(), Some((pg, 0)), BTreeMap::new(), CHECK).await;
    runtime
        .node_info(actor)
        .await
        .unwrap_or_else(|e| panic!("{CHECK}: node_info of the pinned actor failed: {e}"));
    let running = snapshot(runtime, CHECK).await;
    for node in &reserved.nodes {
        let now = running
            .node(&node.id)
            .map(|n| n.available.clone())
            .unwrap_or_default();
        assert!(
            same_amounts(&now, &node.available),
            "{CHECK}: spawning a 1-CPU actor into a reserved 1-CPU bundle changed node {}'s available resources from {} to {now}; the actor must use the bundle's resources",
            node.id,
            node.available
        );
    }
    release(runtime, actor, pg, &before, CHECK).await;
}

/// A bundle whose resources an actor holds refuses a second actor that needs them too, with
/// an error and at once, rather than leaving the spawn waiting.
pub async fn full_bundle_refuses_another_actor(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "full_bundle_refuses_another_actor";
    let before = snapshot(runtime, CHECK).await;
    assert!(
        free_whole_cpus(&before) > 0,
        "{CHECK}: the conformance suite needs a node with at least 1 free CPU"
    );
    let factory = one_cpu_bundles(1, PlacementStrategy::Pack);
    let (pg, _) = create_ready(runtime, &factory, CHECK).await;
    let first = spawn(runtime, one_cpu(), Some((pg, 0)), BTreeMap::new(), CHECK).await;
    let options = ActorOptions::try_from(&one_cpu())
        .unwrap_or_else(|e| panic!("{CHECK}: 1 CPU is not a valid actor demand: {e}"));
    let second = ActorSpec {
        name: format!("conformance-{CHECK}-second"),
        options,
        placement: Some((pg, 0)),
        env: BTreeMap::new(),
    };
    match timeout(FAST, runtime.spawn(second)).await {
        Ok(Err(_)) => {}
        Ok(Ok(actor)) => {
            kill(runtime, actor, CHECK).await;
            kill(runtime, first, CHECK).await;
            remove(runtime, pg, CHECK).await;
            panic!(
                "{CHECK}: a second 1-CPU actor was started in a 1-CPU bundle that the first one fills"
            );
        }
        Err(_) => panic!(
            "{CHECK}: spawning a second 1-CPU actor into a full 1-CPU bundle did not fail within {FAST:?}"
        ),
    }
    runtime.node_info(first).await.unwrap_or_else(|e| {
        panic!("{CHECK}: the first actor no longer answers after the refused spawn: {e}")
    });
    release(runtime, first, pg, &before, CHECK).await;
}

/// Calls in flight while their actor is killed all return promptly, each with an answer or
/// an actor-death error, and the kill returns too.
pub async fn kill_racing_calls_returns_promptly(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "kill_racing_calls_returns_promptly";
    const ROUNDS: usize = 20;
    const CALLS: usize = 16;
    for round in 0..ROUNDS {
        let actor = spawn(runtime, Resources::new(), None, BTreeMap::new(), CHECK).await;
        let calls = futures::future::join_all((0..CALLS).map(|i| async move {
            if i % 2 == 0 {
                runtime.node_info(actor).await.map(drop)
            } else {
                runtime.poll(actor).await.map(drop)
            }
        }));
        let race = async { futures::join!(calls, runtime.kill(actor, Duration::ZERO)) };
        let Ok((answers, killed)) = timeout(FAST, race).await else {
            panic!(
                "{CHECK}: round {round}: {CALLS} calls racing a kill of their actor did not all return within {FAST:?}"
            );
        };
        if let Err(e) = killed {
            panic!("{CHECK}: round {round}: killing an actor with calls in flight failed: {e}");
        }
        for answer in answers {
            if let Err(e) = answer {
                assert!(
                    e.is_actor_death(),
                    "{CHECK}: round {round}: a call racing a kill failed with something other than the actor's death: {e}"
                );
            }
        }
    }
}

/// A group asking for more CPU than the biggest node has is refused at once with
/// [`RuntimeError::Infeasible`] naming bundle 0 and `CPU`.
pub async fn infeasible_fails_fast(runtime: &dyn ActorRuntime) {
    let before = snapshot(runtime, "infeasible_fails_fast").await;
    let biggest = before
        .nodes
        .iter()
        .map(|n| n.total.amount(CPU))
        .max()
        .unwrap_or_default();
    let asked = biggest
        .checked_add(ResourceAmount::ONE)
        .unwrap_or(ResourceAmount::ONE);
    let factory = PlacementGroupFactory {
        bundles: vec![Resources::new().with(CPU, asked)],
        strategy: PlacementStrategy::Pack,
    };
    let started = Instant::now();
    let outcome = timeout(FAST, runtime.create_placement_group(&factory)).await;
    match outcome {
        Err(_) => panic!(
            "infeasible_fails_fast: create_placement_group did not answer within {FAST:?} for a bundle of CPU={asked} (the biggest node has {biggest})"
        ),
        Ok(Ok(pg)) => {
            let _ = runtime.remove_placement_group(pg).await;
            panic!(
                "infeasible_fails_fast: a bundle of CPU={asked} was accepted although the biggest node has CPU={biggest}"
            );
        }
        Ok(Err(RuntimeError::Infeasible(error))) => {
            assert_eq!(
                error.bundle(),
                Some(0),
                "infeasible_fails_fast: the error does not name bundle 0: {error}"
            );
            assert_eq!(
                error.resource(),
                Some(CPU),
                "infeasible_fails_fast: the error does not name CPU: {error}"
            );
            let text = error.to_string();
            assert!(
                text.contains("bundle 0") && text.contains(&format!("CPU={asked}")),
                "infeasible_fails_fast: the message does not say what was asked: {text}"
            );
        }
        Ok(Err(other)) => panic!(
            "infeasible_fails_fast: expected RuntimeError::Infeasible after {:?}, got: {other}",
            started.elapsed()
        ),
    }
}

/// The spawn environment, `SetEnv` variables and the task's own variables all reach a
/// `trainyard.env` task, later ones winning.
pub async fn env_reaches_actor(runtime: &dyn ActorRuntime) {
    const SPAWN: &str = "TRAINYARD_CONFORMANCE_SPAWN";
    const SET: &str = "TRAINYARD_CONFORMANCE_SET";
    const TASK: &str = "TRAINYARD_CONFORMANCE_TASK";
    const SET_WINS: &str = "TRAINYARD_CONFORMANCE_SET_OVER_SPAWN";
    const TASK_WINS: &str = "TRAINYARD_CONFORMANCE_TASK_OVER_SET";
    let vars = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };

    let env = vars(&[(SPAWN, "spawn"), (SET_WINS, "spawn")]);
    let actor = spawn(runtime, Resources::new(), None, env, "env_reaches_actor").await;
    runtime
        .set_env(
            actor,
            vars(&[(SET, "set"), (SET_WINS, "set"), (TASK_WINS, "set")]),
        )
        .await
        .unwrap_or_else(|e| panic!("env_reaches_actor: set_env failed: {e}"));
    let task = TaskSpec::Function {
        name: builtins::ENV.to_owned(),
        arg: serde_json::Value::Null,
        env: vars(&[(TASK, "task"), (TASK_WINS, "task")]),
    };
    let (_, exit) = run_to_end(runtime, actor, task, "env_reaches_actor").await;
    let value = match exit {
        TaskExit::Succeeded { value } => value,
        TaskExit::Failed { failure } => {
            panic!("env_reaches_actor: the {} task {failure}", builtins::ENV)
        }
    };
    for (key, want) in [
        (SPAWN, "spawn"),
        (SET, "set"),
        (TASK, "task"),
        (SET_WINS, "set"),
        (TASK_WINS, "task"),
    ] {
        assert_eq!(
            value.get(key).and_then(serde_json::Value::as_str),
            Some(want),
            "env_reaches_actor: {key} should be `{want}` in the task's environment {value}"
        );
    }
    kill(runtime, actor, "env_reaches_actor").await;
}

/// An actor lives on after its task ends, stopped or not, and runs the next: attempts of a
/// run come and go inside the life of its actors. `StopTask` ends a running task (its end is
/// told before the answer's next task's events), and answers at once when none runs; every
/// event of a task carries the attempt it was started for; the actor keeps its process.
pub async fn tasks_come_and_go_inside_an_actor(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "tasks_come_and_go_inside_an_actor";
    let actor = spawn(runtime, Resources::new(), None, BTreeMap::new(), CHECK).await;
    let mut events = subscribed(runtime, actor, CHECK).await;
    let before = info(runtime, actor, CHECK).await;
    let first = AttemptNumber(3);
    let sleep = TaskSpec::function(builtins::SLEEP, 300.into());
    start(runtime, actor, first, sleep, CHECK).await;
    stop_task(runtime, actor, CHECK).await;
    let (_, exit) = until_exit(&mut events, first, CHECK).await;
    assert!(
        matches!(exit, TaskExit::Failed { .. }),
        "{CHECK}: a stopped task ended {exit:?}"
    );
    let after = info(runtime, actor, CHECK).await;
    assert_eq!(
        (after.node_id, after.pid),
        (before.node_id, before.pid),
        "{CHECK}: the actor is not the same after its task was stopped"
    );
    let next = first.next();
    let echo = TaskSpec::function(builtins::ECHO, "again".into());
    start(runtime, actor, next, echo, CHECK).await;
    let (_, exit) = until_exit(&mut events, next, CHECK).await;
    assert_eq!(
        exit,
        TaskExit::Succeeded {
            value: "again".into()
        },
        "{CHECK}: the actor's next task ended wrong"
    );
    // Nothing runs: the answer comes at once.
    match timeout(FAST, runtime.stop_task(actor)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{CHECK}: stopping no task failed: {e}"),
        Err(_) => panic!("{CHECK}: stopping no task did not answer within {FAST:?}"),
    }
    kill(runtime, actor, CHECK).await;
}

/// A command stopped with `StopTask` ends (SIGTERM), its end carrying its attempt, and its
/// actor, the same process, runs the next command, whose output carries the next attempt.
pub async fn a_stopped_command_leaves_its_actor_for_the_next(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "a_stopped_command_leaves_its_actor_for_the_next";
    let actor = spawn(runtime, Resources::new(), None, BTreeMap::new(), CHECK).await;
    let mut events = subscribed(runtime, actor, CHECK).await;
    let before = info(runtime, actor, CHECK).await;
    let first = AttemptNumber(0);
    start(
        runtime,
        actor,
        first,
        sh("echo one; exec sleep 300", BTreeMap::new()),
        CHECK,
    )
    .await;
    // Stopped once it has printed (a stop before then would leave no line to check).
    let mut seen = until_line(&mut events, first, "one", CHECK).await;
    stop_task(runtime, actor, CHECK).await;
    let (rest, exit) = until_exit(&mut events, first, CHECK).await;
    seen.extend(rest);
    assert_eq!(
        lines(&seen, crate::Stream::Stdout),
        ["one"],
        "{CHECK}: the stopped command's output"
    );
    assert_eq!(
        exit,
        TaskExit::Failed {
            failure: crate::TaskFailure::Signal {
                signal: 15,
                core_dumped: false
            }
        },
        "{CHECK}: a stopped command ended wrong"
    );
    assert_eq!(
        info(runtime, actor, CHECK).await.pid,
        before.pid,
        "{CHECK}: the actor's process changed after its task was stopped"
    );
    let next = first.next();
    start(runtime, actor, next, sh("echo two", BTreeMap::new()), CHECK).await;
    let (seen, exit) = until_exit(&mut events, next, CHECK).await;
    assert_eq!(
        (lines(&seen, crate::Stream::Stdout), exit),
        (vec!["two".to_owned()], TaskExit::from_code(0)),
        "{CHECK}: the actor's next command ended wrong"
    );
    kill(runtime, actor, CHECK).await;
}

/// An actor killed in its bundle gives the bundle back: a new actor pinned to it starts (as
/// a run replaces a worker that died), and the group holds what it held before.
pub async fn a_killed_actors_bundle_takes_a_new_actor(runtime: &dyn ActorRuntime) {
    const CHECK: &str = "a_killed_actors_bundle_takes_a_new_actor";
    let before = snapshot(runtime, CHECK).await;
    let factory = one_cpu_bundles(1, PlacementStrategy::Pack);
    let (pg, _) = create_ready(runtime, &factory, CHECK).await;
    let first = spawn(runtime, one_cpu(), Some((pg, 0)), BTreeMap::new(), CHECK).await;
    kill(runtime, first, CHECK).await;
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let second = loop {
        let options = ActorOptions::try_from(&one_cpu())
            .unwrap_or_else(|e| panic!("{CHECK}: one CPU is not an actor demand: {e}"));
        let spec = ActorSpec {
            name: format!("conformance-{CHECK}"),
            options,
            placement: Some((pg, 0)),
            env: BTreeMap::new(),
        };
        match timeout(ANSWER_TIMEOUT, runtime.spawn(spec)).await {
            Ok(Ok(actor)) => break actor,
            // The bundle may take a moment to be free again.
            Ok(Err(e)) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "{CHECK}: the bundle is not free yet");
                sleep(POLL_INTERVAL).await;
            }
            Ok(Err(e)) => panic!(
                "{CHECK}: the bundle of a killed actor took no new actor within {SETTLE_TIMEOUT:?}: {e}"
            ),
            Err(_) => panic!("{CHECK}: spawn did not answer within {ANSWER_TIMEOUT:?}"),
        }
    };
    assert_ne!(first, second, "{CHECK}: the new actor has the old one's id");
    info(runtime, second, CHECK).await;
    release(runtime, second, pg, &before, CHECK).await;
}

/// The actor's event stream: the one the runtime pushes, or its polls' events.
async fn subscribed<'a>(
    runtime: &'a dyn ActorRuntime,
    actor: ActorId,
    check: &str,
) -> BoxStream<'a, ActorEvent> {
    match runtime.task_events(actor).await {
        Ok(Some(events)) => events,
        Ok(None) => polled(runtime, actor),
        Err(e) => panic!("{check}: task_events failed: {e}"),
    }
}

/// The events `runtime`'s polls of `actor` tell, each task's end once; a failed poll ends
/// the stream.
fn polled(runtime: &dyn ActorRuntime, actor: ActorId) -> BoxStream<'_, ActorEvent> {
    // The attempt whose task's end was told (`Some(None)`: a task of no attempt's).
    let told: Option<Option<AttemptNumber>> = None;
    futures::stream::unfold(told, move |mut told| async move {
        sleep(POLL_INTERVAL).await;
        let poll = runtime.poll(actor).await.ok()?;
        let attempt = poll.attempt.unwrap_or_default();
        let mut events: Vec<ActorEvent> = poll
            .events
            .into_iter()
            .map(|event| ActorEvent::Task { attempt, event })
            .collect();
        if let TaskStatus::Exited { exit } = poll.status {
            if told != Some(poll.attempt) {
                told = Some(poll.attempt);
                events.push(ActorEvent::TaskExited { attempt, exit });
            }
        }
        Some((futures::stream::iter(events), told))
    })
    .flatten()
    .boxed()
}

async fn info(runtime: &dyn ActorRuntime, actor: ActorId, check: &str) -> crate::WorkerInfo {
    match timeout(ANSWER_TIMEOUT, runtime.node_info(actor)).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => panic!("{check}: node_info failed: {e}"),
        Err(_) => panic!("{check}: node_info did not answer within {ANSWER_TIMEOUT:?}"),
    }
}

async fn start(
    runtime: &dyn ActorRuntime,
    actor: ActorId,
    attempt: AttemptNumber,
    task: TaskSpec,
    check: &str,
) {
    match timeout(ANSWER_TIMEOUT, runtime.run_attempt(actor, attempt, task)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!("{check}: starting the task of {attempt} failed: {e}"),
        Err(_) => panic!("{check}: run_task did not answer within {ANSWER_TIMEOUT:?}"),
    }
}

async fn stop_task(runtime: &dyn ActorRuntime, actor: ActorId, check: &str) {
    match timeout(ANSWER_TIMEOUT, runtime.stop_task(actor)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{check}: stop_task failed: {e}"),
        Err(_) => panic!("{check}: stop_task did not answer within {ANSWER_TIMEOUT:?}"),
    }
}

/// The events of the task of `attempt` up to the line `line` on its stdout, which must come
/// within [`ANSWER_TIMEOUT`]; its end or an event of another attempt fails the check.
async fn until_line(
    events: &mut BoxStream<'_, ActorEvent>,
    attempt: AttemptNumber,
    line: &str,
    check: &str,
) -> Vec<TaskEvent> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut seen = Vec::new();
    loop {
        let Ok(next) = tokio::time::timeout_at(deadline, events.next()).await else {
            panic!(
                "{check}: the task of {attempt} did not print `{line}` within {ANSWER_TIMEOUT:?}"
            );
        };
        match next {
            Some(ActorEvent::Task { attempt: of, event }) => {
                assert_eq!(of, attempt, "{check}: {event:?} carries the wrong attempt");
                let printed = matches!(
                    &event,
                    TaskEvent::Log { stream: crate::Stream::Stdout, line: l } if l == line
                );
                seen.push(event);
                if printed {
                    return seen;
                }
            }
            Some(ActorEvent::TaskExited { exit, .. }) => {
                panic!("{check}: the task of {attempt} ended {exit:?} before printing `{line}`")
            }
            Some(ActorEvent::Died(cause)) => {
                panic!("{check}: the actor died while running the task of {attempt}: {cause}")
            }
            None => panic!("{check}: the event stream ended before the task of {attempt} printed"),
        }
    }
}

/// The events of the task of `attempt` up to its end, which must come within
/// [`ANSWER_TIMEOUT`]; an event of another attempt fails the check.
async fn until_exit(
    events: &mut BoxStream<'_, ActorEvent>,
    attempt: AttemptNumber,
    check: &str,
) -> (Vec<TaskEvent>, TaskExit) {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut seen = Vec::new();
    loop {
        let Ok(next) = tokio::time::timeout_at(deadline, events.next()).await else {
            panic!("{check}: the task of {attempt} did not end within {ANSWER_TIMEOUT:?}");
        };
        match next {
            Some(ActorEvent::Task { attempt: of, event }) => {
                assert_eq!(of, attempt, "{check}: {event:?} carries the wrong attempt");
                seen.push(event);
            }
            Some(ActorEvent::TaskExited { attempt: of, exit }) => {
                assert_eq!(
                    of, attempt,
                    "{check}: the end {exit:?} carries the wrong attempt"
                );
                return (seen, exit);
            }
            Some(ActorEvent::Died(cause)) => {
                panic!("{check}: the actor died while running the task of {attempt}: {cause}")
            }
            None => panic!("{check}: the event stream ended before the task of {attempt} did"),
        }
    }
}

fn one_cpu() -> Resources {
    Resources::new().with(CPU, ResourceAmount::ONE)
}

fn one_cpu_bundles(n: usize, strategy: PlacementStrategy) -> PlacementGroupFactory {
    PlacementGroupFactory {
        bundles: vec![one_cpu(); n],
        strategy,
    }
}

/// How many 1-CPU bundles fit on the cluster's available CPUs.
fn free_whole_cpus(cluster: &ClusterSnapshot) -> usize {
    cluster
        .nodes
        .iter()
        .map(|n| usize::try_from(n.available.amount(CPU).whole_units()).unwrap_or(usize::MAX))
        .fold(0, usize::saturating_add)
}

fn subtract(from: &mut Resources, amounts: &Resources) {
    for (name, amount) in amounts.iter() {
        let now = from.amount(name).saturating_sub(amount);
        from.insert(name, now);
    }
}

/// Whether two dictionaries hold the same amount of every resource (a missing entry is zero).
fn same_amounts(a: &Resources, b: &Resources) -> bool {
    a.names()
        .chain(b.names())
        .all(|name| a.amount(name) == b.amount(name))
}

fn assert_same(actual: &Resources, expected: &Resources, what: &str) {
    assert!(
        same_amounts(actual, expected),
        "{what} are {actual} but should be {expected}"
    );
}

async fn snapshot(runtime: &dyn ActorRuntime, check: &str) -> ClusterSnapshot {
    match timeout(ANSWER_TIMEOUT, runtime.cluster()).await {
        Ok(Ok(cluster)) => cluster,
        Ok(Err(e)) => panic!("{check}: cluster() failed: {e}"),
        Err(_) => panic!("{check}: cluster() did not answer within {ANSWER_TIMEOUT:?}"),
    }
}

/// Waits until every node's available resources equal those in `expected`.
async fn settle(runtime: &dyn ActorRuntime, expected: &ClusterSnapshot, what: &str) {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let now = snapshot(runtime, what).await;
        let wrong: Vec<String> = expected
            .nodes
            .iter()
            .filter_map(|want| {
                let have = now
                    .node(&want.id)
                    .map(|n| n.available.clone())
                    .unwrap_or_default();
                (!same_amounts(&have, &want.available)).then(|| {
                    format!(
                        "node {} has {have} available, expected {}",
                        want.id, want.available
                    )
                })
            })
            .collect();
        if wrong.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}, after {SETTLE_TIMEOUT:?}: {}",
            wrong.join("; ")
        );
        sleep(POLL_INTERVAL).await;
    }
}

async fn create_ready(
    runtime: &dyn ActorRuntime,
    factory: &PlacementGroupFactory,
    check: &str,
) -> (PlacementGroupId, PlacementInfo) {
    let pg = match timeout(ANSWER_TIMEOUT, runtime.create_placement_group(factory)).await {
        Ok(Ok(pg)) => pg,
        Ok(Err(e)) => panic!(
            "{check}: creating a feasible group of {} bundles failed: {e}",
            factory.bundles.len()
        ),
        Err(_) => {
            panic!("{check}: create_placement_group did not answer within {ANSWER_TIMEOUT:?}")
        }
    };
    match runtime.wait_placement_group_ready(pg, READY_TIMEOUT).await {
        Ok(info) => (pg, info),
        Err(e) => {
            let _ = runtime.remove_placement_group(pg).await;
            panic!("{check}: a feasible group on an idle cluster did not become ready: {e}")
        }
    }
}

async fn spawn(
    runtime: &dyn ActorRuntime,
    demand: Resources,
    placement: Option<(PlacementGroupId, usize)>,
    env: BTreeMap<String, String>,
    check: &str,
) -> ActorId {
    let options = ActorOptions::try_from(&demand)
        .unwrap_or_else(|e| panic!("{check}: {demand} is not a valid actor demand: {e}"));
    let spec = ActorSpec {
        name: format!("conformance-{check}"),
        options,
        placement,
        env,
    };
    match timeout(ANSWER_TIMEOUT, runtime.spawn(spec)).await {
        Ok(Ok(actor)) => actor,
        Ok(Err(e)) => {
            panic!("{check}: spawning an actor ({demand}, placement {placement:?}) failed: {e}")
        }
        Err(_) => panic!("{check}: spawn did not answer within {ANSWER_TIMEOUT:?}"),
    }
}

async fn kill(runtime: &dyn ActorRuntime, actor: ActorId, check: &str) {
    match timeout(ANSWER_TIMEOUT, runtime.kill(actor, Duration::ZERO)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{check}: killing {actor} failed: {e}"),
        Err(_) => panic!("{check}: kill did not answer within {ANSWER_TIMEOUT:?}"),
    }
}

async fn remove(runtime: &dyn ActorRuntime, pg: PlacementGroupId, check: &str) {
    match timeout(ANSWER_TIMEOUT, runtime.remove_placement_group(pg)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{check}: removing {pg} failed: {e}"),
        Err(_) => {
            panic!("{check}: remove_placement_group did not answer within {ANSWER_TIMEOUT:?}")
        }
    }
}

/// Kills `actor`, removes `pg`, and waits until the cluster is back to `before`.
async fn release(
    runtime: &dyn ActorRuntime,
    actor: ActorId,
    pg: PlacementGroupId,
    before: &ClusterSnapshot,
    check: &str,
) {
    kill(runtime, actor, check).await;
    remove(runtime, pg, check).await;
    settle(
        runtime,
        before,
        &format!("{check}: after killing the actor and removing the group"),
    )
    .await;
}

/// Starts `task` on `actor` and follows it to its end: the task events it produced, in
/// order, and how it ended. Uses the runtime's pushed events, or polls when it has none.
pub async fn run_to_end(
    runtime: &dyn ActorRuntime,
    actor: ActorId,
    task: TaskSpec,
    check: &str,
) -> (Vec<TaskEvent>, TaskExit) {
    let events = runtime
        .task_events(actor)
        .await
        .unwrap_or_else(|e| panic!("{check}: task_events failed: {e}"));
    runtime
        .run_task(actor, task)
        .await
        .unwrap_or_else(|e| panic!("{check}: run_task failed: {e}"));
    let mut seen = Vec::new();
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    if let Some(mut events) = events {
        loop {
            let Ok(next) = tokio::time::timeout_at(deadline, events.next()).await else {
                panic!("{check}: the task did not finish within {ANSWER_TIMEOUT:?}");
            };
            match next {
                Some(ActorEvent::Task { event, .. }) => seen.push(event),
                Some(ActorEvent::TaskExited { exit, .. }) => return (seen, exit),
                Some(ActorEvent::Died(cause)) => {
                    panic!("{check}: the actor died while running the task: {cause}")
                }
                None => panic!("{check}: the event stream ended before the task did"),
            }
        }
    }
    loop {
        let poll = runtime
            .poll(actor)
            .await
            .unwrap_or_else(|e| panic!("{check}: poll failed: {e}"));
        seen.extend(poll.events);
        if let TaskStatus::Exited { exit } = poll.status {
            return (seen, exit);
        }
        assert!(
            Instant::now() < deadline,
            "{check}: the task did not finish within {ANSWER_TIMEOUT:?}"
        );
        sleep(POLL_INTERVAL).await;
    }
}
