//! Every rank's output in files of their own: `<dir>/rank_<r>.log` per attempt, each line
//! stamped with the time the driver took it in. A thread of its own writes them, so that a
//! slow disk holds up neither the run nor its console.
//!
//! The folder is made with mode 0700 and every file in it with mode 0600, through
//! `trainyard_sys::private`: never through a link, and a folder or file already there (a
//! `--log-dir` used before) is used only when it is this user's (a folder writable by no one
//! else), so that in a shared folder another user's `attempt_0` or `rank_0.log` is refused.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};

use tracing::warn;
use trainyard_runtime::Stream;

/// How many lines wait for the writer before lines are dropped from the files (the console
/// still shows them).
const BACKLOG: usize = 65_536;

/// How long closing waits for the writer to write what is queued.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

/// What the writer thread is asked to do.
enum Entry {
    /// One line of one rank.
    Line {
        rank: usize,
        at: SystemTime,
        stream: Stream,
        line: String,
    },
    /// A whole file beside the rank logs (a stack dump).
    File { name: String, text: String },
}

/// The log files of one attempt.
#[derive(Debug)]
pub(crate) struct RankLogs {
    dir: PathBuf,
    tx: Option<SyncSender<Entry>>,
    writer: Option<std::thread::JoinHandle<u64>>,
    /// Lines the writer had no room for.
    dropped: u64,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Entry")
    }
}

/// The file of world rank `rank` in an attempt's log folder `dir`.
#[must_use]
pub(crate) fn rank_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("rank_{rank}.log"))
}

impl RankLogs {
    /// Makes `dir` (mode 0700) and starts the writer of `world_size` rank files in it. A
    /// folder that cannot be made (or an empty path) is logged, and the run goes on without
    /// files.
    pub(crate) fn open(dir: PathBuf, world_size: usize) -> Self {
        let (tx, rx) = sync_channel(BACKLOG);
        // An empty path: the caller has no folder for them (and says why).
        let made = if dir.as_os_str().is_empty() {
            Err(std::io::Error::from(std::io::ErrorKind::NotFound))
        } else {
            trainyard_sys::private::dir_all(&dir)
        };
        let writer = match made {
            Ok(()) => {
                let at = dir.clone();
                std::thread::Builder::new()
                    .name("trainyard-logs".to_owned())
                    .spawn(move || write_all(&at, world_size, &rx))
                    .map_err(|error| warn!(%error, "cannot start the log writer"))
                    .ok()
            }
            Err(error) => {
                warn!(dir = %dir.display(), %error, "cannot make the log folder; the ranks' output is not written to files");
                None
            }
        };
        Self {
            dir,
            tx: writer.is_some().then_some(tx),
            writer,
            dropped: 0,
        }
    }

    /// The attempt's log folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queues one line of world rank `rank`; never waits.
    pub(crate) fn line(&mut self, rank: usize, stream: Stream, line: &str) {
        let Some(tx) = &self.tx else {
            return;
        };
        let entry = Entry::Line {
            rank,
            at: SystemTime::now(),
            stream,
            line: line.to_owned(),
        };
        match tx.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.dropped += 1,
            Err(TrySendError::Disconnected(_)) => self.tx = None,
        }
    }

    /// Queues a whole file, written beside the rank files; its path.
    pub(crate) fn file(&mut self, name: &str, text: String) -> PathBuf {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(Entry::File {
                name: name.to_owned(),
                text,
            });
        }
        self.dir.join(name)
    }

    /// Writes what is queued and closes the files (waiting at most a few seconds).
    pub(crate) async fn close(mut self) {
        self.tx = None;
        let dropped = self.dropped;
        let Some(writer) = self.writer.take() else {
            return;
        };
        let joined = tokio::task::spawn_blocking(move || writer.join());
        match tokio::time::timeout(CLOSE_LIMIT, joined).await {
            Ok(Ok(Ok(failed))) if failed + dropped > 0 => warn!(
                dir = %self.dir.display(),
                lines = failed + dropped,
                "some output lines could not be written to the log files"
            ),
            Ok(_) => {}
            Err(_) => {
                warn!(dir = %self.dir.display(), "the log files were not all written in time")
            }
        }
    }
}

/// Creates the file at `path` for writing, mode 0600, never through a link: anew, or, when
/// this user's regular file is there already, emptied.
fn create(path: &Path) -> std::io::Result<File> {
    trainyard_sys::private::create(path)
}

/// The writer thread: appends each line to its rank's file until the sender is gone; how
/// many lines could not be written.
fn write_all(dir: &Path, world_size: usize, rx: &Receiver<Entry>) -> u64 {
    let mut files: Vec<Option<BufWriter<File>>> = (0..world_size).map(|_| None).collect();
    let mut failed = 0u64;
    loop {
        // Flushed whenever the queue runs dry, so that a reader sees lines soon.
        let entry = match rx.try_recv() {
            Ok(entry) => entry,
            Err(TryRecvError::Empty) => {
                for file in files.iter_mut().flatten() {
                    let _ = file.flush();
                }
                match rx.recv() {
                    Ok(entry) => entry,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match entry {
            Entry::Line {
                rank,
                at,
                stream,
                line,
            } => {
                let Some(slot) = files.get_mut(rank) else {
                    continue;
                };
                if slot.is_none() {
                    let rank_u32 = u32::try_from(rank).unwrap_or(u32::MAX);
                    *slot = create(&rank_file(dir, rank_u32)).map(BufWriter::new).ok();
                }
                let stream = match stream {
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                };
                let written = slot.as_mut().is_some_and(|file| {
                    writeln!(
                        file,
                        "{} {stream} {line}",
                        humantime::format_rfc3339_millis(at)
                    )
                    .is_ok()
                });
                if !written {
                    failed += 1;
                }
            }
            Entry::File { name, text } => {
                // Whole or not at all: a reader (`trainyard stacks`) waits for the name.
                let path = dir.join(&name);
                let part = dir.join(format!(".{name}.part"));
                let written = create(&part)
                    .and_then(|mut file| file.write_all(text.as_bytes()))
                    .and_then(|()| std::fs::rename(&part, &path));
                if let Err(error) = written {
                    let _ = std::fs::remove_file(&part);
                    warn!(file = %path.display(), %error, "cannot write the stack dump");
                }
            }
        }
    }
    for file in files.iter_mut().flatten() {
        if file.flush().is_err() {
            failed += 1;
        }
    }
    failed
}
