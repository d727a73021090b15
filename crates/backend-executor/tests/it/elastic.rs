//! Elastic runs on the simulated cluster: an attempt starts with as many workers as fit, grows
//! when room appears (another holder leaves, a node joins) without using up `max_failures`,
//! and after a lost node goes on with as many as fit, counting the failure.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use trainyard_backend_executor::{
    BackendExecutor, Backoff, ExecutorError, ExecutorOptions, FitReport, ResizeReason, RunEvent,
    TrainContext,
};
use trainyard_config::{
    FailureConfig, PlacementGroupFactory, PlacementStrategy, RunConfig, ScalingConfig,
};
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{ActorRuntime, FunctionRegistry, NodeId, PlacementGroupId, TaskSpec};

/// Trains `epochs` epochs of 30 ms from the checkpoint it is given (rank 0's `epoch` file),
/// rank 0 handing in the checkpoint with every epoch's report. Returns the world size it
/// ran at and the epochs it ran.
async fn epochs(ctx: TrainContext) -> Result<Value, String> {
    let total = ctx.arg()["epochs"].as_u64().unwrap_or(20);
    let start = match ctx.checkpoint() {
        Some(dir) => {
            let text = std::fs::read_to_string(dir.join("epoch")).map_err(|e| e.to_string())?;
            text.trim().parse::<u64>().map_err(|e| e.to_string())? + 1
        }
        None => 1,
    };
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    for epoch in start..=total {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let metrics = json!({"epoch": epoch, "world_size": ctx.world_size()});
        let metrics = metrics.as_object().cloned().unwrap_or_default();
        if ctx.world_rank().0 == 0 {
            hand_in(&ctx, metrics, scratch.path(), "epoch", epoch).await?;
        } else {
            ctx.report(metrics).map_err(|e| e.to_string())?;
        }
    }
    Ok(json!({"world_size": ctx.world_size(), "start": start}))
}

/// Reports `metrics` with a checkpoint of one file, `name`, holding `value` (made in a folder
/// of its own under `scratch`).
async fn hand_in(
    ctx: &TrainContext,
    metrics: serde_json::Map<String, Value>,
    scratch: &std::path::Path,
    name: &str,
    value: u64,
) -> Result<(), String> {
    let dir = scratch.join(format!("{name}-{value}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(name), value.to_string()).map_err(|e| e.to_string())?;
    ctx.report_checkpoint(metrics, &dir)
        .await
        .map_err(|e| e.to_string())
}

/// Reports once a second, rank 0 at once with a checkpoint and the other ranks 300 ms later,
/// so that each checkpoint is in flight for 300 ms; `steps` steps.
async fn staggered(ctx: TrainContext) -> Result<Value, String> {
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let steps = ctx.arg()["steps"].as_u64().unwrap_or(3);
    for step in 1..=steps {
        let metrics = json!({"step": step})
            .as_object()
            .cloned()
            .unwrap_or_default();
        if ctx.world_rank().0 == 0 {
            hand_in(&ctx, metrics, scratch.path(), "step", step).await?;
            tokio::time::sleep(Duration::from_millis(1000)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            ctx.report(metrics).map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
    }
    Ok(Value::Null)
}

fn cluster(nodes: impl IntoIterator<Item = SimNode>) -> SimRuntime {
    let functions = FunctionRegistry::new()
        .register("epochs", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            epochs(ctx).await
        })
        .register("staggered", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            staggered(ctx).await
        });
    SimRuntime::new(nodes).with_functions(functions)
}

/// A placement group of `cpus` CPUs that someone else holds on `sim`.
async fn hold(sim: &SimRuntime, cpus: u32) -> PlacementGroupId {
    let factory = PlacementGroupFactory {
        bundles: vec![format!("CPU={cpus}").parse().unwrap()],
        strategy: PlacementStrategy::Pack,
    };
    let pg = sim.create_placement_group(&factory).await.unwrap();
    sim.wait_placement_group_ready(pg, Duration::from_secs(1))
        .await
        .unwrap();
    pg
}

/// A fit of `scaling` on `sim` running `epochs` epochs, started in the background; its
/// events as they come.
fn start(
    sim: &SimRuntime,
    scaling: ScalingConfig,
    failures: FailureConfig,
    epochs: u64,
) -> (
    tokio::task::JoinHandle<Result<FitReport, ExecutorError>>,
    tokio::sync::mpsc::Receiver<RunEvent>,
    tempfile::TempDir,
) {
    let task = TaskSpec::function("epochs", json!({"epochs": epochs}));
    start_task(sim, scaling, failures, task)
}

/// A fit of `scaling` on `sim` running `task`, started in the background; its events as
/// they come.
fn start_task(
    sim: &SimRuntime,
    scaling: ScalingConfig,
    failures: FailureConfig,
    task: trainyard_runtime::TaskSpec,
) -> (
    tokio::task::JoinHandle<Result<FitReport, ExecutorError>>,
    tokio::sync::mpsc::Receiver<RunEvent>,
    tempfile::TempDir,
) {
    let storage = tempfile::tempdir().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(10_000);
    let run = RunConfig::default()
        .name("elastic")
        .storage_path(storage.path().display().to_string())
        .failure_config(failures);
    let executor = BackendExecutor {
        scaling,
        options: ExecutorOptions {
            restart_backoff: Backoff::NONE,
            ..ExecutorOptions::default()
        },
        run,
        events: Some(tx),
        ..BackendExecutor::new(Arc::new(sim.clone()))
    };
    let fit = tokio::spawn(async move { executor.fit(&task).await });
    (fit, rx, storage)
}

/// Takes events until one matches `wanted` (at most 10 s); all taken.
async fn until(
    rx: &mut tokio::sync::mpsc::Receiver<RunEvent>,
    wanted: impl Fn(&RunEvent) -> bool,
) -> Vec<RunEvent> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the event within 10 s")
            .expect("the run goes on");
        let found = wanted(&event);
        seen.push(event);
        if found {
            return seen;
        }
    }
}

async fn rest(
    fit: tokio::task::JoinHandle<Result<FitReport, ExecutorError>>,
    mut rx: tokio::sync::mpsc::Receiver<RunEvent>,
) -> (Result<FitReport, ExecutorError>, Vec<RunEvent>) {
    let result = tokio::time::timeout(Duration::from_secs(30), fit)
        .await
        .expect("the run ends within 30 s")
        .expect("the fit does not panic");
    let mut events = Vec::new();
    while let Ok(event) = rx.try_recv() {
        events.push(event);
    }
    (result, events)
}

fn committed(event: &RunEvent) -> bool {
    matches!(event, RunEvent::CheckpointCommitted { .. })
}

fn resizes(events: &[RunEvent]) -> Vec<(u32, u32, ResizeReason)> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Resized {
                from, to, reason, ..
            } => Some((*from, *to, *reason)),
            _ => None,
        })
        .collect()
}

fn started_sizes(events: &[RunEvent]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AttemptStarted { world_size, .. } => Some(*world_size),
            _ => None,
        })
        .collect()
}

fn elastic(range: std::ops::RangeInclusive<u32>) -> ScalingConfig {
    ScalingConfig::default()
        .num_workers(range)
        .resize_interval(Duration::from_millis(50))
}

#[tokio::test]
async fn a_run_starts_with_what_fits_and_grows_when_another_holder_leaves() {
    let sim = cluster([SimNode::new("node-0").cpus(4)]);
    let other = hold(&sim, 2).await;
    let (fit, mut rx, _storage) = start(&sim, elastic(1..=4), FailureConfig::default(), 20);
    let mut events = until(&mut rx, committed).await;
    assert_eq!(started_sizes(&events), [2], "two of four CPUs are free");
    sim.remove_placement_group(other).await.unwrap();
    let (result, more) = rest(fit, rx).await;
    events.extend(more);
    // A resize is no failure: the run's `max_failures` is 0.
    let report = result.expect("the run succeeds");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.world_sizes, [2, 4]);
    assert_eq!(started_sizes(&events), [2, 4]);
    assert_eq!(resizes(&events), [(2, 4, ResizeReason::RoomAppeared)]);
    // Every rank of the second attempt ran at four workers, from the checkpoint.
    assert_eq!(report.returns.len(), 4);
    for returned in &report.returns {
        assert_eq!(returned["world_size"], 4, "{returned}");
        assert!(returned["start"].as_u64() > Some(1), "{returned}");
    }
    // The resumed attempt carries on from the checkpoint the first one committed last.
    let resumed = events.iter().find_map(|e| match e {
        RunEvent::Resuming { checkpoint, .. } => Some(checkpoint.index),
        _ => None,
    });
    let start = report.returns[0]["start"].as_u64().unwrap();
    assert_eq!(resumed, Some(start - 1));
}

#[tokio::test]
async fn a_run_grows_when_a_node_joins() {
    let sim = cluster([SimNode::new("node-0").cpus(2)]);
    let scaling = elastic(2..=4).placement_strategy(PlacementStrategy::Spread);
    let (fit, mut rx, _storage) = start(&sim, scaling, FailureConfig::default(), 20);
    until(&mut rx, committed).await;
    sim.add_node(SimNode::new("node-1").cpus(2));
    let (result, events) = rest(fit, rx).await;
    let report = result.expect("the run succeeds");
    assert_eq!(report.world_sizes, [2, 4]);
    assert_eq!(resizes(&events), [(2, 4, ResizeReason::RoomAppeared)]);
    let nodes: std::collections::BTreeSet<String> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AttemptStarted { workers, .. } => Some(workers),
            _ => None,
        })
        .flatten()
        .map(|w| w.node_id.clone())
        .collect();
    assert_eq!(nodes.len(), 2, "the second attempt spreads over both nodes");
}

/// A `2..=4` run on two nodes of 2 CPUs under `failures`, one node lost after the first
/// checkpoint; how the run ended and its events.
async fn lose_a_node(failures: FailureConfig) -> (Result<FitReport, ExecutorError>, Vec<RunEvent>) {
    let nodes = [
        SimNode::new("node-0").cpus(2),
        SimNode::new("node-1").cpus(2),
    ];
    let sim = cluster(nodes);
    let (fit, mut rx, _storage) = start(&sim, elastic(2..=4), failures, 20);
    let events = until(&mut rx, committed).await;
    assert_eq!(started_sizes(&events), [4]);
    sim.lose_node(&NodeId::from("node-1"));
    rest(fit, rx).await
}

#[tokio::test]
async fn after_a_lost_node_the_run_goes_on_with_what_fits_and_counts_the_failure() {
    let (result, events) = lose_a_node(FailureConfig::restarts(1)).await;
    let report = result.expect("one restart is allowed");
    assert_eq!(report.failures.len(), 1, "the lost node is a failure");
    assert_eq!(report.world_sizes, [4, 2]);
    assert_eq!(resizes(&events), [(4, 2, ResizeReason::WorkersLost)]);
    assert!(report.returns.iter().all(|r| r["world_size"] == 2));
}

#[tokio::test]
async fn a_shrink_uses_up_max_failures_as_the_failure_would() {
    let (result, events) = lose_a_node(FailureConfig::default()).await;
    let Err(ExecutorError::TrainingFailed { report }) = result else {
        panic!("max_failures 0 allows no restart: {result:?}");
    };
    assert_eq!(report.world_sizes, [4]);
    assert!(resizes(&events).is_empty());
}

#[tokio::test]
async fn a_run_below_its_minimum_waits_for_it_and_a_fixed_run_never_resizes() {
    let sim = cluster([SimNode::new("node-0").cpus(4)]);
    let other = hold(&sim, 3).await;
    let (fit, mut rx, _storage) = start(&sim, elastic(2..=4), FailureConfig::default(), 20);
    let events = until(&mut rx, |e| matches!(e, RunEvent::Placing { .. })).await;
    assert!(matches!(
        events.last(),
        Some(RunEvent::Placing { bundles: 2, .. })
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    sim.remove_placement_group(other).await.unwrap();
    let (result, _) = rest(fit, rx).await;
    // It waited for two and then grew to four, or got four at once.
    let report = result.expect("the run succeeds");
    assert_eq!(report.world_sizes.first(), Some(&2));
    assert_eq!(report.world_sizes.last(), Some(&4));

    let fixed = ScalingConfig::default()
        .num_workers(2)
        .resize_interval(Duration::from_millis(50));
    let (fit, rx, _storage) = start(&sim, fixed, FailureConfig::default(), 5);
    let (result, events) = rest(fit, rx).await;
    assert_eq!(result.expect("the run succeeds").world_sizes, [2]);
    assert!(resizes(&events).is_empty());
}

#[tokio::test]
async fn a_resize_waits_for_the_checkpoint_in_flight_to_commit() {
    let sim = cluster([SimNode::new("node-0").cpus(4)]);
    let other = hold(&sim, 2).await;
    let task = TaskSpec::function("staggered", json!({"steps": 3}));
    let (fit, mut rx, _storage) = start_task(&sim, elastic(1..=4), FailureConfig::default(), task);
    // Rank 0 has handed in checkpoint 1; rank 1 reports it 300 ms later.
    until(
        &mut rx,
        |e| matches!(e, RunEvent::Report { rank, .. } if rank.0 == 0),
    )
    .await;
    sim.remove_placement_group(other).await.unwrap();
    let (result, events) = rest(fit, rx).await;
    assert_eq!(result.expect("the run succeeds").world_sizes, [2, 4]);
    let resumed = events.iter().find_map(|e| match e {
        RunEvent::Resuming { checkpoint, .. } => Some(checkpoint.index),
        _ => None,
    });
    assert_eq!(
        resumed,
        Some(1),
        "the resize waited for checkpoint 1 to commit"
    );
}
