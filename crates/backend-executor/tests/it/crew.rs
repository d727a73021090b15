//! Workers that outlive attempts, on the simulated cluster: after a rank's failure the run
//! restarts on the same workers (each rank in its own, again), only a worker whose actor died
//! is replaced (in its bundle, at its rank), an event of an attempt that ended is refused,
//! and every attempt, on a kept crew too, runs the backend's `on_start` and then the preflight.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use serde_json::json;
use trainyard_backend_executor::{
    Backend, BackendContext, BackendError, Backoff, RunEvent, StartedWorker, TrainContext,
    WorkerEnv,
};
use trainyard_config::{FailureConfig, RunConfig};
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_runtime::sim::SimRuntime;
use trainyard_runtime::sim::faults::{FailNthSpawn, Fault, Faulty};
use trainyard_runtime::{
    ActorId, ActorRuntime, AttemptNumber, DeathCause, Endpoint, FunctionRegistry, Request,
    Response, RuntimeError, TaskContext, TaskEvent, TaskResult, TaskSpec,
};

use crate::common;

/// How many ranks of `die_once` wait for their worker to be killed.
static WAITING_TO_DIE: AtomicU32 = AtomicU32::new(0);
/// How many ranks of `lose_once` wait for their worker to be lost.
static WAITING_TO_BE_LOST: AtomicU32 = AtomicU32::new(0);
/// How many ranks of `fail_replaced_once` wait for their worker to be killed.
static WAITING_FOR_A_KILL: AtomicU32 = AtomicU32::new(0);

/// The first attempt of a task that waits (forever) after counting itself in `waiting`.
async fn wait_in_first_attempt(task: TaskContext, waiting: &AtomicU32) -> TaskResult {
    let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
    if ctx.restart_count() == 0 {
        waiting.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1_000_000)).await;
    }
    Ok(json!(ctx.restart_count()))
}

/// Once both ranks of the first attempt wait in `waiting`, ends the actor of the worker
/// spawned last with `cause`.
fn end_one_when_waiting(
    sim: &SimRuntime,
    waiting: &'static AtomicU32,
    cause: DeathCause,
) -> tokio::task::JoinHandle<()> {
    let sim = sim.clone();
    tokio::spawn(async move {
        while waiting.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut actors = sim.live_actors();
        actors.sort();
        let victim = *actors.last().expect("two workers");
        sim.end_actor(victim, cause);
    })
}

fn functions() -> FunctionRegistry {
    FunctionRegistry::new()
        .register("rank1_fails_first", |task| async move {
            // Rank 1 fails in the first attempt; every rank reports its attempt.
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            ctx.report(json!({"attempt": ctx.restart_count()}))
                .map_err(|e| e.to_string())?;
            if ctx.world_rank().0 == 1 && ctx.restart_count() == 0 {
                return Err("rank 1 fails".to_owned());
            }
            Ok(json!(ctx.restart_count()))
        })
        .register("lose_once", |task| async move {
            wait_in_first_attempt(task, &WAITING_TO_BE_LOST).await
        })
        .register("fail_replaced_once", |task| async move {
            wait_in_first_attempt(task, &WAITING_FOR_A_KILL).await
        })
        .register("die_once", |task| async move {
            // The first attempt waits for a worker to be killed.
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            if ctx.restart_count() == 0 {
                WAITING_TO_DIE.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1_000_000)).await;
            }
            Ok(json!(ctx.restart_count()))
        })
}

fn restart_once() -> RunConfig {
    RunConfig::default().failure_config(FailureConfig::restarts(1))
}

/// The workers of each attempt, by attempt.
fn started(events: &[RunEvent]) -> Vec<Vec<StartedWorker>> {
    events
        .iter()
        .filter_map(|event| match event {
            RunEvent::AttemptStarted { workers, .. } => Some(workers.clone()),
            _ => None,
        })
        .collect()
}

/// Each worker's process (the simulated actor's pid), by rank.
fn pids(workers: &[StartedWorker]) -> Vec<u32> {
    workers.iter().map(|w| w.pid).collect()
}

fn assert_nothing_left(sim: &SimRuntime) {
    assert_eq!(sim.placement_group_count(), 0, "a placement group leaked");
    assert!(
        sim.live_actors().is_empty(),
        "actors leaked: {:?}",
        sim.live_actors()
    );
}

#[tokio::test]
async fn a_failed_rank_restarts_in_its_own_worker_and_every_worker_is_kept() {
    let sim = common::one_node(2, functions());
    let task = TaskSpec::function("rank1_fails_first", json!(null));
    let (result, events) = common::fit_two(&sim, restart_once(), &task, None).await;
    let report = result.expect("the restart succeeds");
    assert_eq!(report.attempts, 2);
    assert_eq!(report.returns, [json!(1), json!(1)]);
    let attempts = started(&events);
    assert_eq!(attempts.len(), 2, "{events:?}");
    assert_eq!(
        pids(&attempts[0]),
        pids(&attempts[1]),
        "a task's failure keeps every worker, the failed rank's too"
    );
    assert_nothing_left(&sim);
}

#[tokio::test]
async fn a_worker_that_died_is_replaced_at_its_rank_and_the_others_are_kept() {
    let sim = common::one_node(2, functions());
    let killer = {
        let sim = sim.clone();
        tokio::spawn(async move {
            while WAITING_TO_DIE.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let mut actors = sim.live_actors();
            actors.sort();
            let victim = *actors.last().expect("two workers");
            let cause = DeathCause::ProcessExited {
                code: None,
                signal: Some(9),
            };
            sim.end_actor(victim, cause);
        })
    };
    let task = TaskSpec::function("die_once", json!(null));
    let (result, events) = common::fit_two(&sim, restart_once(), &task, None).await;
    killer.await.expect("the killer ran");
    let report = result.expect("the restart succeeds");
    assert_eq!(report.returns, [json!(1), json!(1)]);
    let attempts = started(&events);
    let (before, after) = (pids(&attempts[0]), pids(&attempts[1]));
    let kept: Vec<bool> = before.iter().zip(&after).map(|(b, a)| b == a).collect();
    assert_eq!(
        kept.iter().filter(|kept| **kept).count(),
        1,
        "one worker is kept and the dead one replaced: {before:?} then {after:?}"
    );
    for (worker, again) in attempts[0].iter().zip(&attempts[1]) {
        assert_eq!(
            (worker.rank.world_rank, &worker.node_id),
            (again.rank.world_rank, &again.node_id),
            "every rank stays where it was"
        );
    }
    assert_nothing_left(&sim);
}

#[tokio::test]
async fn a_worker_that_went_with_its_host_is_not_replaced_there_and_every_worker_starts_afresh() {
    let sim = common::one_node(2, functions());
    let cause = DeathCause::Unresponsive { after_ms: 10_000 };
    let ender = end_one_when_waiting(&sim, &WAITING_TO_BE_LOST, cause);
    let task = TaskSpec::function("lose_once", json!(null));
    let (result, events) = common::fit_two(&sim, restart_once(), &task, None).await;
    ender.await.expect("the ender ran");
    let report = result.expect("the restart succeeds");
    assert_eq!(report.attempts, 2);
    let attempts = started(&events);
    let (before, after) = (pids(&attempts[0]), pids(&attempts[1]));
    assert!(
        before.iter().all(|pid| !after.contains(pid)),
        "no worker is kept once one went with its host: {before:?} then {after:?}"
    );
    assert_nothing_left(&sim);
}

#[tokio::test]
async fn lost_workers_that_cannot_be_replaced_give_way_to_a_fresh_start_not_another_failure() {
    let sim = common::one_node(2, functions());
    // Spawns 0 and 1 start the crew; spawn 2, the lost worker's replacement, fails.
    let runtime: Arc<dyn ActorRuntime> =
        Arc::new(Faulty::wrap(Arc::new(sim.clone()), FailNthSpawn::new(2)));
    let cause = DeathCause::ProcessExited {
        code: None,
        signal: Some(9),
    };
    let ender = end_one_when_waiting(&sim, &WAITING_FOR_A_KILL, cause);
    let task = TaskSpec::function("fail_replaced_once", json!(null));
    // One restart allowed: the replacement that could not start must not count as another.
    let (result, events) =
        common::fit_two_on(runtime, restart_once(), &task, None, Backoff::NONE).await;
    ender.await.expect("the ender ran");
    let report = result.expect("the run succeeds after one failure");
    assert_eq!(report.attempts, 2);
    assert_eq!(report.returns, [json!(1), json!(1)]);
    let attempts = started(&events);
    let (before, after) = (pids(&attempts[0]), pids(&attempts[1]));
    assert!(
        before.iter().all(|pid| !after.contains(pid)),
        "every worker started afresh: {before:?} then {after:?}"
    );
    assert_nothing_left(&sim);
}

/// Before the first event of attempt 1 on each worker, an event that says it is of attempt
/// 0, as one that came late from an earlier task would.
#[derive(Debug)]
struct StaleReport;

#[async_trait]
impl Fault for StaleReport {
    async fn task_events(
        &self,
        inner: &dyn ActorRuntime,
        actor: ActorId,
    ) -> Result<Option<TaskEvents>, RuntimeError> {
        let Some(events) = inner.task_events(actor).await? else {
            return Ok(None);
        };
        let mut injected = false;
        let events: TaskEvents = events
            .flat_map(move |event| {
                let mut out = Vec::new();
                if !injected && event.attempt() == Some(AttemptNumber(1)) {
                    injected = true;
                    let mut metrics = serde_json::Map::new();
                    metrics.insert("stale".into(), json!(true));
                    out.push(ActorEvent::Task {
                        attempt: AttemptNumber(0),
                        event: TaskEvent::Report {
                            metrics,
                            checkpoint: None,
                        },
                    });
                }
                out.push(event);
                futures::stream::iter(out)
            })
            .boxed();
        Ok(Some(events))
    }
}

#[tokio::test]
async fn an_event_of_an_attempt_that_ended_is_refused() {
    let sim = common::one_node(2, functions());
    let runtime: Arc<dyn ActorRuntime> = Arc::new(Faulty::wrap(Arc::new(sim.clone()), StaleReport));
    let (tx, mut rx) = tokio::sync::mpsc::channel(10_000);
    let executor = trainyard_backend_executor::BackendExecutor {
        scaling: trainyard_config::ScalingConfig::default().num_workers(2),
        options: trainyard_backend_executor::ExecutorOptions {
            restart_backoff: trainyard_backend_executor::Backoff::NONE,
            ..trainyard_backend_executor::ExecutorOptions::default()
        },
        run: restart_once(),
        events: Some(tx),
        ..trainyard_backend_executor::BackendExecutor::new(runtime)
    };
    let task = TaskSpec::function("rank1_fails_first", json!(null));
    let report = tokio::time::timeout(Duration::from_secs(60), executor.fit(&task))
        .await
        .expect("the run ends within a minute")
        .expect("the restart succeeds");
    let mut reports = Vec::new();
    while let Ok(event) = rx.try_recv() {
        if let RunEvent::Report {
            attempt, metrics, ..
        } = event
        {
            reports.push((attempt, metrics));
        }
    }
    assert!(
        reports
            .iter()
            .all(|(_, metrics)| !metrics.contains_key("stale")),
        "a stale report was taken: {reports:?}"
    );
    assert_eq!(
        reports.iter().filter(|(attempt, _)| *attempt == 1).count(),
        2,
        "both ranks' reports of the second attempt are taken: {reports:?}"
    );
    assert_eq!(report.returns, [json!(1), json!(1)]);
    assert_nothing_left(&sim);
}

/// What happened before the tasks of each attempt, in order: `on_start` of attempt N, and
/// each worker's preflight of the rendezvous `on_start` gave it.
type Steps = Arc<Mutex<Vec<String>>>;

fn step(steps: &Steps, what: String) {
    steps
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(what);
}

/// A backend whose `on_start` hands every worker the rendezvous `rdv-N` of its attempt, to
/// be tried by the preflight.
#[derive(Debug)]
struct Rendezvous(Steps);

#[async_trait]
impl Backend for Rendezvous {
    fn name(&self) -> &str {
        "rendezvous"
    }

    fn rendezvous(&self, env: &BTreeMap<String, String>) -> Vec<Endpoint> {
        env.get("RDV_HOST")
            .map(|host| vec![Endpoint::new(host.clone(), 29_500)])
            .unwrap_or_default()
    }

    async fn on_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
        step(&self.0, format!("on_start {}", ctx.restart_count));
        let host = format!("rdv-{}", ctx.restart_count);
        Ok(vec![
            BTreeMap::from([("RDV_HOST".to_owned(), host)]);
            ctx.group.len()
        ])
    }
}

/// Books each preflight a worker is asked for, with the rendezvous it tries.
#[derive(Debug)]
struct Preflights(Steps);

#[async_trait]
impl Fault for Preflights {
    async fn call(
        &self,
        inner: &dyn ActorRuntime,
        actor: ActorId,
        request: Request,
    ) -> Result<Response, RuntimeError> {
        if let Request::Preflight { targets } = &request {
            let hosts: Vec<_> = targets.iter().map(|t| t.host.clone()).collect();
            step(&self.0, format!("preflight {}", hosts.join(",")));
        }
        inner.call(actor, request).await
    }
}

#[tokio::test]
async fn every_attempt_on_a_kept_crew_runs_on_start_then_the_preflight() {
    let sim = common::one_node(2, functions());
    let steps = Steps::default();
    let runtime: Arc<dyn ActorRuntime> = Arc::new(Faulty::wrap(
        Arc::new(sim.clone()),
        Preflights(Arc::clone(&steps)),
    ));
    let (tx, mut rx) = tokio::sync::mpsc::channel(10_000);
    let executor = trainyard_backend_executor::BackendExecutor {
        backend: Arc::new(Rendezvous(Arc::clone(&steps))),
        scaling: trainyard_config::ScalingConfig::default().num_workers(2),
        options: trainyard_backend_executor::ExecutorOptions {
            restart_backoff: trainyard_backend_executor::Backoff::NONE,
            ..trainyard_backend_executor::ExecutorOptions::default()
        },
        run: restart_once(),
        events: Some(tx),
        ..trainyard_backend_executor::BackendExecutor::new(runtime)
    };
    let task = TaskSpec::function("rank1_fails_first", json!(null));
    let report = tokio::time::timeout(Duration::from_secs(60), executor.fit(&task))
        .await
        .expect("the run ends within a minute")
        .expect("the restart succeeds");
    assert_eq!(report.attempts, 2);
    let mut events = Vec::new();
    while let Ok(event) = rx.try_recv() {
        events.push(event);
    }
    let attempts = started(&events);
    assert_eq!(attempts.len(), 2, "{events:?}");
    assert_eq!(
        pids(&attempts[0]),
        pids(&attempts[1]),
        "the second attempt runs on the kept workers"
    );
    let steps = steps
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(
        steps,
        [
            "on_start 0",
            "preflight rdv-0",
            "preflight rdv-0",
            "on_start 1",
            "preflight rdv-1",
            "preflight rdv-1",
        ],
        "each attempt's preflight tries the rendezvous its own on_start gave"
    );
    assert_nothing_left(&sim);
}
