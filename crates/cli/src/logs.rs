//! `trainyard logs NAME`: one attempt's rank logs (the latest, or `--attempt K`), every rank's
//! lines merged by the time the driver took them in; `-f` follows a live run — into its next
//! attempt when it restarts — and ends when the run ends.
//!
//! The files are read where the driver writes them as the attempt runs (this host), else from
//! the run folder: a local one's `logs/attempt_<k>`, or the copy remote storage gets when the
//! attempt ends.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use itertools::Itertools as _;
use trainyard::backend::{DriverLiveness, driver_liveness};
use trainyard::checkpoint::{RunFolder, RunRecord};

use crate::Failure;
use crate::args::{LogsArgs, OutputFormat};
use crate::ps::{find_run, open_storage, runtime};
use crate::values::FlagError;

/// How often a followed run's files are read for new lines.
const POLL: Duration = Duration::from_millis(100);
/// How often a followed run's record is read for a new attempt or its end.
const RECORD_EVERY: Duration = Duration::from_millis(500);
/// How many reads of a followed run's record in a row may fail before following stops.
const UNREADABLE_LIMIT: u32 = 60;
/// The longest line kept whole; a longer one is cut.
const MAX_LINE: usize = 1024 * 1024;

pub(crate) fn run(args: &LogsArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let runtime = runtime()?;
    let (folder, record) = find_run(&storage, &runtime, &args.name)?;
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
    let mut first = args.tail;
    loop {
        if let Some(source) = &source {
            let mut lines = tail.read(&source.dir, ranks.as_ref());
            // `--tail N`: of what was there when this began, the last N lines.
            if let Some(keep) = first.take() {
                lines.drain(..lines.len().saturating_sub(keep));
            }
            if !out.lines(attempt, lines)? {
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
                if !out.lines(attempt, tail.read(&source.dir, ranks.as_ref()))? {
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
                out.lines(attempt, tail.read(&source.dir, ranks.as_ref()))?;
            }
            return Ok(());
        }
    }
}

/// Where an attempt's rank logs are read from.
pub(crate) struct Source {
    pub(crate) dir: PathBuf,
    /// A download of remote storage's copy, removed at the end.
    _download: Option<trainyard_sys::private::TempDir>,
}

/// Attempt `attempt`'s log folder: where its driver writes (or wrote) it when that is on this
/// host, else the run folder's (a remote one's downloaded); `None` when there is none yet.
fn locate(
    runtime: &tokio::runtime::Runtime,
    folder: &RunFolder,
    record: &RunRecord,
    attempt: usize,
) -> Result<Option<Source>, Failure> {
    runtime.block_on(locate_async(folder, record, attempt))
}

/// [`locate`], on the caller's runtime.
pub(crate) async fn locate_async(
    folder: &RunFolder,
    record: &RunRecord,
    attempt: usize,
) -> Result<Option<Source>, Failure> {
    // Where the record says its driver writes them, when that folder is this user's (a
    // record on remote storage may name any folder).
    let written = record.attempts[attempt]
        .log_dir
        .as_deref()
        .map(PathBuf::from)
        .filter(|dir| trainyard_sys::private::check_dir(dir).is_ok());
    if let Some(dir) = written {
        return Ok(Some(Source {
            dir,
            _download: None,
        }));
    }
    // This user's alone (0700, its files 0600): the logs are the run's.
    let download = trainyard_sys::private::temp_dir("trainyard-logs-").map_err(Failure::other)?;
    let found = folder
        .attempt_logs(attempt, download.path())
        .await
        .map_err(Failure::other)?;
    Ok(found.map(|dir| Source {
        _download: (dir == download.path()).then_some(download),
        dir,
    }))
}

/// One line of a rank's log file.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct LogLine {
    /// When the driver took it in (RFC 3339, UTC, milliseconds: they sort as text).
    pub(crate) time: String,
    pub(crate) rank: u32,
    pub(crate) stream: String,
    pub(crate) text: String,
}

/// What has been read of each rank's file in one log folder.
#[derive(Default)]
struct Tail {
    files: BTreeMap<u32, RankFile>,
}

/// One rank's file: open, and the end of a line not yet written whole.
struct RankFile {
    file: File,
    partial: Vec<u8>,
    /// The time of its last line: a line without one (cut, or over-long) takes it.
    last_time: String,
}

impl Tail {
    /// Every whole line written to the rank files of `dir` since the last read (`ranks`'
    /// only, when given), merged by time.
    fn read(
        &mut self,
        dir: &Path,
        ranks: Option<&std::collections::BTreeSet<u32>>,
    ) -> Vec<LogLine> {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(rank) = name.to_str().and_then(rank_of) else {
                    continue;
                };
                if self.files.contains_key(&rank) || ranks.is_some_and(|r| !r.contains(&rank)) {
                    continue;
                }
                if let Some(file) = open_regular(&entry.path()) {
                    self.files.insert(
                        rank,
                        RankFile {
                            file,
                            partial: Vec::new(),
                            last_time: String::new(),
                        },
                    );
                }
            }
        }
        let per_rank: Vec<Vec<LogLine>> = self
            .files
            .iter_mut()
            .map(|(rank, file)| file.new_lines(*rank))
            .collect();
        per_rank
            .into_iter()
            .kmerge_by(|a, b| a.time < b.time)
            .collect()
    }
}

impl RankFile {
    /// The whole lines written since the last read.
    fn new_lines(&mut self, rank: u32) -> Vec<LogLine> {
        let mut bytes = Vec::new();
        if self.file.read_to_end(&mut bytes).is_err() && bytes.is_empty() {
            return Vec::new();
        }
        self.partial.extend_from_slice(&bytes);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
            if self.partial.len() > MAX_LINE {
                self.partial.push(b'\n');
                return self.new_lines(rank);
            }
            return Vec::new();
        };
        let whole: Vec<u8> = self.partial.drain(..=end).collect();
        whole
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| {
                let text = String::from_utf8_lossy(line);
                let parsed = parse(&text);
                let line = match parsed {
                    Some((time, stream, text)) => LogLine {
                        time: time.to_owned(),
                        rank,
                        stream: stream.to_owned(),
                        text: text.to_owned(),
                    },
                    None => LogLine {
                        time: self.last_time.clone(),
                        rank,
                        stream: "stdout".to_owned(),
                        text: text.into_owned(),
                    },
                };
                self.last_time.clone_from(&line.time);
                line
            })
            .collect()
    }
}

/// The last `lines` lines of each rank's file in `dir` (read from its last `bytes` at most).
pub(crate) fn tails(dir: &Path, lines: usize, bytes: u64) -> BTreeMap<u32, Vec<LogLine>> {
    use std::io::{Seek as _, SeekFrom};
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    let mut tails = BTreeMap::new();
    for entry in entries.flatten() {
        let Some(rank) = entry.file_name().to_str().and_then(rank_of) else {
            continue;
        };
        let Some(mut file) = open_regular(&entry.path()) else {
            continue;
        };
        let size = file.metadata().map_or(0, |meta| meta.len());
        let from = size.saturating_sub(bytes);
        if file.seek(SeekFrom::Start(from)).is_err() {
            continue;
        }
        let mut rank_file = RankFile {
            file,
            partial: Vec::new(),
            last_time: String::new(),
        };
        let mut read = rank_file.new_lines(rank);
        // A read from the middle of the file: its first line is likely cut.
        if from > 0 && !read.is_empty() {
            read.remove(0);
        }
        let keep = read.len().saturating_sub(lines);
        tails.insert(rank, read.split_off(keep));
    }
    tails
}

/// The regular file at `path`, opened to read, never through a link (and a FIFO planted
/// there does not block the open).
pub(crate) fn open_regular(path: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(path)
        .ok()
        .filter(|file| file.metadata().is_ok_and(|meta| meta.is_file()))
}

/// `rank_3.log` → 3.
fn rank_of(name: &str) -> Option<u32> {
    name.strip_prefix("rank_")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// A log file's line, `TIME STREAM TEXT`, as its parts.
fn parse(line: &str) -> Option<(&str, &str, &str)> {
    let (time, rest) = line.split_once(' ')?;
    humantime::parse_rfc3339(time).ok()?;
    let (stream, text) = rest.split_once(' ').unwrap_or((rest, ""));
    matches!(stream, "stdout" | "stderr").then_some((time, stream, text))
}

/// Writes lines as text or JSON.
struct Printer<'a> {
    format: OutputFormat,
    timestamps: bool,
    out: io::StdoutLock<'a>,
}

impl Printer<'_> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_its_time_stream_and_text() {
        assert_eq!(
            parse("2026-12-03T12:00:00.123Z stdout hello world"),
            Some(("2026-12-03T12:00:00.123Z", "stdout", "hello world"))
        );
        assert_eq!(
            parse("2026-12-03T12:00:00.123Z stderr "),
            Some(("2026-12-03T12:00:00.123Z", "stderr", ""))
        );
        assert_eq!(parse("no time here"), None);
        assert_eq!(parse("2026-12-03T12:00:00.123Z other text"), None);
        assert_eq!(rank_of("rank_12.log"), Some(12));
        assert_eq!(rank_of("stacks-2026.txt"), None);
        assert_eq!(rank_of("rank_x.log"), None);
    }

    #[test]
    fn ranks_are_merged_by_time_each_in_its_own_order_and_half_lines_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("rank_0.log"),
            "2026-12-03T12:00:00.100Z stdout a\n2026-12-03T12:00:00.300Z stdout c\n",
        )
        .expect("written");
        std::fs::write(
            dir.path().join("rank_1.log"),
            "2026-12-03T12:00:00.200Z stderr b\n2026-12-03T12:00:00.400Z stdout d-half",
        )
        .expect("written");
        std::fs::write(dir.path().join("stacks-x.txt"), "not a rank\n").expect("written");
        let mut tail = Tail::default();
        let texts = |lines: Vec<LogLine>| -> Vec<(u32, String)> {
            lines.into_iter().map(|l| (l.rank, l.text)).collect()
        };
        assert_eq!(
            texts(tail.read(dir.path(), None)),
            [(0, "a".into()), (1, "b".into()), (0, "c".into())]
        );
        let mut rank1 = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("rank_1.log"))
            .expect("opened");
        writeln!(rank1, "-done").expect("appended");
        assert_eq!(
            texts(tail.read(dir.path(), None)),
            [(1, "d-half-done".into())]
        );
        assert!(tail.read(dir.path(), None).is_empty(), "nothing new");

        let only = std::collections::BTreeSet::from([1]);
        assert_eq!(
            texts(Tail::default().read(dir.path(), Some(&only))),
            [(1, "b".into()), (1, "d-half-done".into())]
        );
    }
}
