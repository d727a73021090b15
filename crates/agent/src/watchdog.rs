//! The agent's watchdog: a small process of its own (forked by the agent before it starts any
//! thread; this very binary started again where it cannot be) that SIGKILLs the process groups of the agent's tasks, and the processes of the worker's
//! cgroup, once the agent is gone, however it went.
//!
//! The agent kills what its task left itself when it exits normally ([`crate::descendants`]),
//! and a task's own process dies with the agent (parent-death signal), but a task's children
//! would outlive an agent killed by SIGKILL: the OOM killer, or Ray, which kills an actor's
//! children so when the actor's job ends. The watchdog closes that gap. The agent tells it
//! each task group as it starts (`+PGID START`, the leader's start time, so that a group id
//! handed out again is never killed) and once it is reaped (`-PGID`), the worker's cgroup
//! (`@PATH`, whose processes it kills: those a task detached from its group too), one line
//! each on the watchdog's stdin, and its private directory (`=PATH`, see [`crate::workdir`]),
//! which the watchdog deletes after the kill, as the agent itself would have; end of file
//! means the agent is gone. Without a cgroup, what a task detached from its group (`setsid`)
//! outlives an agent killed by SIGKILL. The watchdog leads its own process group (a kill of
//! the agent's group does not reach it) and holds none of the agent's descriptors but its end
//! of the pipe and standard error (a forked one closes the rest: the ledger's liveness lock
//! goes with the agent). The agent writes those lines from a thread
//! of its own, so that a watchdog slow to read never holds up the agent, and waits for them
//! to be written before it exits.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, ExitCode, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use crate::diagnostics::Diagnostics;
use crate::double_spawn::SelfExec;

/// How long the agent waits, as it exits, for its last lines to reach the watchdog.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// The agent's end of its watchdog: lines go to a thread of their own that writes them to
/// the watchdog's stdin, so that no caller ever blocks on the pipe. Made once at start-up
/// ([`Watchdog::start`]) and handed to whoever starts or ends what the watchdog must know of.
/// Cheap to clone; without a watchdog (it could not be started) every line goes nowhere.
#[derive(Debug, Clone, Default)]
pub(crate) struct Watchdog {
    running: Option<Arc<Running>>,
}

/// A started watchdog.
#[derive(Debug)]
struct Running {
    lines: Mutex<mpsc::Sender<Message>>,
    pid: u32,
    /// A watchdog started as a program, kept so that it is not reaped by anyone else; it
    /// exits on its own. A forked one is this process's child all the same.
    _program: Option<Child>,
}

/// What a forked watchdog is called (`/proc/<pid>/comm`); one started as a program has
/// [`ROLE`](trainyard_wire::config::ROLE) `watchdog` in its environment instead.
pub(crate) const NAME: &std::ffi::CStr = c"trainyard-wdog";

/// A watchdog just started: its pid, the agent's end of its input, and the child when it
/// was started as a program.
struct Started {
    pid: u32,
    input: Box<dyn Write + Send>,
    program: Option<Child>,
}

/// What the writing thread is asked to do.
#[derive(Debug)]
enum Message {
    /// Write a line.
    Line(String),
    /// Say when every line before has been written.
    Flush(mpsc::Sender<()>),
}

impl Watchdog {
    /// Starts the watchdog of this agent: forked, while the agent has a single thread (as
    /// it has when it calls this first thing), else this program started again. Without one
    /// (it cannot be started), tasks still end with the agent in every case but a SIGKILL
    /// of the agent; the agent says so through `diagnostics` and goes on.
    pub(crate) fn start(diagnostics: &Diagnostics) -> Self {
        let started = Self::fork()
            .transpose()
            .unwrap_or_else(Self::start_program)
            .and_then(
                |Started {
                     pid,
                     input,
                     program,
                 }| {
                    let (lines, pending) = mpsc::channel();
                    std::thread::Builder::new()
                        .name("watchdog-lines".to_owned())
                        .spawn(move || write_lines(input, &pending))?;
                    Ok(Running {
                        lines: Mutex::new(lines),
                        pid,
                        _program: program,
                    })
                },
            );
        match started {
            Ok(running) => Self {
                running: Some(Arc::new(running)),
            },
            Err(error) => {
                diagnostics.diagnose(format_args!(
                    "trainyard agent: cannot start its watchdog: {error}"
                ));
                Self::default()
            }
        }
    }

    /// Forks the watchdog; `None` when this process has other threads already.
    fn fork() -> std::io::Result<Option<Started>> {
        let (output, input) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let forked = trainyard_sys::spawn::fork_single_threaded(NAME, output, |lines| {
            follow(std::io::BufReader::new(lines));
            0
        })?;
        Ok(forked.map(|pid| Started {
            pid,
            input: Box::new(std::fs::File::from(input)),
            program: None,
        }))
    }

    /// Starts this program again as the watchdog.
    fn start_program() -> std::io::Result<Started> {
        let mut child = SelfExec::Watchdog
            .command(&BTreeMap::new())?
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the watchdog has no stdin"))?;
        Ok(Started {
            pid: child.id(),
            input: Box::new(stdin),
            program: Some(child),
        })
    }

    /// Tells the watchdog about a task's process group, led by the task's process, which
    /// started at `start_time` (clock ticks after boot).
    pub(crate) fn watch(&self, group: u32, start_time: u64) {
        self.send(format!("+{group} {start_time}\n"));
    }

    /// Tells the watchdog that a task's process group is reaped: not to be killed.
    pub(crate) fn forget(&self, group: u32) {
        self.send(format!("-{group}\n"));
    }

    /// Asks the watchdog to kill the processes of the worker's cgroup `dir` once the agent
    /// is gone. A path that cannot be one line of text is not sent.
    pub(crate) fn kill_cgroup_at_end(&self, dir: &std::path::Path) {
        match dir.to_str() {
            Some(dir) if dir.starts_with('/') && !dir.contains('\n') => {
                self.send(format!("@{dir}\n"));
            }
            _ => {}
        }
    }

    /// The watchdog's process id, once it is started: a process of the agent's own.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.running.as_ref().map(|running| running.pid)
    }

    /// Asks the watchdog to delete `dir`, the agent's private directory, once the agent is
    /// gone. A path that cannot be one line of text is not sent (the agent deletes it itself
    /// when it exits normally).
    pub(crate) fn remove_at_end(&self, dir: &std::path::Path) {
        match dir.to_str() {
            Some(dir) if dir.starts_with('/') && !dir.contains('\n') => {
                self.send(format!("={dir}\n"));
            }
            _ => {}
        }
    }

    /// Waits (up to [`FLUSH_TIMEOUT`]) until every line told so far is written: before the
    /// agent exits, so that the watchdog never kills a group the agent has reaped. Blocks.
    pub(crate) fn flush(&self) {
        let (done, written) = mpsc::channel();
        if self.send_message(Message::Flush(done)) {
            let _ = written.recv_timeout(FLUSH_TIMEOUT);
        }
    }

    fn send(&self, line: String) {
        self.send_message(Message::Line(line));
    }

    /// Hands a message to the writing thread; whether there is one.
    fn send_message(&self, message: Message) -> bool {
        let Some(running) = &self.running else {
            return false;
        };
        running
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(message)
            .is_ok()
    }
}

/// Writes the agent's lines to the watchdog's stdin, in order, until the agent is gone.
fn write_lines(mut stdin: impl Write, pending: &mpsc::Receiver<Message>) {
    for message in pending {
        match message {
            // A watchdog that is gone can do nothing more; the agent goes on without it.
            Message::Line(line) => {
                let _ = stdin.write_all(line.as_bytes());
            }
            Message::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// One line from the agent.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A task's process group to kill once the agent is gone, and when its leader started.
    Watch(u32, u64),
    /// A process group that is reaped: not to be killed.
    Forget(u32),
    /// A cgroup whose processes to kill once the agent is gone.
    Cgroup(PathBuf),
    /// A directory to delete once the agent is gone (and its tasks killed).
    Remove(PathBuf),
}

fn parse(line: &str) -> Option<Line> {
    let bare = line.trim_end_matches(['\n', '\r']);
    for (sign, made) in [
        ('=', Line::Remove as fn(PathBuf) -> Line),
        ('@', Line::Cgroup),
    ] {
        if let Some(dir) = bare.strip_prefix(sign) {
            // Only an absolute path below the root: never `/` itself.
            let path = PathBuf::from(dir);
            return (path.is_absolute() && path.parent().is_some()).then(|| made(path));
        }
    }
    let (sign, rest) = line.trim().split_at_checked(1)?;
    let mut fields = rest.split(' ');
    let group: u32 = fields.next()?.parse().ok().filter(|g| *g > 1)?;
    let start_time = fields.next().map(str::parse::<u64>).transpose().ok()?;
    if fields.next().is_some() {
        return None;
    }
    match (sign, start_time) {
        ("+", Some(start_time)) => Some(Line::Watch(group, start_time)),
        ("-", None) => Some(Line::Forget(group)),
        _ => None,
    }
}

/// The `main` of a watchdog started as a program: [`follow`]s its standard input.
pub(crate) fn run() -> ExitCode {
    follow(std::io::stdin().lock());
    ExitCode::SUCCESS
}

/// Follows the agent's lines until end of file, then SIGKILLs every group still watched and
/// every process of the cgroups it was given, and deletes the directories it was given.
fn follow(input: impl BufRead) {
    let mut groups = BTreeMap::new();
    let mut cgroups = BTreeSet::new();
    let mut dirs = Vec::new();
    for line in input.lines() {
        let Ok(line) = line else {
            break;
        };
        match parse(&line) {
            Some(Line::Watch(group, start_time)) => {
                groups.insert(group, start_time);
            }
            Some(Line::Forget(group)) => {
                groups.remove(&group);
            }
            Some(Line::Cgroup(dir)) => {
                cgroups.insert(dir);
            }
            Some(Line::Remove(dir)) => dirs.push(dir),
            None => {}
        }
    }
    for (group, start_time) in groups {
        // The agent is gone: the task's own process may be reaped already, but what it left
        // in its group is still the task's while it lives.
        trainyard_sys::process_group::kill_started(group, start_time);
    }
    for cgroup in cgroups {
        trainyard_sys::cgroup::kill_members(&cgroup);
    }
    for dir in dirs {
        // Gone already when the agent exited normally: it deletes its directory itself.
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe that takes its time.
    struct Slow(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Slow {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(Duration::from_millis(20));
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_reach_the_watchdog_in_order_and_a_flush_waits_for_them() {
        let written = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (lines, pending) = mpsc::channel();
        let pipe = Slow(std::sync::Arc::clone(&written));
        let writer = std::thread::spawn(move || write_lines(pipe, &pending));
        let sent = std::time::Instant::now();
        for line in ["+41 7\n", "-41\n", "=/tmp/x\n"] {
            lines.send(Message::Line(line.to_owned())).expect("send");
        }
        assert!(
            sent.elapsed() < Duration::from_millis(20),
            "the sender does not wait for the pipe"
        );
        let (done, flushed) = mpsc::channel();
        lines.send(Message::Flush(done)).expect("send");
        flushed
            .recv_timeout(Duration::from_secs(10))
            .expect("flushed");
        assert_eq!(
            *written.lock().unwrap_or_else(PoisonError::into_inner),
            b"+41 7\n-41\n=/tmp/x\n"
        );
        drop(lines);
        writer.join().expect("the writer ends with the agent's end");
    }

    #[test]
    fn lines_name_a_group_to_watch_or_forget_and_nothing_else_counts() {
        assert_eq!(parse("+4242 881234\n"), Some(Line::Watch(4242, 881_234)));
        assert_eq!(
            parse("+4242\n"),
            None,
            "a group to watch comes with its start time"
        );
        assert_eq!(parse("+4242 x"), None);
        assert_eq!(parse("+4242 1 2"), None);
        assert_eq!(parse("-4242"), Some(Line::Forget(4242)));
        assert_eq!(parse("-4242 1"), None);
        assert_eq!(parse("+1 5"), None, "never the init process's group");
        assert_eq!(parse("+0 5"), None, "never the caller's own group");
        assert_eq!(parse("+-5"), None);
        assert_eq!(parse("4242"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("+x"), None);
    }

    #[test]
    fn a_directory_to_delete_is_an_absolute_path_below_the_root() {
        assert_eq!(
            parse("=/tmp/trainyard-agent-x1 y\n"),
            Some(Line::Remove(PathBuf::from("/tmp/trainyard-agent-x1 y")))
        );
        assert_eq!(parse("=/"), None, "never the root");
        assert_eq!(parse("="), None);
        assert_eq!(parse("=relative/dir"), None);
        assert_eq!(
            parse("@/sys/fs/cgroup/memory/run/actor-0\n"),
            Some(Line::Cgroup(PathBuf::from(
                "/sys/fs/cgroup/memory/run/actor-0"
            )))
        );
        assert_eq!(parse("@/"), None, "never the root");
        assert_eq!(parse("@cgroup"), None);
    }
}
