//! `trainyard logs NAME`: one attempt's rank logs (the latest, or `--attempt K`), every rank's
//! lines merged by the time the driver took them in; `-f` follows a live run — into its next
//! attempt when it restarts — and ends when the run ends.
//!
//! The files are read where the driver writes them as the attempt runs (this host), else from
//! the run folder: a local one's `logs/attempt_<k>`, or the copy remote storage gets when the
//! attempt ends.

use std::io::{self, Write as _};
use std::time::{Duration, Instant};

use trainyard::backend::{DriverLiveness, driver_liveness};

use crate::Failure;
use crate::args::{LogsArgs, OutputFormat};
use crate::runs::logs::{LogLine, Tail, locate};
use crate::runs::{find, open_storage, runtime};
use crate::values::FlagError;

/// How often a followed run's files are read for new lines.
const POLL: Duration = Duration::from_millis(100);
/// How often a followed run's record is read for a new attempt or its end.
const RECORD_EVERY: Duration = Duration::from_millis(500);
/// How many reads of a followed run's record in a row may fail before following stops.
const UNREADABLE_LIMIT: u32 = 60;

pub(crate) fn run(args: &LogsArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let runtime = runtime()?;
    let (folder, record) = find(&storage, &runtime, &args.name)?;
    let liveness = driver_liveness(&record);
    if args.follow {
        if let (DriverLiveness::Unknown, Some(driver)) = (liveness, &record.driver) {
            return Err(Failure::other(format!(
                "run `{}` is driven on host {} (pid {}): follow it there; without -f, `trainyard logs` shows what its folder holds",
                args.name, driver.host, driver.pid
            )));
        }
    }
    let Some(last) = record.attempts.len().checked_sub(1) else {
        say!("trainyard: run `{}` has not started yet", args.name);
        return Ok(());
    };
    let mut attempt = match args.attempt {
        None => last,
        Some(k) if k <= last => k,
        Some(k) => {
            return Err(Failure::bad_input(FlagError::new(
                "--attempt",
                &k.to_string(),
            )(
                format!(
                    "run `{}` has {} attempt{} (0 to {last})",
                    args.name,
                    last + 1,
                    if last == 0 { "" } else { "s" }
                )
                .into(),
            )));
        }
    };
    let ranks = match &args.rank {
        Some(list) => {
            let world = record.attempts[attempt]
                .world_size
                .or(record.attempts[attempt].resized_to)
                .unwrap_or(u32::MAX);
            Some(
                list.within_for("--rank", world)
                    .map_err(Failure::bad_input)?,
            )
        }
        None => None,
    };
    if last > 0 && args.format == OutputFormat::Text {
        say!(
            "trainyard: attempt {attempt} of run `{}` (attempts 0 to {last}; --attempt K shows another)",
            args.name
        );
    }
    let mut out = Printer {
        format: args.format,
        timestamps: args.timestamps,
        out: io::stdout().lock(),
    };
    let following = args.follow && liveness == DriverLiveness::Alive;
    let mut source = locate(&runtime, &folder, &record, attempt)?;
    if source.is_none() && !following {
        say!(
            "trainyard: attempt {attempt} of run `{}` left no log files",
            args.name
        );
        return Ok(());
    }
    let mut tail = Tail::default();
    let mut record_read = Instant::now();
    let mut unreadable = 0u32;
    // `--tail N`: of what was there when this began, the last N lines.
    if let (Some(n), Some(source)) = (args.tail, &source) {
        if !out.lines(attempt, tail.last(&source.dir, ranks.as_ref(), n))? {
            return Ok(());
        }
    }
    loop {
        if let Some(source) = &source {
            if !out.all_lines(attempt, &mut tail, &source.dir, ranks.as_ref())? {
                return Ok(());
            }
        }
        if !following {
            return Ok(());
        }
        std::thread::sleep(POLL);
        if record_read.elapsed() < RECORD_EVERY {
            continue;
        }
        record_read = Instant::now();
        let Ok(Some(now)) = runtime.block_on(folder.load()) else {
            unreadable += 1;
            if unreadable >= UNREADABLE_LIMIT {
                return Err(Failure::other(format!(
                    "the record of run `{}` could not be read for {:?}: stopped following it",
                    args.name,
                    RECORD_EVERY * UNREADABLE_LIMIT
                )));
            }
            continue;
        };
        unreadable = 0;
        // A given attempt is followed to its own end.
        let attempt_ended = args.attempt.is_some()
            && now
                .attempts
                .get(attempt)
                .is_some_and(|a| a.ended_at.is_some());
        let ended = attempt_ended || driver_liveness(&now) != DriverLiveness::Alive;
        let next = now.attempts.len().saturating_sub(1);
        let moved_on = args.attempt.is_none() && next > attempt;
        if ended || moved_on || source.is_none() {
            // What the attempt wrote last, before leaving it.
            if let Some(source) = &source {
                if !out.all_lines(attempt, &mut tail, &source.dir, ranks.as_ref())? {
                    return Ok(());
                }
            }
        }
        if moved_on {
            attempt = next;
            tail = Tail::default();
            source = None;
            if args.format == OutputFormat::Text {
                say!(
                    "trainyard: attempt {attempt} of run `{}` started",
                    args.name
                );
            }
        }
        if source.is_none() {
            source = locate(&runtime, &folder, &now, attempt)?;
        }
        if ended && !moved_on {
            if let Some(source) = &source {
                out.all_lines(attempt, &mut tail, &source.dir, ranks.as_ref())?;
            }
            return Ok(());
        }
    }
}

/// Writes lines as text or JSON.
struct Printer<'a> {
    format: OutputFormat,
    timestamps: bool,
    out: io::StdoutLock<'a>,
}

impl Printer<'_> {
    /// Prints what `tail` has not read yet of the rank files of `dir`, a chunk at a time;
    /// `false` once stdout is closed.
    fn all_lines(
        &mut self,
        attempt: usize,
        tail: &mut Tail,
        dir: &std::path::Path,
        ranks: Option<&std::collections::BTreeSet<u32>>,
    ) -> Result<bool, Failure> {
        loop {
            if !self.lines(attempt, tail.read(dir, ranks))? {
                return Ok(false);
            }
            if !tail.has_more() {
                return Ok(true);
            }
        }
    }

    /// Prints `lines`; `false` once stdout is closed (`| head`), when there is no more to do.
    fn lines(&mut self, attempt: usize, lines: Vec<LogLine>) -> Result<bool, Failure> {
        if lines.is_empty() {
            return Ok(true);
        }
        let mut written = Ok(());
        for line in lines {
            written = match self.format {
                OutputFormat::Text if self.timestamps => {
                    writeln!(self.out, "{} (rank={}) {}", line.time, line.rank, line.text)
                }
                OutputFormat::Text => writeln!(self.out, "(rank={}) {}", line.rank, line.text),
                OutputFormat::Json => {
                    let time = humantime::parse_rfc3339(&line.time)
                        .ok()
                        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|since| since.as_secs_f64());
                    let value = serde_json::json!({
                        "time": time,
                        "attempt": attempt,
                        "rank": line.rank,
                        "stream": line.stream,
                        "line": line.text,
                    });
                    writeln!(self.out, "{value}")
                }
            };
            if written.is_err() {
                break;
            }
        }
        match written.and_then(|()| self.out.flush()) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(false),
            Err(error) => Err(Failure::output(error)),
        }
    }
}
