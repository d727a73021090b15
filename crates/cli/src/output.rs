//! What the driver shows while it waits, and its logs: a spinner on an interactive terminal,
//! plain lines otherwise; `tracing` to stderr as text or JSON, filtered by `RUST_LOG`.

use std::io::{self, IsTerminal as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;
use trainyard::backend::timings::{TimingsHandle, TimingsLayer};

use crate::args::LogFormat;

/// `value` with `"time"`: when it was printed, in seconds since the Unix epoch (an object
/// that has a `time` of its own keeps it), and `"v"`: the version of the event stream's
/// contract (`trainyard::backend::RUN_EVENTS_VERSION`).
pub(crate) fn stamped(mut value: serde_json::Value) -> serde_json::Value {
    if let serde_json::Value::Object(object) = &mut value {
        object
            .entry("time")
            .or_insert_with(|| serde_json::json!(trainyard::checkpoint::now()));
        object.insert(
            "v".to_owned(),
            serde_json::json!(trainyard::backend::RUN_EVENTS_VERSION),
        );
    }
    value
}

/// The log filter unless `RUST_LOG` says otherwise: warnings, and the lines a user of Ray
/// Train expects to see (the workers' ranks, rank 0's process-group setup). The executor's
/// line about a restart is left out: the printer shows the restart event itself.
const DEFAULT_FILTER: &str = "warn,trainyard_backend_executor=info,trainyard_torch_backend=info,trainyard_backend_executor::restarts=off";

/// The waiting indicator: a spinner with the elapsed time on a terminal, plain lines
/// elsewhere. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    /// Counts waits, so that a plain line is printed only for a wait still current.
    waits: Arc<AtomicU64>,
}

/// How long a wait lasts before plain output says what it waits for (a quick placement,
/// or one that fails at once, prints nothing).
const PLAIN_WAIT_DELAY: Duration = Duration::from_secs(1);

impl Progress {
    /// A spinner when stderr is an interactive terminal outside CI and the log format is
    /// text; plain lines for text otherwise; nothing for JSON (events say it all).
    pub(crate) fn new(format: LogFormat) -> Self {
        let interactive = io::stderr().is_terminal() && std::env::var_os("CI").is_none();
        let bar = (interactive && format == LogFormat::Text).then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar
        });
        Self {
            bar,
            plain: format == LogFormat::Text,
            waits: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Shows that the run waits for `what`: at once on the spinner, after
    /// [`PLAIN_WAIT_DELAY`] as a plain line if the wait is still current then.
    pub(crate) fn wait(&self, what: &str) {
        let this = self.waits.fetch_add(1, Ordering::SeqCst) + 1;
        match &self.bar {
            Some(bar) => {
                bar.set_message(what.to_owned());
                bar.reset_elapsed();
                bar.enable_steady_tick(Duration::from_millis(100));
            }
            None => {
                let progress = self.clone();
                let line = format!("trainyard: {what}");
                tokio::spawn(async move {
                    tokio::time::sleep(PLAIN_WAIT_DELAY).await;
                    if progress.waits.load(Ordering::SeqCst) == this {
                        progress.line(&line);
                    }
                });
            }
        }
    }

    /// The wait is over.
    pub(crate) fn clear(&self) {
        self.waits.fetch_add(1, Ordering::SeqCst);
        if let Some(bar) = &self.bar {
            bar.disable_steady_tick();
            bar.set_message("");
            bar.finish_and_clear();
            bar.reset();
        }
    }

    /// One line to stderr (in text mode), above the spinner.
    pub(crate) fn line(&self, text: &str) {
        if self.plain {
            let _ = self.suspend(|| writeln!(io::stderr(), "{text}"));
        }
    }

    /// A driver message.
    pub(crate) fn message(&self, text: &str) {
        self.line(&format!("trainyard: {text}"));
    }

    /// Runs `write` with the spinner out of the way.
    pub(crate) fn suspend<T>(&self, write: impl FnOnce() -> T) -> T {
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }

    /// Removes the spinner for good.
    pub(crate) fn finish(&self) {
        self.waits.fetch_add(1, Ordering::SeqCst);
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Stderr, written with the spinner out of the way.
#[derive(Debug, Clone)]
struct Stderr(Progress);

impl io::Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.suspend(|| io::stderr().write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Log lines as a user reads them: an info line is its message and fields; a warning or an
/// error says so first. Spans and targets are for `RUST_LOG` debugging and JSON output.
#[derive(Debug, Clone, Copy)]
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        match *event.metadata().level() {
            Level::ERROR => write!(writer, "error: ")?,
            Level::WARN => write!(writer, "warning: ")?,
            Level::INFO => {}
            level => write!(writer, "{level}: ")?,
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Installs the driver's log output (once; later calls do nothing), and with `timings` a layer
/// that records where the launch goes, read through the handle it returns.
pub(crate) fn init_logging(
    format: LogFormat,
    progress: &Progress,
    timings: bool,
) -> Option<TimingsHandle> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let (layer, handle) = TimingsLayer::new();
    let installed = match format {
        LogFormat::Text => tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(Stderr(progress.clone()))
                    .with_ansi(io::stderr().is_terminal())
                    .event_format(Plain)
                    .with_filter(filter),
            )
            .with(timings.then(|| layer.clone().with_filter(TimingsLayer::filter())))
            .try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(io::stderr)
                    .json()
                    .flatten_event(true)
                    .with_filter(filter),
            )
            .with(timings.then(|| layer.clone().with_filter(TimingsLayer::filter())))
            .try_init(),
    };
    // Installed already (only in tests that run twice in one process): keep the first.
    installed.ok().and(timings.then_some(handle))
}
