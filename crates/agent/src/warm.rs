//! A command task started by the node's warm Python ([`WarmPython`]) as a fork of itself,
//! rather than executed: the interpreter and the run's heavy modules are loaded already.
//!
//! The agent sends the task's command line, environment, working directory and set-up (the
//! worker's cgroup, an address-space cap) with its stdin, stdout and stderr, and hears back
//! its process id once it is set up, then its wait status once it has ended and the rest of
//! its group was killed (the protocol is `python/trainyard/_warm.py`'s). The task is the warm
//! Python's child: it dies with that process, and is killed by it should this connection
//! close first (the agent gone). Its ended leader stays unreaped until the agent closes the
//! connection, after its own sweep, so that the task's pid and group id name nobody else
//! while the agent may still signal them.
//!
//! A task stopped for a restart may park instead of ending (a `TorchTrainer` loop function
//! restarted in place): its end is told with `parked`, and what is left of its process is
//! not swept, for the warm Python hands the worker's next task to that process.
//!
//! A worker without a cgroup starts its tasks cold: what a task detaches from its group is
//! found and killed through the worker's cgroup, or below the agent (its subreaper), and a
//! forked task is below neither.

use std::collections::BTreeMap;
use std::io::{IoSlice, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::unix::pipe;
use trainyard_wire::config::{MemoryLimit, WarmPython};

/// How long the warm Python may take to set a task up once it has taken the request.
const START_PATIENCE: Duration = Duration::from_secs(20);

// A task's start waits for both at most, within the driver's default patience for a call
// (60 s: trainyard-hub's `DEFAULT_CALL_TIMEOUT`).
const _: () = assert!(IMPORT_PATIENCE.as_secs() + START_PATIENCE.as_secs() < 60);

/// `warm`, when it starts the task of `program` (as found on the task's `PATH`): a task of
/// its very interpreter, in a worker where what the task leaves is found and killed: through
/// the worker's cgroup (`memory`'s), or below the agent, its subreaper, when the warm Python
/// is the agent's own child ([`AgentConfig::start_warm_python`]). A task it would start
/// otherwise starts cold, and why is the `Err`.
///
/// [`AgentConfig::start_warm_python`]: trainyard_wire::config::AgentConfig::start_warm_python
pub(crate) fn serving<'a>(
    warm: Option<&'a WarmPython>,
    program: &std::path::Path,
    memory: Option<&MemoryLimit>,
) -> Result<Option<&'a WarmPython>, &'static str> {
    let Some(warm) = warm.filter(|warm| warm.python == program) else {
        return Ok(None);
    };
    if let Some(MemoryLimit::AddressSpace { .. }) = memory {
        return Err(
            "this worker's memory is capped by its address space, which a forked rank would share with the warm Python's imports, so it starts cold",
        );
    }
    if memory.and_then(MemoryLimit::cgroup).is_none() && !own_child(warm) {
        return Err(
            "this worker has no cgroup to find what a forked rank leaves behind through, so it starts cold",
        );
    }
    Ok(Some(warm))
}

/// Whether `warm` is this agent's own child: what its tasks leave is re-parented to the agent.
fn own_child(warm: &WarmPython) -> bool {
    trainyard_sys::procfs::read_stat(warm.pid)
        .ok()
        .flatten()
        .is_some_and(|stat| {
            stat.parent == std::process::id()
                && warm.start_time.is_none_or(|t| stat.start_time == Some(t))
        })
}

/// What the agent asks of the warm Python.
#[derive(Debug, Serialize)]
struct StartRequest<'a> {
    token: &'a str,
    argv: Vec<String>,
    env: &'a BTreeMap<String, String>,
    cwd: String,
    cgroup: Option<String>,
    cgroup_required: bool,
    address_space: Option<u64>,
}

/// What the warm Python says of a task.
#[derive(Debug, Deserialize)]
struct Said {
    started: Option<u32>,
    #[serde(default)]
    joined: bool,
    error: Option<String>,
    status: Option<i32>,
    /// With `status`: the task parked rather than ended (its process waits, in the warm
    /// Python's keeping, for its worker's next task).
    #[serde(default)]
    parked: bool,
}

/// A task the warm Python started.
#[derive(Debug)]
pub(crate) struct WarmTask {
    /// Its process id, also its process group's.
    pub(crate) pid: u32,
    /// When it started (clock ticks after boot), read while it could not have ended.
    start_time: Option<u64>,
    /// Whether it joined the worker's cgroup.
    pub(crate) joined: bool,
    /// Whether it parked when it was stopped: its process is not gone, nor is what it
    /// started, and both are the warm Python's to keep or end.
    pub(crate) parked: bool,
    /// Its stdout and stderr, until taken.
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    /// The connection its end comes on; closing it kills the task.
    lines: tokio::io::Lines<BufReader<tokio::net::UnixStream>>,
}

/// A task's output, as the agent reads it.
type Output = Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>;

impl WarmTask {
    /// Its stdout and stderr, to read.
    pub(crate) fn take_output(&mut self) -> (Output, Output) {
        let boxed = |pipe: pipe::Receiver| Box::new(pipe) as Box<_>;
        (self.stdout.take().map(boxed), self.stderr.take().map(boxed))
    }

    /// Its wait status, once it has ended and its group is gone. Its leader is reaped once
    /// this is dropped. Should the warm Python end first, what is left of the task's group
    /// is killed here.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let mut check = tokio::time::interval(LEADER_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let line = tokio::select! {
                line = self.lines.next_line() => line?,
                _ = check.tick() => {
                    // Its leader is kept until this connection closes: one that is gone
                    // is an end the warm Python will never tell.
                    if self.leader_gone() {
                        return Err(std::io::Error::other(
                            "the task's process is gone without its end from the warm Python",
                        ));
                    }
                    continue;
                }
            };
            let Some(line) = line else {
                match self.start_time {
                    Some(start_time) => {
                        trainyard_sys::process_group::kill_started(self.pid, start_time);
                    }
                    None => trainyard_sys::process_group::kill(self.pid),
                }
                return Err(std::io::Error::other(
                    "the warm Python ended before the task",
                ));
            };
            let said: Said = serde_json::from_str(&line).map_err(std::io::Error::other)?;
            if let Some(status) = said.status {
                self.parked = said.parked;
                if said.parked {
                    *parked_process() = self.start_time.and_then(|start| {
                        trainyard_sys::procfs::ProcessHandle::open_started(self.pid, start)
                    });
                }
                return Ok(ExitStatus::from_raw(status));
            }
        }
    }

    /// Whether the task's leader is no longer there (a zombie still is), or another process
    /// has its pid.
    fn leader_gone(&self) -> bool {
        match trainyard_sys::procfs::read_stat(self.pid) {
            Ok(Some(stat)) => self.start_time.is_some_and(|t| stat.start_time != Some(t)),
            Ok(None) => false,
            Err(error) => error.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

/// How often a waiting agent checks that its warm task's leader is still there.
const LEADER_CHECK: Duration = Duration::from_secs(1);

/// How long an exiting agent waits for its parked task's process to run its exit handlers.
const PARKED_END_PATIENCE: Duration = Duration::from_secs(1);

/// The process of this agent's last task, while it is parked: the agent's next task is
/// handed to it, or it is ended as the agent exits ([`end_parked`]).
static PARKED: std::sync::Mutex<Option<trainyard_sys::procfs::ProcessHandle>> =
    std::sync::Mutex::new(None);

fn parked_process() -> std::sync::MutexGuard<'static, Option<trainyard_sys::procfs::ProcessHandle>>
{
    PARKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ends this agent's parked task, if any, as the agent exits: SIGTERM, on which a parked
/// process runs its exit handlers and exits as it would have had it not parked (its task's
/// status), waited for up to [`PARKED_END_PATIENCE`]; whatever is left is the exit's sweep's
/// (and, locally, the worker cgroup's). Blocks.
pub(crate) fn end_parked() {
    let Some(process) = parked_process().take() else {
        return;
    };
    if !process.signal(nix::sys::signal::Signal::SIGTERM) {
        return;
    }
    let deadline = std::time::Instant::now() + PARKED_END_PATIENCE;
    while trainyard_sys::procfs::is_alive(process.pid(), Some(process.start_time()))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Why a task did not start from the warm Python.
#[derive(Debug)]
pub(crate) enum NotStarted {
    /// The warm Python is not there to ask (it ended, or is still importing the run's
    /// modules after [`IMPORT_PATIENCE`]): the task may start cold.
    Unreachable(String),
    /// It was asked and refused, or could not set the task up.
    Refused(String),
}

impl std::fmt::Display for NotStarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(why) | Self::Refused(why) => f.write_str(why),
        }
    }
}

/// Asks the warm Python to start `argv` (the interpreter first) with `env`, set up for
/// `memory`.
///
/// # Errors
/// Why the task was not started: [`NotStarted::Unreachable`] before anything was sent, or
/// [`NotStarted::Refused`] (a socket that is not the warm Python's is refused before anything
/// is sent to it).
pub(crate) async fn start(
    warm: &WarmPython,
    argv: Vec<String>,
    env: &BTreeMap<String, String>,
    memory: Option<&MemoryLimit>,
) -> Result<WarmTask, NotStarted> {
    let owner = warm.clone();
    let stream = tokio::task::spawn_blocking(move || connect(&owner))
        .await
        .map_err(|e| NotStarted::Unreachable(e.to_string()))?
        .map_err(NotStarted::Unreachable)?;
    let stream = trusted(warm, stream).map_err(NotStarted::Refused)?;
    ask(warm, stream, argv, env, memory)
        .await
        .map_err(NotStarted::Refused)
}

/// Sends the request on `stream`, and waits for the task to be set up.
async fn ask(
    warm: &WarmPython,
    stream: UnixStream,
    argv: Vec<String>,
    env: &BTreeMap<String, String>,
    memory: Option<&MemoryLimit>,
) -> Result<WarmTask, String> {
    let (cgroup, cgroup_required, address_space) = match memory {
        Some(MemoryLimit::Cgroup { path, .. }) => (Some(path.join("cgroup.procs")), true, None),
        Some(MemoryLimit::Unlimited { path }) => (Some(path.join("cgroup.procs")), false, None),
        Some(MemoryLimit::AddressSpace { limit }) => (None, false, Some(*limit)),
        Some(MemoryLimit::Scheduler { .. }) | None => (None, false, None),
    };
    let cwd = std::env::current_dir()
        .map_err(|e| format!("the agent's working directory is gone: {e}"))?
        .display()
        .to_string();
    let request = StartRequest {
        token: &warm.token,
        argv,
        env,
        cwd,
        cgroup: cgroup.map(|path| path.display().to_string()),
        cgroup_required,
        address_space,
    };
    let body = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    let (out_read, out_write) = pipe_pair()?;
    let (err_read, err_write) = pipe_pair()?;
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    let stream = tokio::task::spawn_blocking(move || -> Result<UnixStream, String> {
        let mut stream = stream;
        stream
            .set_write_timeout(Some(START_PATIENCE))
            .map_err(|e| e.to_string())?;
        let length = u32::try_from(body.len())
            .map_err(|_| "the task's request is too large".to_owned())?
            .to_be_bytes();
        let fds = [
            null.as_raw_fd(),
            out_write.as_raw_fd(),
            err_write.as_raw_fd(),
        ];
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&length)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("cannot hand the task's descriptors over: {e}"))?;
        stream
            .write_all(&body)
            .map_err(|e| format!("cannot send the task's request: {e}"))?;
        // The task holds the write ends now; ours would keep its output open.
        drop((null, out_write, err_write));
        stream.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(stream)
    })
    .await
    .map_err(|e| e.to_string())??;
    let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(stream).lines();
    let first = tokio::time::timeout(START_PATIENCE, lines.next_line())
        .await
        .map_err(|_| {
            format!(
                "the warm Python did not start the task within {} s",
                START_PATIENCE.as_secs()
            )
        })?
        .map_err(|e| format!("the warm Python's answer was cut off: {e}"))?
        .ok_or_else(|| {
            "the warm Python ended without starting the task (its own message, above, says why)"
                .to_owned()
        })?;
    let said: Said = serde_json::from_str(&first)
        .map_err(|e| format!("the warm Python's answer `{first}` is not understood: {e}"))?;
    // The parked process, if any, took this task, or is the warm Python's to end.
    parked_process().take();
    match (said.started, said.error) {
        (Some(pid), _) => Ok(WarmTask {
            pid,
            // Its leader is unreaped until this connection closes: the pid is its own.
            start_time: trainyard_sys::procfs::read_stat(pid)
                .ok()
                .flatten()
                .and_then(|stat| stat.start_time),
            joined: said.joined,
            parked: false,
            stdout: Some(pipe::Receiver::from_owned_fd(out_read).map_err(|e| e.to_string())?),
            stderr: Some(pipe::Receiver::from_owned_fd(err_read).map_err(|e| e.to_string())?),
            lines,
        }),
        (None, Some(error)) => Err(error),
        (None, None) => Err(format!(
            "the warm Python's answer `{first}` is not understood"
        )),
    }
}

/// Connects to `warm`'s socket, which appears, listening already, once it has imported the
/// run's modules: an agent waits for it while the warm Python lives, up to
/// [`IMPORT_PATIENCE`] (then its task starts cold rather than fail on a slow import). A
/// socket nobody listens on is a warm Python that ended.
fn connect(warm: &WarmPython) -> Result<UnixStream, String> {
    let started = std::time::Instant::now();
    let alive = || warm.pid == 0 || trainyard_sys::procfs::is_alive(warm.pid, warm.start_time);
    loop {
        match UnixStream::connect(&warm.socket) {
            Ok(stream) => return Ok(stream),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if !alive() {
                    return Err("the warm Python ended before it had imported its modules".into());
                }
                if started.elapsed() >= IMPORT_PATIENCE {
                    return Err(format!(
                        "the warm Python had not imported its modules after {} s",
                        IMPORT_PATIENCE.as_secs()
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => {
                return Err(format!(
                    "cannot reach the warm Python at {}: {error}",
                    warm.socket.display()
                ));
            }
        }
    }
}

/// `stream` when the process listening on it is `warm`'s own, proven by the credentials the
/// kernel took when it listened (`SO_PEERCRED`): this user's, with the warm Python's pid (and
/// that pid still the process started then). Its folder must be this user's alone, too.
/// Anything else is someone else's socket in its place: nothing is sent to it, and the rank
/// fails saying so rather than start cold as if nothing had happened.
fn trusted(warm: &WarmPython, stream: UnixStream) -> Result<UnixStream, String> {
    let refused = |why: String| {
        format!(
            "--warm-python: the socket {} is refused: {why}; nothing was sent to it",
            warm.socket.display()
        )
    };
    if let Some(folder) = warm.socket.parent() {
        trainyard_sys::private::check_dir(folder).map_err(|e| refused(e.to_string()))?;
    }
    let peer = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| refused(format!("its peer's credentials cannot be read: {e}")))?;
    let own = trainyard_sys::private::euid();
    if peer.uid() != own {
        return Err(refused(format!(
            "it is served by uid {}, not this user (uid {own})",
            peer.uid()
        )));
    }
    let pid = u32::try_from(peer.pid()).unwrap_or_default();
    if warm.pid != 0
        && (pid != warm.pid || !trainyard_sys::procfs::is_alive(warm.pid, warm.start_time))
    {
        return Err(refused(format!(
            "it is served by pid {pid}, not the warm Python (pid {})",
            warm.pid
        )));
    }
    Ok(stream)
}

/// How long an agent waits for the warm Python to have imported the run's modules (it
/// listens once it has): past it the rank starts cold (importing for itself) instead of
/// failing on a slow file system.
const IMPORT_PATIENCE: Duration = Duration::from_secs(30);

/// A pipe whose read end is non-blocking (for tokio), both ends closed on exec.
fn pipe_pair() -> Result<(OwnedFd, OwnedFd), String> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| format!("cannot make the task's output pipe: {e}"))?;
    nix::fcntl::fcntl(&read, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
        .map_err(|e| format!("cannot make the task's output pipe: {e}"))?;
    Ok((read, write))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::net::UnixListener;

    use super::*;

    fn warm_at(socket: std::path::PathBuf, pid: u32) -> WarmPython {
        WarmPython {
            python: "python3".into(),
            socket,
            token: "secret".to_owned(),
            pid,
            start_time: None,
        }
    }

    #[test]
    fn a_socket_served_by_another_process_than_the_warm_python_is_refused() {
        let dir = trainyard_sys::private::temp_dir("trainyard-warm-test-").expect("made");
        let socket = dir.path().join("warm.sock");
        let _listener = UnixListener::bind(&socket).expect("bound");
        // Served by this process: the warm Python named is pid 1.
        let stream = UnixStream::connect(&socket).expect("connected");
        let error = trusted(&warm_at(socket.clone(), 1), stream).expect_err("refused");
        assert!(
            error.contains(&format!(
                "served by pid {}, not the warm Python (pid 1)",
                std::process::id()
            )),
            "{error}"
        );
        // This process as the warm Python: accepted.
        let stream = UnixStream::connect(&socket).expect("connected");
        trusted(&warm_at(socket, std::process::id()), stream).expect("its own");
    }

    #[test]
    fn a_socket_in_a_folder_others_may_enter_is_refused() {
        let dir = trainyard_sys::private::temp_dir("trainyard-warm-test-").expect("made");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let socket = dir.path().join("warm.sock");
        let _listener = UnixListener::bind(&socket).expect("bound");
        let stream = UnixStream::connect(&socket).expect("connected");
        let error = trusted(&warm_at(socket, std::process::id()), stream).expect_err("refused");
        assert!(error.contains("mode 0777"), "{error}");
        assert!(error.contains("nothing was sent to it"), "{error}");
    }

    #[test]
    fn a_warm_python_serves_where_what_a_rank_leaves_is_found_and_never_under_an_address_space_cap()
    {
        let python = std::path::Path::new("python3");
        let cgroup = MemoryLimit::Unlimited {
            path: "/sys/fs/cgroup/w".into(),
        };
        let scheduler = MemoryLimit::Scheduler { limit: 1 << 30 };
        let capped = MemoryLimit::AddressSpace { limit: 1 << 30 };
        // Another process's warm Python (the local runtime's, pid 1 here): only with a cgroup.
        let shared = warm_at("/nowhere".into(), 1);
        assert!(serving(Some(&shared), python, Some(&cgroup)).is_ok_and(|w| w.is_some()));
        let why = serving(Some(&shared), python, Some(&scheduler)).expect_err("cold");
        assert!(why.contains("no cgroup"), "{why}");
        assert!(serving(Some(&shared), python, None).is_err());
        // A child of this process (an agent's own): what its ranks leave comes here.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let own = warm_at("/nowhere".into(), child.id());
        assert!(serving(Some(&own), python, Some(&scheduler)).is_ok_and(|w| w.is_some()));
        assert!(serving(Some(&own), python, None).is_ok_and(|w| w.is_some()));
        let why = serving(Some(&own), python, Some(&capped)).expect_err("cold");
        assert!(why.contains("address space"), "{why}");
        // Another interpreter's task is none of its business.
        let other = std::path::Path::new("/usr/bin/python3.9");
        assert!(serving(Some(&own), other, None).is_ok_and(|w| w.is_none()));
        let _ = child.kill();
        let _ = child.wait();
    }
}
