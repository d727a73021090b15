//! What the agent process writes to its stdout and stderr: a function task's output.
//!
//! A function task runs inside the agent, so its `println!` and `eprintln!` (and those of
//! the processes it starts without redirecting them) write to the agent's own fds 1 and 2.
//! At startup the agent points both at pipes of its own ([`redirect`]) and keeps a private
//! duplicate of its original stderr for its own diagnostics ([`Diagnostics`]), which are
//! never task output. A reader per pipe ([`TaskOutput`]) turns what arrives into lines: while a
//! function task runs they are its [`TaskEvent::Log`](trainyard_runtime::TaskEvent::Log)
//! lines, in order per stream; while none runs they go to the agent's original stderr, so
//! that nothing printed between tasks is lost. Command tasks have pipes of their own and
//! are not concerned.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::fcntl::OFlag;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};
use trainyard_runtime::Stream;
use trainyard_runtime::events::EventSender;

use crate::diagnostics::Diagnostics;
use crate::lines::Lines;

/// How long the end of a function task waits for its last output to be read.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The read ends of the pipes that fds 1 and 2 now write to; `None` for a stream left as
/// it was (its pipe could not be made).
#[derive(Debug, Default)]
pub(crate) struct Pipes {
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

/// Points fds 1 and 2 at pipes of the agent's own, after keeping its original stderr: the
/// agent's [`Diagnostics`] from now on. A stream that cannot be redirected is left as it was,
/// and the agent says so.
pub(crate) fn redirect() -> (Pipes, Diagnostics) {
    let original = match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(original) => original,
        Err(error) => {
            let diagnostics = Diagnostics::default();
            diagnostics.diagnose(format_args!(
                "trainyard agent: cannot keep its stderr, so function output is not captured: {error}"
            ));
            return (Pipes::default(), diagnostics);
        }
    };
    let diagnostics = Diagnostics::to(File::from(original));
    // What Rust's stdout holds belongs to the old fd 1.
    let _ = std::io::stdout().flush();
    let stdout = redirect_one(Stream::Stdout, &diagnostics, |fd| {
        nix::unistd::dup2_stdout(fd)
    });
    let stderr = redirect_one(Stream::Stderr, &diagnostics, |fd| {
        nix::unistd::dup2_stderr(fd)
    });
    (Pipes { stdout, stderr }, diagnostics)
}

/// Makes a pipe and puts its write end in place with `install`; its read end.
fn redirect_one(
    stream: Stream,
    diagnostics: &Diagnostics,
    install: impl FnOnce(&OwnedFd) -> nix::Result<()>,
) -> Option<OwnedFd> {
    // Close-on-exec: the copy `install` makes is the one a task's processes may inherit.
    let made = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .and_then(|(read, write)| install(&write).map(|()| read));
    match made {
        Ok(read) => Some(read),
        Err(error) => {
            diagnostics.diagnose(format_args!(
                "trainyard agent: cannot capture its {stream:?}, so function output there is not captured: {error}"
            ));
            None
        }
    }
}

/// Where the lines read go: the running function task's events, else the original stderr.
#[derive(Debug, Default)]
struct Target {
    task: Mutex<Option<EventSender>>,
    diagnostics: Diagnostics,
}

impl Target {
    fn set(&self, events: Option<EventSender>) {
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = events;
    }

    fn line(&self, stream: Stream, line: &[u8]) {
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        match task.as_ref() {
            Some(events) => events.log(stream, String::from_utf8_lossy(line)),
            None => self.diagnostics.diagnose(String::from_utf8_lossy(line)),
        }
    }
}

/// The readers of the agent's stdout and stderr pipes, and where their lines go; see the
/// [module docs](self). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct TaskOutput {
    target: Arc<Target>,
    /// Asks each reader to pass on everything written so far, and to say when it has.
    flushes: Vec<mpsc::UnboundedSender<oneshot::Sender<()>>>,
}

impl TaskOutput {
    /// Starts a reader for each of `pipes`; what is read while no task runs goes to
    /// `diagnostics`. Must be called within a tokio runtime.
    pub(crate) fn start(pipes: Pipes, diagnostics: Diagnostics) -> Self {
        let mut output = Self {
            target: Arc::new(Target {
                task: Mutex::default(),
                diagnostics,
            }),
            flushes: Vec::new(),
        };
        for (stream, read) in [
            (Stream::Stdout, pipes.stdout),
            (Stream::Stderr, pipes.stderr),
        ] {
            let Some(read) = read else {
                continue;
            };
            match pipe::Receiver::from_owned_fd(read) {
                Ok(receiver) => {
                    let (flush, flushes) = mpsc::unbounded_channel();
                    output.flushes.push(flush);
                    tokio::spawn(read_pipe(
                        receiver,
                        stream,
                        Arc::clone(&output.target),
                        flushes,
                    ));
                }
                Err(error) => output.target.diagnostics.diagnose(format_args!(
                    "trainyard agent: cannot read its {stream:?} pipe: {error}"
                )),
            }
        }
        output
    }

    /// From now on, what is written is the task's output, sent to `events`.
    pub(crate) fn begin(&self, events: EventSender) {
        self.target.set(Some(events));
    }

    /// Ends the task's output: flushes Rust's stdout, waits (bounded) until every line
    /// written so far has gone to the task's events (an unfinished last line too), then
    /// sends what comes later to the original stderr.
    pub(crate) async fn end(&self) {
        let _ = std::io::stdout().flush();
        let mut answers = Vec::new();
        for flush in &self.flushes {
            let (done, answer) = oneshot::channel();
            if flush.send(done).is_ok() {
                answers.push(answer);
            }
        }
        let _ = tokio::time::timeout(FLUSH_TIMEOUT, futures::future::join_all(answers)).await;
        self.target.set(None);
    }

    /// Stops sending output to the task's events at once (the task was cancelled).
    pub(crate) fn abandon(&self) {
        self.target.set(None);
    }
}

/// Reads `receiver` for as long as the agent lives, passing its lines to `target`.
async fn read_pipe(
    receiver: pipe::Receiver,
    stream: Stream,
    target: Arc<Target>,
    mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
) {
    let mut lines = Lines::default();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some(done) = flushes.recv() => {
                if open {
                    open = drain(&receiver, &mut lines, stream, &target, Read::Now);
                }
                if let Some(last) = lines.rest() {
                    target.line(stream, &last);
                }
                let _ = done.send(());
            }
            ready = receiver.readable(), if open => {
                open = ready.is_ok() && drain(&receiver, &mut lines, stream, &target, Read::WhenReady);
            }
            else => return,
        }
    }
}

/// How [`drain`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// As the runtime saw the pipe become readable: the runtime learns when it is empty.
    WhenReady,
    /// At once, whatever the runtime last saw: for a flush, which must find what was just
    /// written.
    Now,
}

/// Reads what the pipe holds now, passing on its complete lines; whether the pipe is still
/// open.
fn drain(
    receiver: &pipe::Receiver,
    lines: &mut Lines,
    stream: Stream,
    target: &Target,
    how: Read,
) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let read = match how {
            Read::WhenReady => receiver.try_read(&mut chunk),
            // The pipe is non-blocking: an empty one says `EAGAIN`.
            Read::Now => nix::unistd::read(receiver, &mut chunk).map_err(std::io::Error::from),
        };
        match read {
            Ok(0) => return false,
            Ok(n) => lines.push(&chunk[..n], |line| target.line(stream, line)),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use futures::StreamExt as _;
    use trainyard_runtime::TaskEvent;
    use trainyard_runtime::events::{ActorEvent, event_channel};

    use super::*;

    fn pipe_pair() -> (OwnedFd, File) {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("a pipe");
        (read, File::from(write))
    }

    #[tokio::test]
    async fn what_is_written_during_a_task_is_its_output_in_order_per_stream() {
        let (out_read, mut out) = pipe_pair();
        let (err_read, mut err) = pipe_pair();
        let output = TaskOutput::start(
            Pipes {
                stdout: Some(out_read),
                stderr: Some(err_read),
            },
            Diagnostics::default(),
        );
        let (events, stream) = event_channel(64);
        output.begin(events);
        out.write_all(b"first\nsecond\n").expect("write");
        err.write_all(b"oops\n").expect("write");
        out.write_all(b"no line end").expect("write");
        output.end().await;
        // Written after the end: not the task's.
        out.write_all(b"later\n").expect("write");
        output.end().await;
        drop(output);
        let lines: Vec<(Stream, String)> = stream
            .filter_map(|event| async move {
                match event {
                    ActorEvent::Task {
                        event: TaskEvent::Log { stream, line },
                        ..
                    } => Some((stream, line)),
                    _ => None,
                }
            })
            .take(4)
            .collect()
            .await;
        let stdout: Vec<&str> = lines
            .iter()
            .filter(|(s, _)| *s == Stream::Stdout)
            .map(|(_, l)| l.as_str())
            .collect();
        let stderr: Vec<&str> = lines
            .iter()
            .filter(|(s, _)| *s == Stream::Stderr)
            .map(|(_, l)| l.as_str())
            .collect();
        assert_eq!(stdout, ["first", "second", "no line end"]);
        assert_eq!(stderr, ["oops"]);
    }
}
