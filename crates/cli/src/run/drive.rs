//! Driving a run: its runtime started, the trainer fitting, the run's events printed as they
//! come, and the signals: SIGINT and SIGTERM stop the workers (a second one stops waiting for
//! them), SIGQUIT prints every rank's stacks.

use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tracing::Instrument as _;
use trainyard::Trainer;
use trainyard::backend::{NoBackend, Reporter as _, RunEvent, StacksTrigger, StopTrigger};
use trainyard::checkpoint::RunStatus;
use trainyard::local::LocalRuntime;
use trainyard::runtime::TaskSpec;
use trainyard::runtime::timings as phase;
use trainyard_config::ResumePolicy;

use super::config::{Launch, Start};
use crate::Failure;
use crate::args::{BackendKind, RunArgs};
use crate::engine::Engine;
use crate::notify::{Delivery, Notifier};
use crate::output::Progress;
use crate::print::{Shown, print_events};

/// How many run events wait for the printer before output lines are dropped (and counted).
const EVENT_BUFFER: usize = 4096;

/// How long stopping the workers may take after an interruption before the driver gives up
/// waiting (its own exit still kills them).
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// How long writing an interrupted run's record may take.
const RECORD_LIMIT: Duration = Duration::from_secs(5);

/// How long the printer may take to write what the run streamed, once the run has ended.
const PRINTER_DRAIN: Duration = Duration::from_secs(30);

/// How a driven run ended, once its runtime is shut down and its output written.
pub(super) struct Ended {
    /// What the fit returned; `None` when an interrupt stopped waiting for it.
    pub(super) outcome: Option<Result<trainyard::FitReport, trainyard::Error>>,
    /// Whether an interrupt stopped the run.
    pub(super) interrupted: bool,
    /// When the fit began.
    pub(super) started: Instant,
    /// What delivers to the webhook.
    pub(super) delivery: Option<Delivery>,
}

/// Drives the run `launch` describes: starts its runtime, fits, streams the run's events to
/// the console, stops everything on an interrupt, and shuts the runtime down.
pub(super) async fn drive(
    args: &RunArgs,
    launch: Launch,
    progress: &Progress,
) -> Result<Ended, Failure> {
    let Launch {
        scaling,
        run,
        options,
        start,
        ranks,
        worker: _,
    } = launch;
    let (notify, delivery) = match &crate::args::notify_given(args.notify.as_deref()) {
        Some(url) => {
            let (notify, delivery) = Notifier::start(url, run.name.as_deref().unwrap_or_default())?;
            (Some(notify), Some(delivery))
        }
        None => (None, None),
    };
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
    let starting = start_runtime(args, start, progress)
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
    let task = TaskSpec::command(program.clone(), program_args.iter().cloned());
    // Where the run's record is, for when the driver stops waiting for the executor.
    let record_at = (
        run.storage_path.clone(),
        run.name.clone().unwrap_or_default(),
        run.resume,
    );
    let (events, received) = mpsc::channel(EVENT_BUFFER);
    // The end of a run this driver stops waiting for goes to the printer from here.
    let last_word = events.clone();
    let trainer = match args.backend {
        BackendKind::Torch => Trainer::builder(runtime.runtime()).backend(&args.torch_config()),
        BackendKind::None => Trainer::builder(runtime.runtime()).backend(&NoBackend),
    };
    // A first interrupt pulls it: the executor stops the tasks gracefully and streams what
    // they print as they stop.
    let stop = StopTrigger::new();
    let mut trainer = trainer
        .scaling_config(scaling)
        .run_config(run)
        .executor_options(options)
        .events(events)
        .stacks_trigger(stacks)
        .stop_trigger(stop.clone());
    if let Some(notify) = &notify {
        trainer = trainer.reporter(Box::new(notify.clone()));
    }
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
    let mut fit = Box::pin(trainer.fit(&task));
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
    if interrupted && outcome.is_none() {
        // The run could not say how it ended: the driver says it.
        let end = RunEvent::RunInterrupted {
            stopped: false,
            report: None,
        };
        if let Some(notify) = &notify {
            notify.clone().report(&end);
        }
        let _ = last_word.try_send(end);
        // The executor that would have recorded the end is gone.
        let (storage, name, resume) = record_at;
        if tokio::time::timeout(RECORD_LIMIT, record_interrupted(storage, &name, resume))
            .await
            .is_err()
        {
            tracing::warn!(run = %name, "the run's record could not be marked interrupted in time");
        }
    }
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
    drop(last_word);
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
    Ok(Ended {
        outcome,
        interrupted,
        started,
        delivery,
    })
}

/// Records run `name`, which this driver runs and stopped waiting for after an interrupt, as
/// interrupted (its current attempt ended), so that no reader takes it for a running one.
async fn record_interrupted(storage: Option<String>, name: &str, resume: ResumePolicy) {
    let Ok(storage) = crate::runs::open_storage_at(storage) else {
        return;
    };
    let Some(mut record) = crate::runs::driven_by(&storage, name, resume, std::process::id()).await
    else {
        return;
    };
    if record.status != RunStatus::Running {
        return;
    }
    record.status = RunStatus::Interrupted;
    if let Some(attempt) = record.attempts.last_mut() {
        attempt
            .ended_at
            .get_or_insert_with(trainyard::checkpoint::now);
    }
    if storage.run(&record.name).save(&record).await.is_err() {
        tracing::warn!(run = %record.name, "the run's record could not be marked interrupted");
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
