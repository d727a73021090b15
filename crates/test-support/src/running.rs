//! [`Running`]: a process a test started and reads while it runs.

use std::io::{BufRead as _, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the output of a process that ended may stay open (something it started may hold
/// it) before the test stops reading it.
const DRAIN: Duration = Duration::from_secs(10);

/// A process a test started (killed and reaped should the test end first): its stdout read
/// line by line as it comes, each line with when it came, and its stderr read whole alongside,
/// so that neither pipe fills and holds the process up.
#[derive(Debug)]
pub struct Running {
    child: Child,
    lines: Receiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
    stderr: Option<Alongside>,
}

/// How a [`Running`] process ended: its status, when it was seen to end, and what it printed.
#[derive(Debug)]
pub struct Ended {
    pub status: ExitStatus,
    /// When the process was seen to have ended (within 20 ms of it).
    pub at: Instant,
    /// Its stdout, line by line, each with when it came.
    pub lines: Vec<(Instant, String)>,
    pub stdout: String,
    pub stderr: String,
}

impl Ended {
    /// Its exit code (`None` when a signal ended it).
    #[must_use]
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// All it printed: stdout, then stderr.
    #[must_use]
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

impl Running {
    /// Starts `command` with its stdout and stderr piped (its stdin as the command says).
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn start(command: &mut Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the process starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let stderr = read_alongside(stderr);
        Self {
            child,
            lines,
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// The process's id.
    #[must_use]
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line and when it came, if one comes within `within` (`None` too once
    /// stdout has ended).
    pub fn next_line(&mut self, within: Duration) -> Option<(Instant, String)> {
        let line = self.lines.recv_timeout(within).ok()?;
        self.seen.push(line.clone());
        Some(line)
    }

    /// When the first stdout line holding `needle` came: one read already, or one that comes
    /// within `within`.
    pub fn wait_for(&mut self, needle: &str, within: Duration) -> Option<Instant> {
        if let Some((at, _)) = self.seen.iter().find(|(_, line)| line.contains(needle)) {
            return Some(*at);
        }
        let deadline = Instant::now() + within;
        loop {
            let (at, line) = self.next_line(deadline.saturating_duration_since(Instant::now()))?;
            if line.contains(needle) {
                return Some(at);
            }
        }
    }

    /// [`wait_for`](Self::wait_for), where the line must come.
    ///
    /// # Panics
    /// When it does not, showing what the process printed (after killing it).
    pub fn expect_line(&mut self, needle: &str, within: Duration) -> Instant {
        match self.wait_for(needle, within) {
            Some(at) => at,
            None => {
                self.kill();
                panic!(
                    "no line with `{needle}` on stdout within {within:?}; it printed:\n{}\nstderr:\n{}",
                    self.stdout(),
                    self.stderr_by(Instant::now() + Duration::from_secs(5))
                );
            }
        }
    }

    /// The stdout lines read so far.
    #[must_use]
    pub fn stdout(&self) -> String {
        let lines: Vec<&str> = self.seen.iter().map(|(_, line)| line.as_str()).collect();
        lines.join("\n")
    }

    /// Its stderr (once, taken): all of it once the pipe has ended, else what came by `until`.
    fn stderr_by(&mut self, until: Instant) -> String {
        self.stderr.take().map_or_else(String::new, |reader| {
            String::from_utf8_lossy(&reader.gathered(until)).into_owned()
        })
    }

    /// Kills the process (SIGKILL) and reaps it, if it still runs.
    pub fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Waits for the process to end and for the rest of its output.
    ///
    /// # Panics
    /// When it runs past `within` (it is killed first), showing what it printed.
    pub fn finish(mut self, within: Duration) -> Ended {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!(
                    "the process did not end within {within:?}; stdout:\n{}\nstderr:\n{}",
                    self.stdout(),
                    self.stderr_by(Instant::now() + Duration::from_secs(5))
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let at = Instant::now();
        let drained = Instant::now() + DRAIN;
        while let Some(left) = drained.checked_duration_since(Instant::now()) {
            if self.next_line(left).is_none() {
                break;
            }
        }
        let stderr = self.stderr_by(drained);
        Ended {
            status,
            at,
            stdout: self.stdout(),
            lines: std::mem::take(&mut self.seen),
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A pipe read to its end on a thread of its own ([`read_alongside`]).
#[derive(Debug)]
pub(crate) struct Alongside {
    read: Arc<Mutex<Vec<u8>>>,
    thread: JoinHandle<()>,
}

/// Reads `pipe` to its end on a thread of its own.
pub(crate) fn read_alongside(mut pipe: impl Read + Send + 'static) -> Alongside {
    let read = Arc::new(Mutex::new(Vec::new()));
    let into = Arc::clone(&read);
    let thread = std::thread::spawn(move || {
        let mut chunk = [0_u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => into
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend_from_slice(&chunk[..n]),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
    Alongside { read, thread }
}

impl Alongside {
    /// What was read: all of it once the pipe has ended, or by `until` what came so far,
    /// with a note that something the process left holds the pipe open.
    pub(crate) fn gathered(self, until: Instant) -> Vec<u8> {
        while !self.thread.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let ended = self.thread.is_finished();
        let mut bytes =
            std::mem::take(&mut *self.read.lock().unwrap_or_else(PoisonError::into_inner));
        if !ended {
            bytes.extend_from_slice(
                b"\n(the output is still held open by something the process left)",
            );
        }
        bytes
    }
}
