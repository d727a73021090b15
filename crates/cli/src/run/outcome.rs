//! How a run ended, said: its result on stderr (in JSON, its last event on stdout), the launch
//! timings, and the exit code each ending maps to.

use trainyard::backend::timings::{Timings, TimingsHandle};
use trainyard::backend::{AttemptFailure, ExecutorError};
use trainyard::resources::Resources;
use trainyard::runtime::placement::PlacementError;
use trainyard::runtime::{RuntimeError, TaskRejection};

use super::drive::Ended;
use crate::args::{LogFormat, RunArgs, RuntimeKind};
use crate::print::{log_file_note, print_json};
use crate::{EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_UNSCHEDULABLE, Failure};

/// Says how the run ended, after where its launch went (`--timings`): `Ok` when it
/// succeeded, else the failure with its exit code. `worker` is what each of the run's
/// `workers` asked for.
pub(super) fn render(
    ended: Ended,
    args: &RunArgs,
    timings: Option<&TimingsHandle>,
    worker: &Resources,
    workers: u32,
) -> Result<(), Failure> {
    let Ended {
        outcome,
        interrupted,
        started,
        ..
    } = ended;
    if let Some(timings) = timings {
        print_timings(&timings.report(), args.log_format);
    }
    if interrupted {
        return Err(interrupted_run(outcome, args));
    }
    match outcome {
        None => Err(Failure::interrupted()),
        Some(Ok(result)) => {
            if args.log_format == LogFormat::Text {
                say!(
                    "trainyard: the run succeeded in {:.2}s ({} attempt{})",
                    started.elapsed().as_secs_f64(),
                    result.attempts,
                    if result.attempts == 1 { "" } else { "s" }
                );
                print_checkpoints(&result);
            }
            Ok(())
        }
        Some(Err(error)) => {
            let hint = refusal_hint(&error, args, worker, workers);
            let failure = failure_of(error, args);
            Err(match hint {
                Some(hint) => failure.with_hint(hint),
                None => failure,
            })
        }
    }
}

/// What to change when a local run is refused for want of CPUs: each worker asks for a whole
/// CPU unless told otherwise, which a torchrun user does not expect.
fn refusal_hint(
    error: &trainyard::Error,
    args: &RunArgs,
    worker: &Resources,
    workers: u32,
) -> Option<String> {
    let trainyard::Error::Executor(ExecutorError::Unschedulable(cause)) = error else {
        return None;
    };
    let RuntimeError::Infeasible(placement) = cause.as_ref() else {
        return None;
    };
    if args.runtime != RuntimeKind::Local || placement.resource() != Some("CPU") {
        return None;
    }
    let asked = worker.get("CPU").unwrap_or_default();
    let workers = f64::from(workers.max(1));
    let has = match placement {
        PlacementError::ClusterTooSmall { total, .. } => total.as_f64(),
        PlacementError::BundleTooLarge { best, .. }
        | PlacementError::GroupTooLargeForOneNode { best, .. } => best.as_f64(),
        _ => return None,
    };
    // The most each worker may ask for so that all fit, rounded down to a hundredth.
    let share = (has / workers * 100.0).floor() / 100.0;
    let less = if share >= 0.01 && share < asked.as_f64() {
        format!("ask for less with -r CPU={share}, ")
    } else {
        String::new()
    };
    Some(format!(
        "each worker asks for {asked} CPU{}: {less}or let the workers share more CPUs than this machine has with --num-cpus {}",
        if asked.as_f64() == 1.0 { "" } else { "s" },
        (asked.as_f64() * workers).ceil()
    ))
}

/// Where the launch went (`--timings`): a table on stderr, or a `timings` event.
fn print_timings(timings: &Timings, format: LogFormat) {
    match format {
        LogFormat::Json => print_json(&serde_json::json!({
            "event": "timings",
            "attempts": timings.attempts,
        })),
        LogFormat::Text => {
            for line in timings.to_string().lines() {
                say!("{line}");
            }
        }
    }
}

/// The run's last metrics, its folder and its latest checkpoint, as the last lines of a text
/// run.
fn print_checkpoints(report: &trainyard::FitReport) {
    if let Some(line) = last_metrics(report) {
        say!("trainyard: {line}");
    }
    if let Some(dir) = &report.run_dir {
        say!("trainyard: run folder: {dir}");
    }
    if let Some(checkpoint) = &report.checkpoint {
        say!("trainyard: latest checkpoint: {}", checkpoint.path);
    }
}

/// `last report (rank 0): loss=0.21 epoch=3`: rank 0's last metrics in the final attempt, or
/// the last report of any rank when rank 0 sent none.
fn last_metrics(report: &trainyard::FitReport) -> Option<String> {
    let (rank, metrics) = match report.metrics.first() {
        Some(Some(metrics)) => (0, metrics),
        _ => {
            let (rank, metrics) = report.last_report.as_ref()?;
            (rank.0, metrics)
        }
    };
    Some(format!(
        "last report (rank {rank}): {}",
        crate::print::metrics_text(metrics)
    ))
}

/// How an interrupted run ends (its `run_interrupted` event went to the reporters): in text its
/// last metrics and checkpoint; exit 130.
fn interrupted_run(
    outcome: Option<Result<trainyard::FitReport, trainyard::Error>>,
    args: &RunArgs,
) -> Failure {
    let report = match outcome {
        Some(Err(trainyard::Error::Executor(
            ExecutorError::Interrupted { report } | ExecutorError::TrainingFailed { report },
        ))) => Some(*report),
        Some(Ok(report)) => Some(report),
        _ => None,
    };
    if let (LogFormat::Text, Some(report)) = (args.log_format, &report) {
        print_checkpoints(report);
        print_resume_hint(report, args);
    }
    Failure::interrupted()
}

/// How to go on with a run that did not finish, once it has a checkpoint: the same command,
/// with the name of the run's folder when the run was not given one.
fn print_resume_hint(report: &trainyard::FitReport, args: &RunArgs) {
    if report.checkpoint.is_none() {
        return;
    }
    let folder = report
        .run_dir
        .as_deref()
        .and_then(|dir| dir.trim_end_matches('/').rsplit('/').next())
        .filter(|name| !name.is_empty());
    match (&args.name, folder) {
        (None, Some(name)) => say!(
            "trainyard: the same command with --name {name} (and the same --storage) resumes from it"
        ),
        _ => say!("trainyard: the same command (same --name and --storage) resumes from it"),
    }
}

/// What ended the final attempt, in the program's words: the first rank to fail by time,
/// its exception and where it was raised, its traceback's last lines, and its log file.
fn print_root_cause(report: &trainyard::FitReport, args: &RunArgs) {
    /// How many of the traceback's last lines are shown (the log file keeps them all).
    const TRACEBACK_LINES: usize = 12;
    let Some(failure) = report.failures.last() else {
        return;
    };
    if let AttemptFailure::TaskFailed {
        rank,
        error: Some(error),
        ..
    } = failure
    {
        let source = match error.source {
            trainyard::runtime::root_cause::ErrorSource::ErrorFile => "its error file",
            trainyard::runtime::root_cause::ErrorSource::Output => "its output",
        };
        say!("trainyard: root cause: rank {rank} failed first, with {error} (from {source})");
        let skip = error.traceback.len().saturating_sub(TRACEBACK_LINES);
        for line in &error.traceback[skip..] {
            say!("  (rank={rank}) {line}");
        }
    }
    if let AttemptFailure::TaskFailed {
        rank, left_before, ..
    } = failure
    {
        if let [first, ..] = left_before.as_slice() {
            say!(
                "trainyard: rank {first} had already exited with code 0 before rank {rank} failed: a rank that leaves while its peers still run collectives breaks them (uneven inputs?)"
            );
        }
    }
    let note = log_file_note(failure, report.log_dir.as_deref());
    if let Some(file) = note.strip_prefix("; its output: ") {
        if let Some(rank) = failure.rank() {
            say!("trainyard: rank {rank}'s output: {file}");
        }
    }
    if let (Some(limit), Some(rank)) = (failure.memory_limit(), failure.rank()) {
        if args.runtime == RuntimeKind::Slurm && asked_no_memory(args) {
            say!(
                "trainyard: rank {rank} asked for no memory, so its Slurm step had what the job got by default ({}: the partition's DefMemPerCPU for each of its CPUs): ask for what a worker needs with -r memory=<size>",
                trainyard::resources::ByteSize::new(limit).human()
            );
        }
    }
}

/// Whether the workers asked for no memory on the command line (a `--config` file may have
/// asked: then this cannot tell).
fn asked_no_memory(args: &RunArgs) -> bool {
    args.scaling.config.is_none()
        && args
            .scaling
            .resources_per_worker
            .as_ref()
            .is_none_or(|resources| resources.amount("memory").is_zero())
}

/// `line` without the `[rank1]: ` that torch puts before what a rank prints.
fn without_rank_prefix(line: &str) -> &str {
    line.strip_prefix("[rank")
        .and_then(|rest| rest.split_once("]: "))
        .filter(|(rank, _)| rank.chars().all(|c| c.is_ascii_digit()))
        .map_or(line, |(_, text)| text)
}

/// The exit code and message of a failed run; the failed rank's last lines go to stderr
/// first.
fn failure_of(error: trainyard::Error, args: &RunArgs) -> Failure {
    let format = args.log_format;
    if format == LogFormat::Text {
        if let trainyard::Error::Executor(ExecutorError::TrainingFailed { report }) = &error {
            print_root_cause(report, args);
            print_checkpoints(report);
            print_resume_hint(report, args);
        }
    }
    let code = match &error {
        trainyard::Error::Config(_)
        | trainyard::Error::Resources(_)
        | trainyard::Error::Executor(
            ExecutorError::Storage(_)
            | ExecutorError::RunFinished { .. }
            | ExecutorError::RunInUse { .. }
            | ExecutorError::RunInUseElsewhere { .. },
        ) => EXIT_BAD_INPUT,
        trainyard::Error::Executor(
            ExecutorError::Unschedulable(_) | ExecutorError::PlacementTimeout { .. },
        ) => EXIT_UNSCHEDULABLE,
        trainyard::Error::Executor(ExecutorError::Interrupted { .. }) => crate::EXIT_INTERRUPTED,
        trainyard::Error::Executor(ExecutorError::TrainingFailed { report }) => {
            match report.failures.last() {
                Some(AttemptFailure::TaskFailed {
                    rank,
                    last_lines,
                    error: cause,
                    ..
                }) if format == LogFormat::Text => {
                    // The traceback of the root cause is shown above: its lines are not
                    // shown again.
                    let shown = cause
                        .as_ref()
                        .map(|c| c.traceback.as_slice())
                        .unwrap_or(&[]);
                    let rest: Vec<&String> = last_lines
                        .iter()
                        .filter(|line| !shown.contains(&without_rank_prefix(line).to_owned()))
                        .collect();
                    if !rest.is_empty() {
                        say!("trainyard: the last lines of rank {rank}:");
                        for line in rest {
                            say!("  (rank={rank}) {line}");
                        }
                    }
                    EXIT_FAILURE
                }
                Some(AttemptFailure::TaskRejected {
                    rejection:
                        TaskRejection::ProgramNotFound { .. }
                        | TaskRejection::NotExecutable { .. }
                        | TaskRejection::UnknownFunction { .. },
                    ..
                }) => EXIT_BAD_INPUT,
                _ => EXIT_FAILURE,
            }
        }
        _ => EXIT_FAILURE,
    };
    Failure::new(code, error)
}
