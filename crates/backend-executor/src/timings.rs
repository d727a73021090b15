//! Where a run's launch went: the phase spans of [`trainyard_runtime::timings`] collected by a
//! `tracing` layer and summed up per attempt, as cargo's `--timings` does for a build.
//!
//! [`TimingsLayer`] records every phase span (target [`TARGET`]) as it closes;
//! [`TimingsHandle::report`] turns what it recorded into [`Timings`]: for each attempt, each
//! phase's wall time (from its first span's start to its last span's end), the spread over
//! workers of the phases done once per worker, and the launch as a whole.
//!
//! ```
//! use tracing_subscriber::prelude::*;
//! use trainyard_backend_executor::timings::TimingsLayer;
//! use trainyard_runtime::timings;
//!
//! let (layer, handle) = TimingsLayer::new();
//! let subscriber = tracing_subscriber::registry().with(layer);
//! tracing::subscriber::with_default(subscriber, || {
//!     let reserve = tracing::info_span!(target: timings::TARGET, timings::RESERVE, attempt = 0);
//!     drop(reserve);
//!     for worker in 0..2 {
//!         let spawn = tracing::info_span!(target: timings::TARGET, timings::SPAWN, worker);
//!         drop(spawn);
//!     }
//! });
//! let report = handle.report();
//! let attempt = &report.attempts[0];
//! assert_eq!(attempt.phases[0].phase, "reserve");
//! assert_eq!(attempt.phases[1].workers.as_ref().map(|w| w.count), Some(2));
//! ```

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter, Layer};
use tracing_subscriber::registry::LookupSpan;
pub use trainyard_runtime::timings::TARGET;
use trainyard_runtime::timings::{
    AGENTS, CLUSTER, FIRST_OUTPUT, HANDSHAKE, RESERVE, RUN_FOLDER, SETUP, SHUTDOWN, SPAWN,
    TASK_START, WORKER_INFO,
};

/// The phases in the order a launch goes through them: the span's name, what the table
/// calls it, the phase it is part of (a worker's step of a phase), whether it is done once per
/// worker, and whether it counts towards the launch.
const PHASES: [PhaseKind; 11] = [
    PhaseKind::new(CLUSTER, "reading the cluster", None, false, true),
    PhaseKind::new(RUN_FOLDER, "opening the run folder", None, false, true),
    PhaseKind::new(RESERVE, "reserving the placement group", None, false, true),
    PhaseKind::new(AGENTS, "starting the agents", None, false, true),
    PhaseKind::new(SPAWN, "spawning an agent", Some(AGENTS), true, false),
    PhaseKind::new(HANDSHAKE, "its handshake", Some(AGENTS), true, false),
    PhaseKind::new(WORKER_INFO, "its metadata", Some(AGENTS), true, false),
    PhaseKind::new(SETUP, "setting up ranks and the backend", None, false, true),
    PhaseKind::new(TASK_START, "starting the task", None, true, true),
    PhaseKind::new(FIRST_OUTPUT, "first output line", None, true, true),
    PhaseKind::new(SHUTDOWN, "shutdown", None, false, false),
];

#[derive(Debug, Clone, Copy)]
struct PhaseKind {
    name: &'static str,
    label: &'static str,
    part_of: Option<&'static str>,
    per_worker: bool,
    in_launch: bool,
}

impl PhaseKind {
    const fn new(
        name: &'static str,
        label: &'static str,
        part_of: Option<&'static str>,
        per_worker: bool,
        in_launch: bool,
    ) -> Self {
        Self {
            name,
            label,
            part_of,
            per_worker,
            in_launch,
        }
    }

    fn of(name: &str) -> Option<usize> {
        PHASES.iter().position(|kind| kind.name == name)
    }
}

/// One phase span, once it has closed.
#[derive(Debug, Clone, Copy)]
struct Span {
    phase: usize,
    attempt: Option<u32>,
    start: Instant,
    end: Instant,
}

/// What a phase span carries while it is open.
#[derive(Debug)]
struct Open {
    phase: usize,
    attempt: Option<u32>,
    start: Instant,
    /// A first-output span counts only once the rank's line is seen.
    output: bool,
}

/// The `attempt` and `output` fields of a phase span.
#[derive(Default)]
struct Fields {
    attempt: Option<u32>,
    output: Option<bool>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "attempt" {
            self.attempt = u32::try_from(value).ok();
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "attempt" {
            self.attempt = u32::try_from(value).ok();
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "output" {
            self.output = Some(value);
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn fmt::Debug) {}
}

/// A `tracing` layer that records the phase spans of launches (target [`TARGET`]); what it
/// recorded is read through its [`TimingsHandle`].
///
/// It filters itself: under a per-layer filter of its own, other layers keep theirs (a quiet
/// log filter does not hide the phases from it).
#[derive(Debug, Clone)]
pub struct TimingsLayer {
    spans: Arc<Mutex<Vec<Span>>>,
}

/// Reads what a [`TimingsLayer`] recorded. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TimingsHandle {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl TimingsLayer {
    /// A layer and the handle that reads what it records.
    #[must_use]
    pub fn new() -> (Self, TimingsHandle) {
        let spans = Arc::new(Mutex::new(Vec::new()));
        (
            Self {
                spans: Arc::clone(&spans),
            },
            TimingsHandle { spans },
        )
    }

    /// A per-layer filter that lets exactly the phase spans through, for
    /// `layer.with_filter(TimingsLayer::filter())` beside layers with filters of their own.
    #[must_use]
    pub fn filter() -> PhaseFilter {
        PhaseFilter
    }
}

/// The per-layer filter of [`TimingsLayer::filter`]: phase spans only.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseFilter;

impl<S> Filter<S> for PhaseFilter {
    fn enabled(&self, metadata: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        is_phase(metadata)
    }

    fn callsite_enabled(
        &self,
        metadata: &'static Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if is_phase(metadata) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
}

fn is_phase(metadata: &Metadata<'_>) -> bool {
    metadata.is_span() && metadata.target() == TARGET
}

impl<S> Layer<S> for TimingsLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !is_phase(attrs.metadata()) {
            return;
        }
        let Some(phase) = PhaseKind::of(attrs.metadata().name()) else {
            return;
        };
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        // A worker's phase takes the attempt of the phase it runs inside.
        let attempt = fields.attempt.or_else(|| {
            span.scope().skip(1).find_map(|outer| {
                outer
                    .extensions()
                    .get::<Open>()
                    .and_then(|open| open.attempt)
            })
        });
        span.extensions_mut().insert(Open {
            phase,
            attempt,
            start: Instant::now(),
            output: fields.output.unwrap_or(false),
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let (Some(output), Some(open)) = (fields.output, span.extensions_mut().get_mut::<Open>())
        {
            open.output = output;
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let end = Instant::now();
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(open) = span.extensions_mut().remove::<Open>() else {
            return;
        };
        if PHASES[open.phase].name == FIRST_OUTPUT && !open.output {
            return;
        }
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Span {
                phase: open.phase,
                attempt: open.attempt,
                start: open.start,
                end,
            });
    }
}

impl TimingsHandle {
    /// What was recorded so far, per attempt. Spans that name no attempt (the runtime's start
    /// and shutdown, outside any attempt) go to the first attempt when they came before it,
    /// else to the last.
    #[must_use]
    pub fn report(&self) -> Timings {
        let spans = self
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut by_attempt: BTreeMap<u32, Vec<Span>> = BTreeMap::new();
        let mut unnamed = Vec::new();
        for span in spans {
            match span.attempt {
                Some(attempt) => by_attempt.entry(attempt).or_default().push(span),
                None => unnamed.push(span),
            }
        }
        for span in unnamed {
            let first_start = by_attempt
                .values()
                .next()
                .and_then(|spans| spans.iter().map(|s| s.start).min());
            let attempt = match (first_start, by_attempt.keys().next_back()) {
                (Some(first), _) if span.end <= first => {
                    by_attempt.keys().next().copied().unwrap_or(0)
                }
                (_, Some(last)) => *last,
                _ => 0,
            };
            by_attempt.entry(attempt).or_default().push(span);
        }
        Timings {
            attempts: by_attempt
                .into_iter()
                .map(|(restart_count, spans)| AttemptTimings::of(restart_count, &spans))
                .collect(),
        }
    }
}

/// Where each attempt's launch went.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timings {
    /// One entry per attempt, in order.
    pub attempts: Vec<AttemptTimings>,
}

/// One attempt's phases.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptTimings {
    /// The attempt's restart count (0 for the first attempt).
    pub restart_count: u32,
    /// From the start of the first launch phase to the end of the last one (every rank's first
    /// line, or every task started when a rank printed nothing), in milliseconds.
    pub launch_ms: f64,
    /// The launch phases' wall times added up, in milliseconds: what `launch_ms` is made of.
    pub phases_ms: f64,
    /// The phases seen, in launch order.
    pub phases: Vec<PhaseTimings>,
}

/// One phase of one attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseTimings {
    /// The phase's span name (`reserve`, `spawn`, ...).
    pub phase: &'static str,
    /// What the phase is, in words.
    pub label: &'static str,
    /// The phase this is a worker's step of (`agents` for `spawn`), if any.
    pub part_of: Option<&'static str>,
    /// Whether the phase counts towards the launch (shutdown and the steps of a phase do not).
    pub in_launch: bool,
    /// From the start of its first span to the end of its last, in milliseconds.
    pub wall_ms: f64,
    /// The spread over workers, for a phase done once per worker.
    pub workers: Option<Spread>,
}

/// How long a phase took its workers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// How many workers did it.
    pub count: usize,
    /// The quickest, in milliseconds.
    pub min_ms: f64,
    /// The median (the lower of the two middle ones for an even count), in milliseconds.
    pub median_ms: f64,
    /// The slowest, in milliseconds.
    pub max_ms: f64,
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

impl AttemptTimings {
    fn of(restart_count: u32, spans: &[Span]) -> Self {
        let mut phases = Vec::new();
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        let mut phases_ms = 0.0;
        for (index, kind) in PHASES.iter().enumerate() {
            let mine: Vec<&Span> = spans.iter().filter(|s| s.phase == index).collect();
            let (Some(start), Some(end)) = (
                mine.iter().map(|s| s.start).min(),
                mine.iter().map(|s| s.end).max(),
            ) else {
                continue;
            };
            let wall_ms = ms(end.saturating_duration_since(start));
            if kind.in_launch {
                first = Some(first.map_or(start, |f| f.min(start)));
                last = Some(last.map_or(end, |l| l.max(end)));
                phases_ms += wall_ms;
            }
            let workers = kind.per_worker.then(|| {
                let mut each: Vec<f64> = mine
                    .iter()
                    .map(|s| ms(s.end.saturating_duration_since(s.start)))
                    .collect();
                each.sort_by(f64::total_cmp);
                Spread {
                    count: each.len(),
                    min_ms: each[0],
                    median_ms: each[(each.len() - 1) / 2],
                    max_ms: each[each.len() - 1],
                }
            });
            phases.push(PhaseTimings {
                phase: kind.name,
                label: kind.label,
                part_of: kind.part_of,
                in_launch: kind.in_launch,
                wall_ms,
                workers,
            });
        }
        let launch_ms = match (first, last) {
            (Some(first), Some(last)) => ms(last.saturating_duration_since(first)),
            _ => 0.0,
        };
        Self {
            restart_count,
            launch_ms,
            phases_ms,
            phases,
        }
    }
}

impl fmt::Display for Timings {
    /// The table `trainyard run --timings` prints: one block per attempt.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, attempt) in self.attempts.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{attempt}")?;
        }
        Ok(())
    }
}

impl fmt::Display for AttemptTimings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let title = if self.restart_count == 0 {
            "launch timings".to_owned()
        } else {
            format!("launch timings, restart {}", self.restart_count)
        };
        writeln!(
            f,
            "{title:<36} {:>10}   {:>10} {:>10} {:>10}",
            "wall", "min", "median", "max"
        )?;
        let launch = self
            .phases
            .iter()
            .rposition(|p| p.in_launch || p.part_of.is_some());
        for (i, phase) in self.phases.iter().enumerate() {
            let indent = if phase.part_of.is_some() {
                "    "
            } else {
                "  "
            };
            let mut line = format!("{indent}{}", phase.label);
            if let Some(workers) = &phase.workers {
                let _ = write!(line, " (×{})", workers.count);
            }
            let mut row = format!("{line:<36} {:>10}", shown(phase.wall_ms));
            if let Some(workers) = &phase.workers {
                let _ = write!(
                    row,
                    "   {:>10} {:>10} {:>10}",
                    shown(workers.min_ms),
                    shown(workers.median_ms),
                    shown(workers.max_ms)
                );
            }
            writeln!(f, "{}", row.trim_end())?;
            if Some(i) == launch {
                self.launch_row(f)?;
            }
        }
        if launch.is_none() {
            self.launch_row(f)?;
        }
        Ok(())
    }
}

impl AttemptTimings {
    /// The launch as a whole, and how much of it the phases account for.
    fn launch_row(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let between = (self.launch_ms - self.phases_ms).max(0.0);
        writeln!(
            f,
            "{:<36} {:>10}   (the phases add up to {}; {} between them)",
            "  launch",
            shown(self.launch_ms),
            shown(self.phases_ms),
            shown(between)
        )
    }
}

/// A duration in milliseconds as the table shows it.
fn shown(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

#[cfg(test)]
mod tests {
    use std::thread::sleep;

    use tracing::Instrument as _;
    use tracing_subscriber::prelude::*;

    use super::*;

    fn recorded(work: impl FnOnce()) -> Timings {
        let (layer, handle) = TimingsLayer::new();
        let subscriber = tracing_subscriber::registry().with(layer.with_filter(PhaseFilter));
        tracing::subscriber::with_default(subscriber, work);
        handle.report()
    }

    #[test]
    fn phases_come_in_launch_order_with_their_spread_over_workers() {
        let timings = recorded(|| {
            let reserve = tracing::info_span!(target: TARGET, "reserve", attempt = 0);
            reserve.in_scope(|| sleep(Duration::from_millis(2)));
            drop(reserve);
            let agents = tracing::info_span!(target: TARGET, "agents", attempt = 0);
            agents.in_scope(|| {
                for ms in [1, 3, 5] {
                    let spawn = tracing::info_span!(target: TARGET, "spawn");
                    spawn.in_scope(|| sleep(Duration::from_millis(ms)));
                }
            });
            drop(agents);
            let cluster = tracing::info_span!(target: TARGET, "cluster");
            drop(cluster);
        });
        let [attempt] = &timings.attempts[..] else {
            panic!("one attempt: {timings:?}");
        };
        let names: Vec<_> = attempt.phases.iter().map(|p| p.phase).collect();
        // Shown in launch order, whatever order they ran in.
        assert_eq!(names, ["cluster", "reserve", "agents", "spawn"]);
        let spawn = attempt.phases[3].workers.expect("spawn is per worker");
        assert_eq!(spawn.count, 3);
        assert!(spawn.min_ms >= 1.0 && spawn.median_ms >= 3.0 && spawn.max_ms >= 5.0);
        assert!(spawn.min_ms <= spawn.median_ms && spawn.median_ms <= spawn.max_ms);
        assert_eq!(attempt.phases[3].part_of, Some("agents"));
        // The worker steps sit inside their phase and are not added twice.
        let launch: f64 = attempt
            .phases
            .iter()
            .filter(|p| p.in_launch)
            .map(|p| p.wall_ms)
            .sum();
        assert!((attempt.phases_ms - launch).abs() < 1e-9);
        assert!(
            attempt.launch_ms >= attempt.phases[2].wall_ms + attempt.phases[1].wall_ms,
            "{timings:#?}"
        );
    }

    #[test]
    fn a_worker_phase_takes_the_attempt_of_the_phase_it_runs_in() {
        let timings = recorded(|| {
            for attempt in 0..2u32 {
                let agents = tracing::info_span!(target: TARGET, "agents", attempt);
                agents.in_scope(|| drop(tracing::info_span!(target: TARGET, "handshake")));
            }
        });
        assert_eq!(timings.attempts.len(), 2);
        for (i, attempt) in timings.attempts.iter().enumerate() {
            assert_eq!(attempt.restart_count as usize, i);
            let handshake = attempt.phases.iter().find(|p| p.phase == "handshake");
            assert_eq!(handshake.and_then(|p| p.workers).map(|w| w.count), Some(1));
        }
    }

    #[test]
    fn a_first_output_span_counts_only_once_its_line_was_seen() {
        let timings = recorded(|| {
            let printed = tracing::info_span!(target: TARGET, "first_output", attempt = 0, output = tracing::field::Empty);
            printed.record("output", true);
            drop(printed);
            let silent = tracing::info_span!(target: TARGET, "first_output", attempt = 0, output = tracing::field::Empty);
            drop(silent);
        });
        let phase = &timings.attempts[0].phases[0];
        assert_eq!(phase.phase, "first_output");
        assert_eq!(phase.workers.map(|w| w.count), Some(1));
    }

    #[test]
    fn spans_outside_attempts_go_to_the_first_or_the_last() {
        let timings = recorded(|| {
            drop(tracing::info_span!(target: TARGET, "cluster"));
            for attempt in 0..2u32 {
                drop(tracing::info_span!(target: TARGET, "reserve", attempt));
            }
            drop(tracing::info_span!(target: TARGET, "shutdown"));
        });
        let names = |i: usize| -> Vec<&str> {
            timings.attempts[i].phases.iter().map(|p| p.phase).collect()
        };
        assert_eq!(names(0), ["cluster", "reserve"]);
        assert_eq!(names(1), ["reserve", "shutdown"]);
        // The runtime's shutdown does not count towards a launch.
        assert!(timings.attempts[1].phases[1].in_launch.eq(&false));
    }

    #[tokio::test]
    async fn spans_of_futures_close_when_the_future_is_done() {
        let (layer, handle) = TimingsLayer::new();
        let subscriber = tracing_subscriber::registry().with(layer.with_filter(PhaseFilter));
        let _guard = tracing::subscriber::set_default(subscriber);
        tokio::time::sleep(Duration::from_millis(1))
            .instrument(tracing::info_span!(target: TARGET, "setup", attempt = 3))
            .await;
        let timings = handle.report();
        assert_eq!(timings.attempts[0].restart_count, 3);
        assert!(timings.attempts[0].phases[0].wall_ms >= 1.0);
        let text = timings.to_string();
        assert!(text.starts_with("launch timings, restart 3"), "{text}");
        assert!(text.contains("setting up ranks and the backend"), "{text}");
    }
}
