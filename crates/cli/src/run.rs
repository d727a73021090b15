//! `trainyard run`: start one worker per bundle on the local runtime, run a program on each
//! with its rank and its framework's environment, stream their output, and stop everything
//! on failure or interruption.

use std::time::{Duration, Instant};

use std::collections::{BTreeMap, BTreeSet};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tracing::Instrument as _;
use trainyard::backend::timings::{Timings, TimingsHandle};
use trainyard::backend::{
    AttemptFailure, ExecutorError, ExecutorOptions, NoBackend, StacksTrigger, StopTrigger,
    unique_run_name,
};
use trainyard::local::LocalRuntime;
use trainyard::resources::Resources;
use trainyard::runtime::placement::PlacementError;
use trainyard::runtime::timings as phase;
use trainyard::runtime::{RuntimeError, TaskRejection};
use trainyard::{Trainer, command_task};
use trainyard_config::{CheckpointConfig, FailureConfig, RunConfig};

use crate::args::{
    BackendKind, LogFormat, RunArgs, RuntimeKind, reserved_env_error, shared_accelerator_error,
};
use crate::engine::Engine;
use crate::output::{Progress, init_logging};
use crate::print::{Shown, log_file_note, print_events, print_json};
use crate::values::FlagError;
use crate::{EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_UNSCHEDULABLE, Failure};

/// How many run events wait for the printer before output lines are dropped (and counted).
const EVENT_BUFFER: usize = 4096;

/// How long stopping the workers may take after an interruption before the driver gives up
/// waiting (its own exit still kills them).
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// How long the printer may take to write what the run streamed, once the run has ended.
const PRINTER_DRAIN: Duration = Duration::from_secs(30);

/// How long the driver waits, as it exits, for work left on its blocking threads.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(10);

/// The RUN flags turned into the run's configuration; `reserved` are the variables that
/// trainyard sets on every worker, which `--env` cannot set.
fn run_config(
    args: &RunArgs,
    reserved: &BTreeMap<&'static str, &'static str>,
) -> Result<RunConfig, Failure> {
    let mut run = RunConfig::default();
    if let Some(n) = args.max_failures {
        run.failure_config = FailureConfig::from_max_failures(n).map_err(Failure::bad_input)?;
    }
    for (key, value) in &args.env {
        if let Some(error) = reserved_env_error(&format!("{key}={value}"), key, reserved) {
            return Err(Failure::bad_input(error));
        }
        run.env.insert(key.clone(), value.clone());
    }
    run.name.clone_from(&args.name);
    run.storage_path = args
        .storage
        .clone()
        .or_else(|| std::env::var("TRAINYARD_STORAGE").ok())
        .filter(|s| !s.is_empty());
    if let Some(storage) = &run.storage_path {
        storage
            .parse::<trainyard::checkpoint::StorageLocation>()
            .map_err(|e| Failure::bad_input(FlagError::new("--storage", storage)(e.into())))?;
    }
    run.resume = args.resume;
    run.checkpoint_config = checkpoint_config(args);
    run.hang_timeout = args.hang_timeout;
    run.progress = args.progress;
    run.log_dir = args.log_dir.as_ref().map(|d| d.display().to_string());
    if let Some(name) = &args.name {
        run.validate()
            .map_err(|e| Failure::bad_input(FlagError::new("--name", name)(e.into())))?;
    }
    run.validate().map_err(Failure::bad_input)?;
    Ok(run)
}

/// `--checkpoints-to-keep`, `--checkpoint-score` and `--max-checkpoint-size`.
fn checkpoint_config(args: &RunArgs) -> CheckpointConfig {
    let mut config = CheckpointConfig::default();
    if let Some(n) = args.checkpoints_to_keep {
        config = config.num_to_keep(n);
    }
    if let Some(score) = &args.checkpoint_score {
        config = config.score(&score.attribute, score.order);
    }
    if let Some(size) = args.max_checkpoint_size {
        let files = config.max_checkpoint_files;
        config = config.max_checkpoint(files, Some(size));
    }
    config
}

/// How the run's runtime is started.
enum Start {
    Local(trainyard::local::LocalConfig),
    Ray(trainyard::ray::RayConfig),
    Slurm(trainyard::slurm::SlurmConfig),
}

/// The flags that only one runtime or backend reads, refused with the other.
fn check_runtime_flags(args: &RunArgs) -> Result<(), Failure> {
    let misplaced = |flag: &'static str, value: &str, reason: &str| {
        Err(Failure::bad_input(FlagError::new(flag, value)(
            reason.to_owned().into(),
        )))
    };
    if let (Some(secs), BackendKind::None) = (args.torch_timeout, args.backend) {
        return misplaced(
            "--torch-timeout",
            &secs.to_string(),
            "applies to --backend torch only; --backend none sets up no process group",
        );
    }
    if let Some(n) = args.nproc_per_node {
        let nodes = args.local.nodes.filter(|nodes| *nodes > 1);
        if matches!(args.runtime, RuntimeKind::Ray | RuntimeKind::Slurm) {
            return misplaced(
                "--nproc-per-node",
                &n.to_string(),
                "on --runtime ray and slurm the workers span the cluster's nodes, so there is no count per node: give the total number of workers with -n",
            );
        }
        if let Some(nodes) = nodes {
            return misplaced(
                "--nproc-per-node",
                &n.to_string(),
                &format!(
                    "with --nodes {nodes} the workers span {nodes} virtual nodes, so there is no count per node: give the total number of workers with -n"
                ),
            );
        }
    }
    if args.runtime != RuntimeKind::Slurm {
        if let Some((flag, value)) = args.slurm.given() {
            return misplaced(flag, value, "applies to --runtime slurm only");
        }
        if args.detach {
            return misplaced(
                "--detach",
                "true",
                "applies to --runtime slurm only (it submits the run as a Slurm batch job)",
            );
        }
    }
    match args.runtime {
        RuntimeKind::Local => {
            if let Some(address) = &args.ray.address {
                return misplaced(
                    "--address",
                    address,
                    "--address names a Ray cluster and applies to --runtime ray only",
                );
            }
            if args.wait_for_resources {
                return misplaced(
                    "--wait-for-resources",
                    "true",
                    "applies to --runtime ray only; the local runtime waits for other runs unless --no-wait",
                );
            }
        }
        RuntimeKind::Ray => {
            if args.no_wait {
                return misplaced(
                    "--no-wait",
                    "true",
                    "applies to --runtime local only (runs sharing this machine)",
                );
            }
            if let Some(flag) = args.local.given() {
                return misplaced(
                    flag,
                    "(given)",
                    "describes this machine and applies to --runtime local only; a Ray cluster describes itself",
                );
            }
        }
        RuntimeKind::Slurm => {
            if let Some(address) = &args.ray.address {
                return misplaced(
                    "--address",
                    address,
                    "--address names a Ray cluster and applies to --runtime ray only",
                );
            }
            for (given, flag, why) in [
                (
                    args.no_wait,
                    "--no-wait",
                    "applies to --runtime local only (runs sharing this machine); Slurm queues the allocation up to --placement-timeout",
                ),
                (
                    args.wait_for_resources,
                    "--wait-for-resources",
                    "applies to --runtime ray only; Slurm queues the allocation up to --placement-timeout",
                ),
            ] {
                if given {
                    return misplaced(flag, "true", why);
                }
            }
            if let Some(flag) = args.local.given() {
                return misplaced(
                    flag,
                    "(given)",
                    "describes this machine and applies to --runtime local only; a Slurm cluster describes itself",
                );
            }
        }
    }
    Ok(())
}

/// The driver's variables that `--env-from-driver` copies to a remote runtime's workers:
/// exact names, or a prefix ending in `*`. A name that trainyard sets on every worker
/// (`reserved`) is refused; a prefix passes over such names.
fn env_from_driver(
    patterns: &[String],
    reserved: &BTreeMap<&'static str, &'static str>,
) -> Result<Vec<(String, String)>, Failure> {
    for pattern in patterns {
        let name = pattern.strip_suffix('*').unwrap_or(pattern);
        if name.is_empty() || name.contains(['*', '=']) {
            return Err(Failure::bad_input(FlagError::new(
                "--env-from-driver",
                pattern,
            )(
                "expected a variable name, or a prefix ending in `*` such as `WANDB_*`".into(),
            )));
        }
        if let Some(meaning) = reserved.get(pattern.as_str()) {
            return Err(Failure::bad_input(FlagError::new(
                "--env-from-driver",
                pattern,
            )(
                format!("trainyard sets `{pattern}` on every worker ({meaning})").into(),
            )));
        }
    }
    let matches = |name: &str| {
        !reserved.contains_key(name)
            && patterns
                .iter()
                .any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => name == pattern,
                })
    };
    Ok(std::env::vars().filter(|(name, _)| matches(name)).collect())
}

pub(crate) fn run(args: &RunArgs) -> Result<(), Failure> {
    let progress = Progress::new(args.log_format);
    let timings = init_logging(args.log_format, &progress, args.timings);
    check_runtime_flags(args)?;
    let scaling = args.scaling_config()?;
    let backend = args.backend();
    let reserved = backend.reserved_env();
    let mut run = run_config(args, &reserved)?;
    let worker = scaling.worker_resources().map_err(Failure::bad_input)?;
    if let Some(error) =
        shared_accelerator_error(&run.env, &worker, backend.share_accelerator_ids())
    {
        return Err(Failure::bad_input(error));
    }
    let ranks = args
        .ranks
        .as_ref()
        .map(|ranks| ranks.within(scaling.num_workers.max()))
        .transpose()
        .map_err(Failure::bad_input)?;
    let options = ExecutorOptions {
        placement_timeout: args
            .placement_timeout
            .unwrap_or(trainyard::backend::DEFAULT_PLACEMENT_TIMEOUT),
        ..ExecutorOptions::default()
    };
    let name = unique_run_name();
    // Detecting this machine is the first part of reading the cluster.
    let detecting = tracing::info_span!(target: phase::TARGET, phase::CLUSTER).entered();
    let start = match args.runtime {
        RuntimeKind::Local => Start::Local(args.local.config(
            &name,
            args.name.as_deref(),
            args.no_wait,
        )?),
        RuntimeKind::Ray => {
            for (key, value) in env_from_driver(&args.env_from_driver, &reserved)? {
                run.env.entry(key).or_insert(value);
            }
            let config = args
                .ray
                .config(&name)?
                .wait_for_resources(args.wait_for_resources);
            Start::Ray(config)
        }
        RuntimeKind::Slurm => {
            // In a batch job of `--detach`, the run is the submitted one: it runs here.
            let submitted = std::env::var_os(crate::slurm::DETACHED_VAR).is_some()
                && std::env::var_os(trainyard::slurm::JOB_ID_VAR).is_some();
            if args.detach && !submitted {
                return crate::slurm::detach(
                    &args.slurm,
                    &scaling,
                    args.name.as_deref(),
                    args.output.as_deref(),
                );
            }
            // Job steps get the driver's whole environment (srun --export=ALL). The
            // allocation's job is named after the run, as `squeue` shows it.
            Start::Slurm(args.slurm.config(args.name.as_deref().unwrap_or(&name))?)
        }
    };
    drop(detecting);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Failure::other)?;
    if run.name.is_none() {
        run = run.name(name);
    }
    let result = runtime.block_on(drive(
        args,
        Driving {
            scaling,
            run,
            options,
            start,
            ranks,
            progress,
            timings,
            worker,
        },
    ));
    // What is left is clean-up on blocking threads (or a printer stuck on a stdout nobody
    // reads): bounded.
    runtime.shutdown_timeout(SHUTDOWN_LIMIT);
    result
}

/// What `run` hands the drive of a run: the run's configuration, how its runtime starts, and
/// the driver's output.
struct Driving {
    scaling: trainyard_config::ScalingConfig,
    run: RunConfig,
    options: ExecutorOptions,
    start: Start,
    ranks: Option<BTreeSet<u32>>,
    progress: Progress,
    timings: Option<TimingsHandle>,
    /// What each worker asks for.
    worker: Resources,
}

async fn drive(args: &RunArgs, driving: Driving) -> Result<(), Failure> {
    let Driving {
        scaling,
        run,
        options,
        start,
        ranks,
        progress,
        timings,
        worker,
    } = driving;
    let workers = scaling.num_workers.max();
    // Before anything starts: an interrupt from here on stops what was started (a Ray head
    // that is coming up, say) rather than killing the driver outright.
    let mut interrupt = Interrupts::new()?;
    // SIGQUIT (Ctrl-\) prints every rank's stacks, as a JVM's thread dump, and stops nothing.
    let stacks = StacksTrigger::new();
    let mut quit = signal(SignalKind::quit()).map_err(Failure::other)?;
    let asked = stacks.clone();
    let quit_listener = tokio::spawn(async move {
        while quit.recv().await.is_some() {
            asked.request();
        }
    });
    let starting = start_runtime(args, start, &progress)
        .instrument(tracing::info_span!(target: phase::TARGET, phase::CLUSTER));
    let runtime = tokio::select! {
        runtime = starting => runtime?,
        () = interrupt.next() => {
            // The start is dropped: what it started so far is stopped as it goes.
            progress.finish();
            return Err(Failure::interrupted_starting());
        }
    };
    let (program, program_args) = args
        .program
        .split_first()
        .ok_or_else(|| Failure::bad_input("a program to run is required (PROGRAM [ARGS...])"))?;
    let task = command_task(program.clone(), program_args.iter().cloned());
    let (events, received) = mpsc::channel(EVENT_BUFFER);
    let trainer = match args.backend {
        BackendKind::Torch => Trainer::new(runtime.runtime(), &args.torch_config(), task),
        BackendKind::None => Trainer::new(runtime.runtime(), &NoBackend, task),
    };
    // A first interrupt pulls it: the executor stops the tasks gracefully and streams what
    // they print as they stop.
    let stop = StopTrigger::new();
    let trainer = trainer
        .scaling_config(scaling)
        .run_config(run)
        .executor_options(options)
        .events(events)
        .stacks_trigger(stacks)
        .stop_trigger(stop.clone());
    // Writing to a terminal or a pipe blocks: the printer has a thread of its own. It shows
    // what other runs keep the placement group waiting for too, in order with the events.
    let shown = Shown {
        events: received,
        waits: runtime.waits(),
        ranks,
    };
    let format = args.log_format;
    let printing = progress.clone();
    let tokio = tokio::runtime::Handle::current();
    let printer =
        tokio::task::spawn_blocking(move || print_events(shown, format, &printing, &tokio));
    let started = Instant::now();
    let mut fit = Box::pin(trainer.fit());
    let mut interrupted = false;
    let outcome = tokio::select! {
        result = &mut fit => Some(result),
        () = interrupt.next() => None,
    };
    // After an interrupt the run goes on until its tasks have stopped and their last output is
    // streamed (bounded); a second interrupt stops waiting, and the driver's exit ends the rest.
    let mut again = false;
    let outcome = match outcome {
        Some(result) => Some(result),
        None => {
            interrupted = true;
            progress.message("interrupted: stopping the workers");
            stop.request();
            tokio::select! {
                result = tokio::time::timeout(STOP_LIMIT, &mut fit) => result.ok(),
                () = interrupt.next() => {
                    again = true;
                    None
                }
            }
        }
    };
    drop(fit);
    if again {
        progress.message("interrupted again: killing the workers");
    } else {
        let stopping = runtime
            .shutdown()
            .instrument(tracing::info_span!(target: phase::TARGET, phase::SHUTDOWN));
        if interrupted {
            tokio::select! {
                _ = tokio::time::timeout(STOP_LIMIT, stopping) => {}
                () = interrupt.next() => progress.message("interrupted again: killing the workers"),
            }
        } else {
            stopping.await;
        }
    }
    // The printer ends once the run's events are printed; a stdout nobody reads would hold
    // it forever.
    if tokio::time::timeout(PRINTER_DRAIN, printer).await.is_err() {
        tracing::warn!(
            limit = ?PRINTER_DRAIN,
            "the workers' last output was not all written: stdout is not read"
        );
    }
    progress.finish();
    quit_listener.abort();
    if let Some(timings) = timings {
        print_timings(&timings.report(), args.log_format);
    }
    if interrupted {
        return Err(interrupted_run(outcome, args));
    }
    match outcome {
        None => Err(Failure::interrupted()),
        Some(Ok(result)) => {
            if args.log_format == LogFormat::Json {
                print_json(&serde_json::json!({
                    "event": "run_succeeded",
                    "attempts": result.attempts,
                    "failures": result.failures,
                    "world_sizes": result.world_sizes,
                    "run_dir": result.run_dir,
                    "checkpoint": result.checkpoint,
                    "best_checkpoints": result.best_checkpoints,
                    "metrics": result.metrics,
                }));
            }
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
            let hint = refusal_hint(&error, args, &worker, workers);
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

/// Starts the run's runtime.
async fn start_runtime(
    args: &RunArgs,
    start: Start,
    progress: &Progress,
) -> Result<Engine, Failure> {
    Ok(match start {
        Start::Local(config) => {
            Engine::Local(LocalRuntime::start(config).await.map_err(Failure::other)?)
        }
        Start::Ray(config) => {
            if config.bridge.address.is_none() {
                progress
                    .message("starting a throwaway local Ray head for this run (a few seconds)");
            }
            Engine::Ray(args.ray.start(config).await?)
        }
        Start::Slurm(config) => Engine::Slurm(args.slurm.start(config).await?),
    })
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

/// How an interrupted run ends: in JSON a `run_interrupted` event (with what the run did until
/// then, when the executor got to say), in text its last metrics and checkpoint; exit 130.
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
    match args.log_format {
        LogFormat::Json => print_json(&serde_json::json!({
            "event": "run_interrupted",
            "stopped": report.is_some(),
            "report": report,
        })),
        LogFormat::Text => {
            if let Some(report) = &report {
                print_checkpoints(report);
                print_resume_hint(report, args);
            }
        }
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
fn print_root_cause(report: &trainyard::FitReport) {
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
    if format == LogFormat::Json {
        let report = match &error {
            trainyard::Error::Executor(ExecutorError::TrainingFailed { report }) => {
                serde_json::to_value(report).unwrap_or_default()
            }
            _ => serde_json::Value::Null,
        };
        print_json(&serde_json::json!({
            "event": "run_failed",
            "error": trainyard::resources::ErrorChain(&error).to_string(),
            "report": report,
        }));
    }
    if format == LogFormat::Text {
        if let trainyard::Error::Executor(ExecutorError::TrainingFailed { report }) = &error {
            print_root_cause(report);
            print_checkpoints(report);
            print_resume_hint(report, args);
        }
    }
    let code = match &error {
        trainyard::Error::Config(_)
        | trainyard::Error::Resources(_)
        | trainyard::Error::Executor(
            ExecutorError::Storage(_) | ExecutorError::RunFinished { .. },
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

/// SIGINT and SIGTERM.
struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn new() -> Result<Self, Failure> {
        Ok(Self {
            int: signal(SignalKind::interrupt()).map_err(Failure::other)?,
            term: signal(SignalKind::terminate()).map_err(Failure::other)?,
        })
    }

    /// The next interruption.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}
