//! Hung ranks on the simulated cluster: a rank without progress for the hang timeout fails
//! the attempt with every rank's stacks captured first, and the run restarts; stacks asked
//! for on demand stop nothing; every rank's output lands in a log file per attempt.

use std::path::Path;
use std::time::Duration;

use crate::common;

use serde_json::{Value, json};
use trainyard_backend_executor::{
    AttemptFailure, ExecutorError, FitReport, RunEvent, StacksReason, StacksTrigger, TrainContext,
    WorldRank,
};
use trainyard_config::{FailureConfig, ProgressSource, RunConfig};
use trainyard_runtime::sim::SimRuntime;
use trainyard_runtime::{FunctionRegistry, TaskSpec};

/// Runs `steps` steps 20 ms apart, each reported (or, with `"print": true`, printed only).
/// In the first attempt, rank `stall_rank` stops after `stall_after` steps and waits forever.
async fn steps(ctx: TrainContext) -> Result<Value, String> {
    let arg = ctx.arg().clone();
    let steps = arg["steps"].as_u64().unwrap_or(5);
    let stall_rank = arg["stall_rank"].as_u64();
    let stall_after = arg["stall_after"].as_u64().unwrap_or(0);
    let print_only = arg["print"].as_bool() == Some(true);
    let rank = u64::from(ctx.world_rank().0);
    for step in 1..=steps {
        if stall_rank == Some(rank) && ctx.restart_count() == 0 && step > stall_after {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        ctx.print(format!("rank {rank} step {step}"));
        if !print_only {
            ctx.report(json!({"step": step}))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(json!(steps))
}

fn sim() -> SimRuntime {
    common::sim_serving(
        FunctionRegistry::new().register("steps", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            steps(ctx).await
        }),
    )
}

fn task(arg: Value) -> TaskSpec {
    TaskSpec::function("steps", arg)
}

fn run_config(storage: &Path, name: &str) -> RunConfig {
    RunConfig::default()
        .name(name)
        .storage_path(storage.display().to_string())
        .hang_timeout(Duration::from_millis(400))
}

async fn fit(
    run: RunConfig,
    arg: Value,
    trigger: Option<StacksTrigger>,
) -> (Result<FitReport, ExecutorError>, Vec<RunEvent>) {
    common::fit_two(&sim(), run, &task(arg), trigger).await
}

fn stacks_events(events: &[RunEvent]) -> Vec<(StacksReason, Vec<String>, Option<String>)> {
    events
        .iter()
        .filter_map(|event| match event {
            RunEvent::Stacks {
                reason,
                ranks,
                file,
            } => Some((
                *reason,
                ranks.iter().map(|r| r.summary()).collect(),
                file.clone(),
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_rank_without_reports_hangs_the_attempt_and_the_run_restarts() {
    let storage = tempfile::tempdir().unwrap();
    let run = run_config(storage.path(), "hung").failure_config(FailureConfig::restarts(1));
    let arg = json!({"steps": 5, "stall_rank": 1, "stall_after": 2});
    let (result, events) = fit(run, arg, None).await;
    let report = result.expect("the second attempt succeeds");
    assert_eq!(report.attempts, 2);
    let [
        AttemptFailure::Hung {
            ranks,
            idle_ms,
            stacks_file,
        },
    ] = report.failures.as_slice()
    else {
        panic!("one hang expected: {:?}", report.failures);
    };
    assert_eq!(ranks, &[WorldRank(1)], "only rank 1 stalled");
    assert!(*idle_ms >= 400, "{idle_ms}");
    let shown = stacks_events(&events);
    assert_eq!(shown.len(), 1, "{shown:?}");
    let (reason, lines, file) = &shown[0];
    assert_eq!(*reason, StacksReason::Hung);
    assert_eq!(lines.len(), 2, "every rank's stacks: {lines:?}");
    assert!(lines[1].starts_with("rank 1: pid "), "{lines:?}");
    assert!(
        lines[1].contains("steps"),
        "the sim names the function: {lines:?}"
    );
    let file = file.as_deref().expect("the dump is written");
    assert_eq!(stacks_file.as_deref(), Some(file));
    let message = AttemptFailure::Hung {
        ranks: ranks.clone(),
        idle_ms: 400,
        stacks_file: None,
    }
    .to_string();
    assert_eq!(message, "rank 1 made no progress for 0.4 s");
    // The dump is beside the first attempt's rank logs; each attempt has its own folder.
    let logs = storage.path().join("hung/logs");
    let dump = std::fs::read_to_string(file).expect("the dump file exists");
    assert!(
        dump.contains("=== rank 1 ===") && dump.contains("steps"),
        "{dump}"
    );
    assert!(
        Path::new(file).starts_with(logs.join("attempt_0")),
        "{file}"
    );
    let first = std::fs::read_to_string(logs.join("attempt_0/rank_1.log")).unwrap();
    let lines: Vec<&str> = first.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "rank 1 printed two steps before stalling: {first}"
    );
    assert!(lines[0].ends_with(" stdout rank 1 step 1"), "{first}");
    // A timestamp leads every line: 2026-12-01T18:00:00.123Z.
    assert!(
        lines[0].chars().nth(4) == Some('-') && lines[0].contains('T'),
        "{first}"
    );
    let second = std::fs::read_to_string(logs.join("attempt_1/rank_1.log")).unwrap();
    assert_eq!(second.lines().count(), 5, "{second}");
    assert_eq!(
        report.log_dir.as_deref(),
        Some(logs.join("attempt_1").display().to_string().as_str())
    );
}

#[tokio::test]
async fn a_hang_beyond_max_failures_fails_the_run() {
    let storage = tempfile::tempdir().unwrap();
    let run = run_config(storage.path(), "hung-once");
    let arg = json!({"steps": 5, "stall_rank": 0, "stall_after": 0});
    let (result, _) = fit(run, arg, None).await;
    let Err(ExecutorError::TrainingFailed { report }) = result else {
        panic!("the run fails: {result:?}");
    };
    assert!(
        matches!(report.failures.as_slice(), [AttemptFailure::Hung { ranks, .. }] if ranks == &[WorldRank(0)]),
        "{:?}",
        report.failures
    );
}

#[tokio::test]
async fn output_counts_as_progress_only_when_asked() {
    let storage = tempfile::tempdir().unwrap();
    // 30 steps of 20 ms printed, never reported: 600 ms with a 400 ms timeout.
    let arg = json!({"steps": 30, "print": true});
    let run = run_config(storage.path(), "printing").progress(ProgressSource::Output);
    let (result, _) = fit(run, arg.clone(), None).await;
    assert!(result.is_ok(), "lines are progress: {result:?}");
    let run = run_config(storage.path(), "silent");
    let (result, _) = fit(run, arg, None).await;
    assert!(
        matches!(&result, Err(ExecutorError::TrainingFailed { report })
            if matches!(report.failures.as_slice(), [AttemptFailure::Hung { ranks, .. }] if ranks.len() == 2)),
        "lines are not reports: {result:?}"
    );
}

#[tokio::test]
async fn stacks_asked_for_are_shown_and_the_run_goes_on() {
    let storage = tempfile::tempdir().unwrap();
    let run = RunConfig::default()
        .name("asked")
        .storage_path(storage.path().display().to_string());
    let trigger = StacksTrigger::new();
    let asking = trigger.clone();
    let ask = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        asking.request();
    });
    let (result, events) = fit(run, json!({"steps": 25}), Some(trigger)).await;
    ask.await.unwrap();
    let report = result.expect("the run succeeds");
    assert_eq!(report.attempts, 1);
    let shown = stacks_events(&events);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].0, StacksReason::Requested);
    assert_eq!(shown[0].1.len(), 2);
    assert!(shown[0].2.is_some(), "the dump is written");
}
