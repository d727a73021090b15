//! Checkpoints on the simulated cluster: Rust function tasks hand in a checkpoint with every
//! epoch's report; restarts and later runs of the same name resume from the latest one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;

use serde_json::{Value, json};
use trainyard_backend_executor::{Backoff, ExecutorError, FitReport, RunEvent, TrainContext};
use trainyard_config::{CheckpointConfig, FailureConfig, ResumePolicy, RunConfig, ScoreOrder};
use trainyard_runtime::sim::SimRuntime;
use trainyard_runtime::{FunctionRegistry, TaskSpec};

/// What `epochs` is told to do, as its argument.
fn plan(epochs: u64, fail_at: Option<u64>, shared_name: bool) -> Value {
    json!({"epochs": epochs, "fail_at": fail_at, "shared_name": shared_name})
}

fn metrics(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().cloned().unwrap_or_default()
}

/// Trains `epochs` epochs from the checkpoint it is given (its `epoch` file), handing in a
/// shard per rank after each; in the first attempt, rank 1 fails after epoch `fail_at`. In
/// each of the first `crash_first` attempts rank 1 fails before anything else, or with
/// `after_epoch`, after its first epoch's report. Returns the epochs it ran.
async fn epochs(ctx: TrainContext) -> Result<Value, String> {
    let arg = ctx.arg().clone();
    let total = arg["epochs"].as_u64().unwrap_or(5);
    let fail_at = arg["fail_at"].as_u64();
    let rank = ctx.world_rank().0;
    let start = match ctx.checkpoint() {
        Some(dir) => {
            let text = std::fs::read_to_string(dir.join(format!("epoch_{rank}")))
                .map_err(|e| format!("cannot read the checkpoint in {}: {e}", dir.display()))?;
            text.trim().parse::<u64>().map_err(|e| e.to_string())? + 1
        }
        None => 1,
    };
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut ran = Vec::new();
    let in_storage = arg["in_storage"].as_bool() == Some(true);
    let crashes = arg["crash_first"]
        .as_u64()
        .is_some_and(|n| u64::from(ctx.restart_count()) < n)
        && rank == 1;
    let after_epoch = arg["after_epoch"].as_bool() == Some(true);
    if crashes && !after_epoch {
        return Err("rank 1 fails at once".to_owned());
    }
    for epoch in start..=total {
        ran.push(epoch);
        let dir = if in_storage {
            // Written into the run folder by the rank itself, as torch's distributed
            // checkpoint does; on `split_at`, rank 1 writes to a folder of its own.
            let name = if arg["split_at"].as_u64() == Some(epoch) && rank == 1 {
                format!("steps/epoch_{epoch}_rank_1")
            } else {
                format!("steps/epoch_{epoch}")
            };
            PathBuf::from(ctx.storage_path(&name).ok_or("the run has no storage")?)
        } else {
            scratch.path().join(format!("epoch-{epoch}"))
        };
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let file = if arg["shared_name"].as_bool() == Some(true) {
            "model.pt".to_owned()
        } else {
            format!("epoch_{rank}")
        };
        std::fs::write(dir.join(file), epoch.to_string()).map_err(|e| e.to_string())?;
        // Lower is better, and epoch 2 and 4 are the best.
        let loss = [0.0, 0.5, 0.1, 0.9, 0.2, 0.7][epoch as usize % 6];
        let reported = if arg["nested"].as_bool() == Some(true) {
            metrics(json!({"epoch": epoch, "val": {"loss": loss}}))
        } else {
            metrics(json!({"epoch": epoch, "loss": loss}))
        };
        if arg["async"].as_bool() == Some(true) {
            // Taken: the directory is gone when this returns.
            ctx.report_checkpoint_async(reported, &dir, true).await
        } else if in_storage {
            ctx.report_checkpoint_in_storage(reported, &dir.display().to_string())
                .await
        } else {
            ctx.report_checkpoint(reported, &dir).await
        }
        .map_err(|e| e.to_string())?;
        if dir.exists() == (arg["async"].as_bool() == Some(true)) {
            return Err(format!("{} was not taken as its mode says", dir.display()));
        }
        if arg["stale"].as_bool() == Some(true)
            && Some(epoch) == fail_at
            && ctx.restart_count() == 0
            && rank == 0
        {
            // Cut off from the driver, and still running after its attempt was replaced.
            tokio::spawn(stale_hand_in(ctx.clone(), epoch + 1));
            // Reports nothing more until the attempt is replaced.
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        if (Some(epoch) == fail_at && ctx.restart_count() == 0 || crashes) && rank == 1 {
            // The other rank reports the same epoch meanwhile.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return Err(format!("rank 1 fails after epoch {epoch}"));
        }
    }
    Ok(json!(ran))
}

/// Set once [`stale_hand_in`] has handed its checkpoint in (or given up).
static STALE_HANDED_IN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What a rank of an attempt that was replaced does when it goes on: once the attempt after
/// it has committed checkpoint `index` (the one this rank's next report belongs to), hands
/// in files of that index through its own task, `epoch_0` among them.
async fn stale_hand_in(ctx: TrainContext, index: u64) {
    let committed = PathBuf::from(
        ctx.storage_path(&format!("checkpoint_{index:06}"))
            .unwrap_or_default(),
    );
    for _ in 0..500 {
        if committed.is_dir() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let scratch = tempfile::tempdir().expect("tempdir");
    for file in ["epoch_0", "stale"] {
        std::fs::write(scratch.path().join(file), "stale").expect("a stale file");
    }
    let reported = metrics(json!({"epoch": index, "stale": true}));
    // Its report is refused by the driver, or never sent: only its files matter here.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        ctx.report_checkpoint(reported, scratch.path()),
    )
    .await;
    STALE_HANDED_IN.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn sim() -> SimRuntime {
    common::sim_serving(
        FunctionRegistry::new().register("epochs", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            epochs(ctx).await
        }),
    )
}

fn task(arg: Value) -> TaskSpec {
    TaskSpec::function("epochs", arg)
}

fn run_config(storage: &Path, name: &str) -> RunConfig {
    RunConfig::default()
        .name(name)
        .storage_path(storage.display().to_string())
}

async fn fit(
    sim: &SimRuntime,
    run: RunConfig,
    arg: Value,
) -> (Result<FitReport, ExecutorError>, Vec<RunEvent>) {
    common::fit_two(sim, run, &task(arg), None).await
}

fn ran(report: &FitReport) -> Vec<Vec<u64>> {
    report
        .returns
        .iter()
        .map(|r| {
            r.as_array()
                .expect("a list of epochs")
                .iter()
                .filter_map(Value::as_u64)
                .collect()
        })
        .collect()
}

fn committed(events: &[RunEvent]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::CheckpointCommitted { checkpoint } => Some(checkpoint.index),
            _ => None,
        })
        .collect()
}

fn run_json(storage: &Path, name: &str) -> Value {
    let text = std::fs::read_to_string(storage.join(name).join("run.json")).expect("run.json");
    serde_json::from_str(&text).expect("run.json is JSON")
}

fn checkpoint_dirs(storage: &Path, name: &str) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(storage.join(name))
        .expect("the run folder")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint_"))
        .collect();
    dirs.sort();
    dirs
}

/// Runs `name`: 5 epochs, rank 1 failing after epoch 3 in the first attempt, with `what` of
/// the plan set; the restart resumes both ranks at epoch 4, and every epoch is committed, in
/// order, before `fit` returns.
async fn restarted_once(name: &str, what: &str) -> (tempfile::TempDir, FitReport) {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = run_config(storage.path(), name).failure_config(FailureConfig::restarts(1));
    let mut arg = plan(5, Some(3), false);
    arg[what] = json!(true);
    let (result, events) = fit(&sim(), run, arg).await;
    let report = result.expect("the run succeeds after one restart");
    assert_eq!(ran(&report), vec![vec![4, 5], vec![4, 5]]);
    assert_eq!(committed(&events), vec![1, 2, 3, 4, 5]);
    (storage, report)
}

#[tokio::test]
async fn async_hand_ins_commit_every_epoch_in_order_before_the_run_ends() {
    // Handed in without waiting, committed all the same, the last one before fit returns.
    let (storage, report) = restarted_once("async", "async").await;
    assert_eq!(report.checkpoint.expect("a latest checkpoint").index, 5);
    let latest_dir = storage.path().join("async/checkpoint_000005");
    for rank in 0..2 {
        assert_eq!(
            std::fs::read_to_string(latest_dir.join(format!("epoch_{rank}"))).expect("shard"),
            "5"
        );
    }
}

#[tokio::test]
async fn checkpoints_written_into_the_run_folder_commit_where_they_are_and_resume_from_there() {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = run_config(storage.path(), "in-storage")
        .failure_config(FailureConfig::restarts(1))
        .checkpoint_config(CheckpointConfig::default().num_to_keep(2));
    let mut arg = plan(5, Some(3), false);
    arg["in_storage"] = json!(true);
    arg["split_at"] = json!(4);
    let (result, events) = fit(&sim(), run, arg).await;
    let report = result.expect("the run succeeds after one restart");
    assert_eq!(
        ran(&report),
        vec![vec![4, 5], vec![4, 5]],
        "resumed from epoch 3"
    );
    // Epoch 4's ranks wrote two folders: no folder holds all of it, so it is not committed.
    assert_eq!(committed(&events), vec![1, 2, 3, 5]);
    let latest = report.checkpoint.expect("a latest checkpoint");
    assert_eq!(latest.index, 5);
    assert!(
        latest.path.ends_with("in-storage/steps/epoch_5"),
        "{}",
        latest.path
    );
    let record = run_json(storage.path(), "in-storage");
    assert_eq!(record["attempts"][1]["resumed_from"], 3);
    let kept: Vec<(u64, String)> = record["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .map(|c| {
            (
                c["index"].as_u64().unwrap_or(0),
                c["dir"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kept,
        vec![
            (3, "steps/epoch_3".to_owned()),
            (5, "steps/epoch_5".to_owned())
        ]
    );
    assert_eq!(
        record["checkpoints"][1]["files"],
        json!(["epoch_0", "epoch_1"])
    );
    // Nothing was copied; the folders num_to_keep drops are deleted, the others kept.
    assert!(checkpoint_dirs(storage.path(), "in-storage").is_empty());
    let steps = storage.path().join("in-storage/steps");
    for gone in ["epoch_1", "epoch_2"] {
        assert!(!steps.join(gone).exists(), "{gone} is beyond num_to_keep");
    }
    for kept in ["epoch_3", "epoch_5"] {
        assert!(steps.join(kept).join("epoch_1").is_file(), "{kept}");
    }
}

#[tokio::test]
async fn a_restart_resumes_every_rank_from_the_latest_committed_checkpoint() {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = run_config(storage.path(), "restart").failure_config(FailureConfig::restarts(1));
    let (result, events) = fit(&sim(), run, plan(5, Some(3), false)).await;
    let report = result.expect("the run succeeds after one restart");
    assert_eq!(report.attempts, 2);
    assert_eq!(
        ran(&report),
        vec![vec![4, 5], vec![4, 5]],
        "both ranks resume at epoch 4"
    );
    let resumed: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Resuming { checkpoint, .. } => Some(checkpoint.index),
            _ => None,
        })
        .collect();
    assert_eq!(resumed, vec![3]);
    assert_eq!(committed(&events), vec![1, 2, 3, 4, 5]);
    let latest = report.checkpoint.expect("a latest checkpoint");
    assert_eq!(latest.index, 5);
    assert!(
        latest.path.ends_with("restart/checkpoint_000005"),
        "{}",
        latest.path
    );
    assert_eq!(latest.metrics["epoch"], 5);
    let record = run_json(storage.path(), "restart");
    assert_eq!(record["status"], "finished");
    assert_eq!(record["latest_checkpoint"], 5);
    assert_eq!(record["attempts"].as_array().map(Vec::len), Some(2));
    assert_eq!(record["attempts"][1]["resumed_from"], 3);
    // Both ranks' shards are in the one folder.
    let latest_dir = storage.path().join("restart/checkpoint_000005");
    for rank in 0..2 {
        assert_eq!(
            std::fs::read_to_string(latest_dir.join(format!("epoch_{rank}"))).expect("shard"),
            "5"
        );
    }
}

#[tokio::test]
async fn a_later_run_of_the_same_name_resumes_and_a_finished_one_is_refused() {
    let storage = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    // No restarts: the run fails after epoch 2 is committed.
    let (first, _) = fit(
        &sim,
        run_config(storage.path(), "later"),
        plan(4, Some(2), false),
    )
    .await;
    match first {
        Err(ExecutorError::TrainingFailed { report }) => {
            assert_eq!(report.checkpoint.map(|c| c.index), Some(2));
        }
        other => panic!("expected the first run to fail, got {other:?}"),
    }
    assert_eq!(run_json(storage.path(), "later")["status"], "failed");
    let (second, events) = fit(
        &sim,
        run_config(storage.path(), "later"),
        plan(4, None, false),
    )
    .await;
    let report = second.expect("the second run resumes and succeeds");
    assert_eq!(ran(&report), vec![vec![3, 4], vec![3, 4]]);
    assert_eq!(committed(&events), vec![3, 4]);
    assert_eq!(
        run_json(storage.path(), "later")["attempts"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    let (third, _) = fit(
        &sim,
        run_config(storage.path(), "later"),
        plan(4, None, false),
    )
    .await;
    match third {
        Err(error @ ExecutorError::RunFinished { .. }) => {
            let text = error.to_string();
            assert!(
                text.contains("`later`")
                    && text.contains("--resume never")
                    && text.contains("--resume always"),
                "{text}"
            );
        }
        other => panic!("expected a finished run to be refused, got {other:?}"),
    }
    let afresh = run_config(storage.path(), "later").resume(ResumePolicy::Never);
    let (fourth, _) = fit(&sim, afresh, plan(2, None, false)).await;
    let report = fourth.expect("a fresh start in a new folder");
    assert_eq!(ran(&report), vec![vec![1, 2], vec![1, 2]]);
    assert!(
        report
            .run_dir
            .as_deref()
            .is_some_and(|d| d.ends_with("later-2")),
        "{:?}",
        report.run_dir
    );
}

#[tokio::test]
async fn retention_keeps_the_two_best_by_score_and_the_latest() {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = run_config(storage.path(), "keep").checkpoint_config(
        CheckpointConfig::default()
            .num_to_keep(2)
            .score("loss", ScoreOrder::Min),
    );
    let (result, _) = fit(&sim(), run, plan(5, None, false)).await;
    let report = result.expect("the run succeeds");
    // Losses by epoch: 0.5, 0.1, 0.9, 0.2, 0.7: the best are 2 and 4; 5 is the latest.
    assert_eq!(
        checkpoint_dirs(storage.path(), "keep"),
        [
            "checkpoint_000002",
            "checkpoint_000004",
            "checkpoint_000005"
        ]
    );
    let best: Vec<u64> = report.best_checkpoints.iter().map(|c| c.index).collect();
    assert_eq!(best, vec![2, 4, 5]);
    let kept: Vec<u64> = run_json(storage.path(), "keep")["checkpoints"]
        .as_array()
        .expect("checkpoints")
        .iter()
        .filter_map(|c| c["index"].as_u64())
        .collect();
    assert_eq!(kept, vec![2, 4, 5]);
}

#[tokio::test]
async fn a_nested_score_attribute_ranks_and_keeps_checkpoints_and_the_record_keeps_it() {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = run_config(storage.path(), "nested").checkpoint_config(
        CheckpointConfig::default()
            .num_to_keep(2)
            .score("val/loss", ScoreOrder::Min),
    );
    let mut arg = plan(5, None, false);
    arg["nested"] = json!(true);
    let (result, _) = fit(&sim(), run, arg).await;
    let report = result.expect("the run succeeds");
    // Losses by epoch: 0.5, 0.1, 0.9, 0.2, 0.7 under `val`: the best are 2 and 4.
    let best: Vec<u64> = report.best_checkpoints.iter().map(|c| c.index).collect();
    assert_eq!(best, vec![2, 4, 5]);
    assert_eq!(
        checkpoint_dirs(storage.path(), "nested"),
        [
            "checkpoint_000002",
            "checkpoint_000004",
            "checkpoint_000005"
        ]
    );
    // A later reader ranks them as the run did.
    let record = run_json(storage.path(), "nested");
    assert_eq!(
        record["score"],
        json!({"attribute": "val/loss", "order": "min"})
    );
    let record: trainyard_checkpoint::RunRecord = serde_json::from_value(record).expect("a record");
    let ranked: Vec<u64> = record.best().iter().map(|c| c.index).collect();
    assert_eq!(ranked, vec![2, 4, 5]);
}

#[tokio::test]
async fn a_finished_run_run_again_with_resume_always_trains_on_from_its_latest_checkpoint() {
    let storage = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let again = || run_config(storage.path(), "more").resume(ResumePolicy::Always);
    let (first, _) = fit(&sim, again(), plan(3, None, false)).await;
    assert_eq!(
        ran(&first.expect("the first run succeeds")),
        vec![vec![1, 2, 3]; 2]
    );
    assert_eq!(run_json(storage.path(), "more")["status"], "finished");

    // "Train 2 more epochs": the same run, asked for 5.
    let (second, events) = fit(&sim, again(), plan(5, None, false)).await;
    let report = second.expect("the finished run resumes and succeeds");
    assert_eq!(ran(&report), vec![vec![4, 5]; 2]);
    assert_eq!(committed(&events), vec![4, 5]);
    assert_eq!(report.checkpoint.as_ref().map(|c| c.index), Some(5));
    let best: Vec<u64> = report.best_checkpoints.iter().map(|c| c.index).collect();
    assert_eq!(best, vec![5, 4, 3, 2, 1], "the indices go on");
    assert!(
        report
            .run_dir
            .as_deref()
            .is_some_and(|d| d.ends_with("/more")),
        "{:?}",
        report.run_dir
    );
    let record = run_json(storage.path(), "more");
    assert_eq!(record["status"], "finished");
    let attempts = record["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{record}");
    assert_eq!(attempts[1]["resumed_from"], 3);
    assert_eq!(record["latest_checkpoint"], 5);
}

#[tokio::test]
async fn ranks_writing_one_file_name_commit_one_copy_of_it() {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = run_config(storage.path(), "shared").failure_config(FailureConfig::restarts(3));
    let (result, events) = fit(&sim(), run, plan(2, None, true)).await;
    let report = result.expect("the run succeeds");
    assert_eq!(report.attempts, 1);
    assert_eq!(committed(&events), vec![1, 2]);
    let checkpoints = run_json(storage.path(), "shared")["checkpoints"].clone();
    for checkpoint in checkpoints.as_array().expect("checkpoints") {
        assert_eq!(checkpoint["files"], json!(["model.pt"]), "{checkpoint}");
    }
    let kept = storage.path().join("shared/checkpoint_000002/model.pt");
    assert_eq!(std::fs::read_to_string(kept).expect("model.pt"), "2");
}

#[tokio::test]
async fn a_vanished_checkpoint_is_an_error_naming_it_not_a_fresh_start() {
    let storage = tempfile::tempdir().expect("tempdir");
    let sim = sim();
    let (first, _) = fit(
        &sim,
        run_config(storage.path(), "gone"),
        plan(3, Some(2), false),
    )
    .await;
    assert!(first.is_err());
    let dir = storage.path().join("gone/checkpoint_000002");
    std::fs::remove_dir_all(&dir).expect("remove the checkpoint");
    let (second, events) = fit(
        &sim,
        run_config(storage.path(), "gone"),
        plan(3, None, false),
    )
    .await;
    let error = second.expect_err("a vanished checkpoint is an error");
    let text = trainyard_config::resources::ErrorChain(&error).to_string();
    assert!(text.contains("checkpoint_000002"), "{text}");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, RunEvent::AttemptStarted { .. })),
        "no worker starts"
    );
}

#[tokio::test]
async fn unwritable_storage_fails_before_any_worker_starts() {
    let file = tempfile::NamedTempFile::new().expect("a file");
    // A folder below a regular file can never be created, not even by root.
    let storage = file.path().join("runs");
    let (result, events) = fit(
        &sim(),
        run_config(&storage, "nowhere"),
        plan(1, None, false),
    )
    .await;
    let error = result.expect_err("unwritable storage is an error");
    assert!(matches!(error, ExecutorError::Storage(_)), "{error:?}");
    let text = trainyard_config::resources::ErrorChain(&error).to_string();
    assert!(text.contains(&storage.display().to_string()), "{text}");
    // Nothing started: the run's end is its one event.
    assert!(
        matches!(
            events.as_slice(),
            [RunEvent::RunFailed { report: None, .. }]
        ),
        "{events:?}"
    );
}

/// The wait before each restart, in milliseconds.
fn waits(events: &[RunEvent]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::Restarting { backoff_ms, .. } => Some(*backoff_ms),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_failure_after_a_committed_checkpoint_restarts_at_once_and_a_crash_loop_waits() {
    let backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(20),
    };
    for (after_epoch, expected) in [(true, [0, 0, 0]), (false, [0, 100, 200])] {
        let storage = tempfile::tempdir().expect("a temporary folder");
        let run = run_config(storage.path(), "loop").failure_config(FailureConfig::restarts(3));
        let arg = json!({"epochs": 5, "crash_first": 3, "after_epoch": after_epoch});
        let (result, events) =
            common::fit_two_on(std::sync::Arc::new(sim()), run, &task(arg), None, backoff).await;
        let report = result.expect("the run succeeds after three restarts");
        assert_eq!(report.attempts, 4);
        assert_eq!(waits(&events), expected, "after an epoch: {after_epoch}");
    }
}

#[tokio::test]
async fn a_replaced_attempt_s_hand_in_after_the_restart_leaves_the_committed_checkpoint_alone() {
    let (storage, _) = restarted_once("fenced", "stale").await;
    for _ in 0..1000 {
        if STALE_HANDED_IN.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        STALE_HANDED_IN.load(std::sync::atomic::Ordering::SeqCst),
        "the stale rank handed its checkpoint in"
    );
    // Exactly the second attempt's files: the stale rank's went to its attempt's staging.
    let dir = storage.path().join("fenced/checkpoint_000004");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("checkpoint 4")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["epoch_0", "epoch_1"]);
    for file in files {
        assert_eq!(
            std::fs::read_to_string(dir.join(&file)).expect("a shard"),
            "4",
            "{file}"
        );
    }
    assert_eq!(checkpoint_dirs(storage.path(), "fenced").len(), 5);
}
