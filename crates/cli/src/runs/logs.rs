//! An attempt's rank logs and stack dumps: where they are ([`locate`]: where the driver writes
//! them when that is this host and this user's folder, else the run folder's copy, a remote
//! one's downloaded into a private folder), what has been written to them since the last read
//! ([`Tail`], merged by time), their last lines ([`tails`]) and the stack dumps beside them
//! ([`stack_dumps`]). Files are opened through `trainyard_sys::private::open_regular`: never
//! through a link, and a FIFO does not block.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use itertools::Itertools as _;
use trainyard::checkpoint::{RunFolder, RunRecord};

use crate::Failure;

/// The longest line kept whole; a longer one is cut.
const MAX_LINE: usize = 1024 * 1024;

/// Where an attempt's rank logs are read from.
#[derive(Debug)]
pub(crate) struct Source {
    pub(crate) dir: PathBuf,
    /// A download of remote storage's copy, removed at the end.
    download: Option<trainyard_sys::private::TempDir>,
}

impl Source {
    /// Whether it is a download of remote storage's copy.
    pub(crate) fn is_download(&self) -> bool {
        self.download.is_some()
    }
}

/// Attempt `attempt`'s log folder: where its driver writes (or wrote) it when that is on this
/// host, else the run folder's (a remote one's downloaded); `None` when there is none yet.
pub(crate) fn locate(
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
            download: None,
        }));
    }
    // This user's alone (0700, its files 0600): the logs are the run's.
    let download = trainyard_sys::private::temp_dir("trainyard-logs-").map_err(Failure::other)?;
    let found = folder
        .attempt_logs(attempt, download.path())
        .await
        .map_err(Failure::other)?;
    Ok(found.map(|dir| Source {
        download: (dir == download.path()).then_some(download),
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

/// What has been read of each rank's file in one log folder. Files are read a bounded chunk
/// at a time ([`CHUNK`]), so that a large log is streamed, never held whole.
#[derive(Default)]
pub(crate) struct Tail {
    files: BTreeMap<u32, RankFile>,
    /// Whether the last read left more to read at once (a rank's chunk was full).
    more: bool,
}

/// The most of one rank's file one read takes in.
const CHUNK: u64 = 1024 * 1024;

/// One rank's file: open, and the end of a line not yet written whole.
struct RankFile {
    file: File,
    partial: Vec<u8>,
    /// The time of its last line: a line without one (cut, or over-long) takes it.
    last_time: String,
    /// Whether its last read filled a whole [`CHUNK`] (more may be there).
    full: bool,
}

impl Tail {
    /// The whole lines written to the rank files of `dir` since the last read (`ranks'` only,
    /// when given), merged by time: at most a [`CHUNK`] of each file; [`Self::has_more`] says
    /// whether there is more to read at once.
    pub(crate) fn read(
        &mut self,
        dir: &Path,
        ranks: Option<&std::collections::BTreeSet<u32>>,
    ) -> Vec<LogLine> {
        self.open_new(dir, ranks);
        let per_rank: Vec<Vec<LogLine>> = self
            .files
            .iter_mut()
            .map(|(rank, file)| file.new_lines(*rank))
            .collect();
        self.more = self.files.values().any(|file| file.full);
        per_rank
            .into_iter()
            .kmerge_by(|a, b| a.time < b.time)
            .collect()
    }

    /// Whether the last [`Self::read`] left more of a file to read at once.
    pub(crate) fn has_more(&self) -> bool {
        self.more
    }

    /// The last `n` lines of what the rank files of `dir` hold now (`ranks'` only, when
    /// given), merged by time, each read from its last [`CHUNK`] at most; the next
    /// [`Self::read`] takes what is written after them.
    pub(crate) fn last(
        &mut self,
        dir: &Path,
        ranks: Option<&std::collections::BTreeSet<u32>>,
        n: usize,
    ) -> Vec<LogLine> {
        use std::io::{Seek as _, SeekFrom};
        self.open_new(dir, ranks);
        let mut per_rank = Vec::new();
        for (rank, file) in &mut self.files {
            let size = file.file.metadata().map_or(0, |meta| meta.len());
            let from = size.saturating_sub(CHUNK);
            if file.file.seek(SeekFrom::Start(from)).is_err() {
                continue;
            }
            let mut read = file.new_lines(*rank);
            // A read from the middle of the file: its first line is likely cut.
            if from > 0 && !read.is_empty() {
                read.remove(0);
            }
            per_rank.push(read.split_off(read.len().saturating_sub(n)));
        }
        let mut merged: Vec<LogLine> = per_rank
            .into_iter()
            .kmerge_by(|a, b| a.time < b.time)
            .collect();
        merged.drain(..merged.len().saturating_sub(n));
        merged
    }

    /// Opens the rank files of `dir` not open yet (`ranks'` only, when given).
    fn open_new(&mut self, dir: &Path, ranks: Option<&std::collections::BTreeSet<u32>>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(rank) = name.to_str().and_then(rank_of) else {
                    continue;
                };
                if self.files.contains_key(&rank) || ranks.is_some_and(|r| !r.contains(&rank)) {
                    continue;
                }
                if let Ok(file) = trainyard_sys::private::open_regular(&entry.path()) {
                    self.files.insert(rank, RankFile::new(file));
                }
            }
        }
    }
}

impl RankFile {
    fn new(file: File) -> Self {
        Self {
            file,
            partial: Vec::new(),
            last_time: String::new(),
            full: false,
        }
    }

    /// The whole lines written since the last read, of at most a [`CHUNK`] more of the file.
    fn new_lines(&mut self, rank: u32) -> Vec<LogLine> {
        let mut bytes = Vec::new();
        let read = (&mut self.file).take(CHUNK).read_to_end(&mut bytes);
        self.full = matches!(read, Ok(n) if n as u64 == CHUNK);
        if read.is_err() && bytes.is_empty() {
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
        let Some(mut file) = trainyard_sys::private::open_regular(&entry.path()).ok() else {
            continue;
        };
        let size = file.metadata().map_or(0, |meta| meta.len());
        let from = size.saturating_sub(bytes);
        if file.seek(SeekFrom::Start(from)).is_err() {
            continue;
        }
        let mut rank_file = RankFile::new(file);
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

/// The stack dumps in `dir`, by name, with their inodes (a dump written again under the
/// same name is a new file).
pub(crate) fn stack_dumps(dir: &Path) -> BTreeMap<String, u64> {
    // Only in a folder of this user's (a record on remote storage may name any).
    if trainyard_sys::private::check_dir(dir).is_err() {
        return BTreeMap::new();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let dump = name.starts_with("stacks-") && name.ends_with(".txt");
            let meta = entry.metadata().ok().filter(|meta| meta.is_file())?;
            dump.then_some((name, meta.ino()))
        })
        .collect()
}

/// The text of the stack dump `file`, when it can be read (a regular file, no link).
pub(crate) fn read_dump(file: &Path) -> Option<String> {
    let mut text = String::new();
    trainyard_sys::private::open_regular(file)
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

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

    #[test]
    fn a_large_log_is_read_a_chunk_at_a_time_every_line_once_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut text = String::new();
        let mut n = 0;
        while text.len() < 3 * CHUNK as usize {
            text.push_str(&format!(
                "2026-12-03T12:00:00.100Z stdout line {n} {}\n",
                "x".repeat(100)
            ));
            n += 1;
        }
        std::fs::write(dir.path().join("rank_0.log"), &text).expect("written");
        let mut tail = Tail::default();
        let mut seen = Vec::new();
        let mut reads = 0;
        loop {
            let lines = tail.read(dir.path(), None);
            reads += 1;
            assert!(lines.len() < n, "one read never takes the whole file");
            seen.extend(lines.into_iter().map(|line| line.text));
            if !tail.has_more() {
                break;
            }
        }
        assert!(reads >= 3, "{reads} reads");
        assert_eq!(seen.len(), n);
        for (i, text) in seen.iter().enumerate() {
            assert!(text.starts_with(&format!("line {i} ")), "{i}: {text}");
        }
        let last = Tail::default().last(dir.path(), None, 2);
        assert_eq!(last.len(), 2);
        assert!(last[1].text.starts_with(&format!("line {} ", n - 1)));
    }
}
