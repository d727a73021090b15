//! A command task: resolved, started in a session and process group of its own (set up between
//! `fork` and `exec`: [`trainyard_sys::spawn::TaskSetup`]),
//! its output streamed line by line, its reports taken from a socket (their checkpoints
//! persisted by the agent), and its end turned into a [`TaskExit`] that says what happened —
//! after a failure, with its root cause (its error file, or its output's last traceback).
//! Its end is reported only once every process it started is gone (within
//! [`SWEEP_BOUND`](crate::descendants::SWEEP_BOUND)): its group, what detached from it
//! ([`crate::descendants`]), and what is in the worker's cgroup.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinSet;
use trainyard_runtime::events::EventSender;
use trainyard_runtime::{STOP_PERSIST_PATIENCE, Stream, TaskExit, TaskFailure, TaskRejection};

use trainyard_sys::cgroup::OomCounter;
use trainyard_sys::process_group;
use trainyard_sys::spawn::{SpawnError, TaskSetup};
use trainyard_wire::config::{AgentConfig, MemoryLimit, PRIVATE};

use crate::descendants::{self, SWEEP_BOUND};
use crate::lines::{Lines, MAX_LINE};
use crate::report::ReportSocket;
use crate::root_cause::{self, OutputTracebacks};
use crate::watchdog::Watchdog;

/// How long output and report connections may stay open after the task's process exited
/// (grandchildren can hold them).
const DRAIN: Duration = Duration::from_millis(500);
/// How long checkpoints handed in `ASYNC` may go on being persisted after their task ended.
const PERSIST_PATIENCE: Duration = Duration::from_secs(30 * 60);

/// A started command task.
#[derive(Debug)]
pub(crate) struct RunningCommand {
    /// The task's process id, also its process group's.
    pub(crate) pid: u32,
    /// The task's exit, once it has ended and its end was sent.
    pub(crate) done: watch::Receiver<Option<TaskExit>>,
    /// Whether its process has been reaped: its id, and its group's, may be another's then,
    /// while its end waits for the checkpoints it handed in.
    reaped: Arc<AtomicBool>,
}

impl RunningCommand {
    /// Whether the task has ended (and its end was sent).
    pub(crate) fn is_done(&self) -> bool {
        self.done.borrow().is_some()
    }

    /// Whether the task's process is still there to be signalled (it has not been reaped).
    pub(crate) fn is_alive(&self) -> bool {
        !self.is_done() && !self.reaped.load(Ordering::Acquire)
    }

    /// How the task ended, once it has (and its end was sent).
    pub(crate) fn exit(&self) -> Option<TaskExit> {
        self.done.borrow().clone()
    }

    /// Stops the task: SIGTERM to its process group, SIGKILL after `grace`, then waits
    /// (bounded: the sweep of what it left, and a little more; with `persist`, once its
    /// process has ended, up to [`STOP_PERSIST_PATIENCE`] from the start for the checkpoints
    /// it handed in) for its end to be sent.
    pub(crate) async fn terminate(&mut self, grace: Duration, persist: bool) {
        if self.is_done() {
            return;
        }
        let started = tokio::time::Instant::now();
        if self.is_alive() {
            process_group::signal(self.pid, Signal::SIGTERM);
        }
        if tokio::time::timeout(grace, self.done.wait_for(Option::is_some))
            .await
            .is_err()
        {
            if self.is_alive() {
                process_group::signal(self.pid, Signal::SIGKILL);
            }
            let bound = SWEEP_BOUND + Duration::from_secs(5);
            let _ = tokio::time::timeout(bound, self.done.wait_for(Option::is_some)).await;
        }
        // Its process has ended, and its last reports wait for their checkpoints.
        if persist && !self.is_done() && !self.is_alive() {
            let left = STOP_PERSIST_PATIENCE.saturating_sub(started.elapsed());
            let _ = tokio::time::timeout(left, self.done.wait_for(Option::is_some)).await;
        }
    }
}

/// The set-up of a task's process that its memory limit asks for: the worker's cgroup to
/// join (a task that cannot join a limited one is not started; one without a limit runs all
/// the same, and its agent alone ends what it leaves), or an address-space cap. The
/// scheduler's cgroup holds the agent, so the task too already.
fn task_setup(memory: Option<&MemoryLimit>) -> Result<TaskSetup, SpawnError> {
    let setup = TaskSetup::new(std::process::id());
    match memory {
        Some(MemoryLimit::Cgroup { path, .. }) => setup.join_cgroup(&path.join(PROCS), true),
        Some(MemoryLimit::Unlimited { path }) => setup.join_cgroup(&path.join(PROCS), false),
        Some(MemoryLimit::AddressSpace { limit }) => Ok(setup.limit_address_space(*limit)),
        Some(MemoryLimit::Scheduler { .. }) | None => Ok(setup),
    }
}

/// A cgroup's file of member processes.
const PROCS: &str = "cgroup.procs";

/// Finds `program` the way `execvp` would, on the task's own `PATH`.
///
/// # Errors
/// [`TaskRejection::ProgramNotFound`] or [`TaskRejection::NotExecutable`].
pub(crate) fn resolve(
    program: &str,
    env: &BTreeMap<String, String>,
) -> Result<PathBuf, TaskRejection> {
    let not_found = || TaskRejection::ProgramNotFound {
        program: program.to_owned(),
    };
    if program.is_empty() {
        return Err(not_found());
    }
    let path = if program.contains('/') {
        PathBuf::from(program)
    } else {
        let search = env.get("PATH").map_or("", String::as_str);
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        which::which_in(program, Some(search), cwd).map_err(|_| not_found())?
    };
    let metadata = std::fs::metadata(&path).map_err(|_| not_found())?;
    if metadata.is_dir() || metadata.permissions().mode() & 0o111 == 0 {
        return Err(TaskRejection::NotExecutable {
            program: program.to_owned(),
            error: if metadata.is_dir() {
                "it is a directory".to_owned()
            } else {
                "it has no execute permission".to_owned()
            },
        });
    }
    Ok(path)
}

/// Starts `program` with `args` and `env` as a task of the worker `worker` configures (its
/// memory limit; its warm Python, which starts the task when `program` is its
/// interpreter); its events go to `events`, ending
/// with [`ActorEvent::TaskExited`](trainyard_runtime::events::ActorEvent::TaskExited) (after
/// a failure, preceded by its root cause, read from `error_file` when there is one). The
/// agent's `watchdog` kills the task's group and the worker's cgroup should the agent be
/// killed before the task's end.
///
/// # Errors
/// The rejection when the program cannot be found or started.
pub(crate) async fn start(
    program: &str,
    args: Vec<String>,
    mut env: BTreeMap<String, String>,
    worker: &AgentConfig,
    error_file: Option<PathBuf>,
    events: EventSender,
    watchdog: &Watchdog,
) -> Result<RunningCommand, TaskRejection> {
    let memory = worker.memory.clone();
    let warm = worker.warm_python.as_ref();
    let resolved = resolve(program, &env)?;
    let spawn_failed = |error: &dyn std::fmt::Display| TaskRejection::SpawnFailed {
        program: program.to_owned(),
        error: error.to_string(),
    };
    let reports = ReportSocket::bind().await.map_err(|e| spawn_failed(&e))?;
    // Counted against the task's own environment, as the driver sent it.
    let counted = crate::handin::task_reports(&env, events.clone());
    env.extend(reports.env());
    descendants::task_starting();
    let serving = crate::warm::serving(warm, &resolved, memory.as_ref()).unwrap_or_else(|why| {
        events.log(Stream::Stderr, format!("trainyard: --warm-python: {why}"));
        None
    });
    let warm_task = match serving {
        Some(warm) => {
            // The agent's own variables are not in `env`: the driver's are, and the warm
            // Python's request carries them whole.
            for private in PRIVATE {
                env.remove(private);
            }
            let mut argv = vec![resolved.display().to_string()];
            argv.extend(args.iter().cloned());
            match crate::warm::start(warm, argv, &env, memory.as_ref()).await {
                Ok(task) => Some(task),
                Err(crate::warm::NotStarted::Unreachable(why)) => {
                    events.log(
                        Stream::Stderr,
                        format!("trainyard: --warm-python: {why}; this rank starts cold"),
                    );
                    None
                }
                Err(refused @ crate::warm::NotStarted::Refused(_)) => {
                    return Err(spawn_failed(&refused));
                }
            }
        }
        None => None,
    };
    // Counted from here: a warm Python killed while it imported (its node's memory was
    // short) is no kill of this task.
    let cgroup = match &memory {
        Some(MemoryLimit::Cgroup { path, limit }) => {
            OomCounter::open(path).map(|counter| CgroupLimit {
                before: counter.count(),
                counter,
                limit: *limit,
            })
        }
        Some(MemoryLimit::Scheduler { limit }) => {
            trainyard_sys::cgroup::own_oom_counter().map(|counter| CgroupLimit {
                before: counter.count(),
                counter,
                limit: *limit,
            })
        }
        _ => None,
    };
    let (leader, stdout, stderr, joined) = if let Some(mut task) = warm_task {
        let joined = task.joined;
        let (stdout, stderr) = task.take_output();
        (Leader::Warm(task), stdout, stderr, Some(Ok(joined)))
    } else {
        let mut command = std::process::Command::new(&resolved);
        command.args(args).env_clear().envs(&env);
        // The agent's own variables reach no task, whatever the driver set.
        for private in PRIVATE {
            command.env_remove(private);
        }
        let probe = task_setup(memory.as_ref())
            .map_err(|e| spawn_failed(&e))?
            .apply(&mut command)
            .map_err(|e| spawn_failed(&e))?;
        // Returns once the program is executing: set up (cgroup, session, parent-death
        // signal) between `fork` and `exec`, or not started, with the step that failed.
        let mut child = Command::from(command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| spawn_failed(&probe.explain(e)))?;
        let stdout = child
            .stdout
            .take()
            .map(|out| Box::new(out) as Box<dyn AsyncRead + Send + Unpin>);
        let stderr = child
            .stderr
            .take()
            .map(|err| Box::new(err) as Box<dyn AsyncRead + Send + Unpin>);
        let joined = probe
            .cgroup_join()
            .map(|joined| joined.map(|()| true).map_err(|e| e.to_string()));
        (Leader::Spawned(child), stdout, stderr, joined)
    };
    let pid = leader
        .id()
        .ok_or_else(|| spawn_failed(&"the process ended at once"))?;
    // The task is an unreaped child (of this process or of the warm Python): its pid is its
    // own still.
    match trainyard_sys::procfs::read_stat(pid)
        .ok()
        .flatten()
        .and_then(|stat| stat.start_time)
    {
        Some(start_time) => watchdog.watch(pid, start_time),
        None => tracing::debug!(pid, "the task's process ended before the watchdog was told"),
    }
    let worker_cgroup = memory
        .as_ref()
        .and_then(MemoryLimit::cgroup)
        .map(PathBuf::from);
    if let Some(dir) = &worker_cgroup {
        watchdog.kill_cgroup_at_end(dir);
    }
    // The task is set up: whether it joined the worker's cgroup is known. An agent that
    // joined it itself (for a function task) would have its helpers there too.
    let joined = match joined {
        Some(Ok(joined)) => joined,
        Some(Err(error)) => {
            tracing::warn!(%error, "the task runs outside the worker's cgroup");
            false
        }
        None => {
            if worker_cgroup.is_some() {
                tracing::warn!("the task runs outside the worker's cgroup: it cannot be opened");
            }
            false
        }
    };
    let in_cgroup = joined
        && worker_cgroup
            .as_deref()
            .is_some_and(|dir| !trainyard_sys::cgroup::holds(dir, std::process::id()));
    let (done_tx, done) = watch::channel(None);
    let reaped = Arc::new(AtomicBool::new(false));
    let reaped_at_end = Arc::clone(&reaped);
    let watchdog = watchdog.clone();
    let outputs = [(Stream::Stdout, stdout), (Stream::Stderr, stderr)];
    tokio::spawn(async move {
        let tracebacks = OutputTracebacks::default();
        let mut readers = JoinSet::new();
        for (stream, output) in outputs {
            let Some(output) = output else { continue };
            readers.spawn(read_lines(
                output,
                stream,
                events.clone(),
                tracebacks.clone(),
            ));
        }
        let reporting = reports.serve(counted.clone(), events.clone());
        let ended = Ended {
            cgroup: cgroup.as_ref(),
            worker_cgroup,
            in_cgroup,
            watchdog: &watchdog,
        };
        let (exit, ended_ms) = follow(leader, readers, reporting, ended).await;
        reaped_at_end.store(true, Ordering::Release);
        // Checkpoints handed in `ASYNC` are persisted, and their reports sent, before the
        // end: a rank that dies after handing one in still has it persisted.
        if !counted.flush(PERSIST_PATIENCE).await {
            events.log(
                Stream::Stderr,
                format!(
                    "trainyard: {} report(s) whose checkpoints were still being persisted after {} s are dropped; their checkpoints are not committed",
                    counted.unsent(),
                    PERSIST_PATIENCE.as_secs()
                ),
            );
            counted.abandon();
        }
        let error = match exit {
            TaskExit::Failed { .. } => root_cause::command_error(error_file, &tracebacks).await,
            TaskExit::Succeeded { .. } => None,
        };
        root_cause::send_exit(&events, exit.clone(), ended_ms, error).await;
        done_tx.send_replace(Some(exit));
    });
    Ok(RunningCommand { pid, done, reaped })
}

/// The task's process: this agent's child, or the warm Python's.
#[derive(Debug)]
enum Leader {
    Spawned(Child),
    Warm(crate::warm::WarmTask),
}

impl Leader {
    fn id(&self) -> Option<u32> {
        match self {
            Self::Spawned(child) => child.id(),
            Self::Warm(task) => Some(task.pid),
        }
    }

    /// Waits for the process to end, kills what it left running in its group (background
    /// children would outlive it and hold its output open), then reaps it (a warm task's
    /// leader: once this is dropped).
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Self::Spawned(child) => {
                // Peek at the exit without reaping, so that the group id stays taken.
                if let Some(leader) = child.id() {
                    let exited = match i32::try_from(leader) {
                        Ok(raw) => {
                            let pid = Pid::from_raw(raw);
                            tokio::task::spawn_blocking(move || {
                                waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
                            })
                            .await
                            .is_ok_and(|waited| waited.is_ok())
                        }
                        Err(_) => false,
                    };
                    if exited {
                        // The leader is a zombie still, so its group is the task's.
                        process_group::signal(leader, Signal::SIGKILL);
                    }
                }
                child.wait().await
            }
            // The warm Python kills the group the same way before it reaps the leader.
            Self::Warm(task) => task.wait().await,
        }
    }
}

/// A task's memory cgroup: its limit, and its OOM kills before the task started.
#[derive(Debug)]
struct CgroupLimit {
    counter: OomCounter,
    before: u64,
    limit: u64,
}

/// What the end of a task's process must look at and clear up.
#[derive(Debug)]
struct Ended<'a> {
    /// The task's memory cgroup, whose OOM kills say whether the limit ended it.
    cgroup: Option<&'a CgroupLimit>,
    /// The worker's cgroup, whose processes are killed at the task's end.
    worker_cgroup: Option<PathBuf>,
    /// Whether the task's process is in the worker's cgroup: then so is every process it
    /// started, unless one moved itself out (which takes a privilege over another cgroup).
    in_cgroup: bool,
    /// The agent's watchdog, told that the task's group is gone.
    watchdog: &'a Watchdog,
}

/// Waits for the process, kills and reaps what it left (its group, what detached from it,
/// what is in the worker's cgroup), then waits (bounded) for its output and reports to end;
/// how it ended, and when (ms since the Unix epoch: its process's exit, not the end of its
/// output).
async fn follow(
    mut leader: Leader,
    mut readers: JoinSet<()>,
    reporting: crate::report::Serving,
    ended: Ended<'_>,
) -> (TaskExit, u64) {
    let Ended {
        cgroup,
        worker_cgroup,
        in_cgroup,
        watchdog,
    } = ended;
    let group = leader.id();
    let status = leader.wait().await;
    let parked = matches!(&leader, Leader::Warm(task) if task.parked);
    // A warm task's leader is reaped once `leader` is dropped, after the sweep below: its
    // pid and group id stay the task's until then.
    let ended_ms = root_cause::now_ms();
    // What detached from the group, and what joined the worker's cgroup, are gone before
    // the end is reported: nothing of the task outlives it (nor holds its output open). A
    // task in the worker's cgroup left nothing outside it: emptying the cgroup is the whole
    // sweep, with no scan of `/proc`.
    let spared = watchdog.pid();
    let swept = tokio::task::spawn_blocking(move || match worker_cgroup {
        // A parked task's process goes on, with what it started, for the next task.
        _ if parked => 0,
        Some(dir) if in_cgroup && trainyard_sys::cgroup::kill_members(&dir) => {
            descendants::reap_orphans(spared);
            0
        }
        worker_cgroup => {
            let left = descendants::sweep(descendants::Scope::Task, spared);
            if let Some(dir) = worker_cgroup {
                trainyard_sys::cgroup::kill_members(&dir);
            }
            left
        }
    })
    .await;
    match swept {
        Ok(0) => descendants::swept_clean(),
        Ok(left) => tracing::warn!(left, "processes the task left are still there"),
        Err(_) => {}
    }
    if let Some(group) = group {
        watchdog.forget(group);
    }
    let drained = async { while readers.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, drained).await.is_err() {
        readers.abort_all();
    }
    reporting.finish(DRAIN).await;
    (exit_of(status, cgroup), ended_ms)
}

/// How a task whose process ended with `status` ended: the memory limit when its cgroup saw
/// an OOM kill since it started, else its exit code or signal.
fn exit_of(
    status: std::io::Result<std::process::ExitStatus>,
    cgroup: Option<&CgroupLimit>,
) -> TaskExit {
    if let Some(cgroup) = cgroup {
        if cgroup.counter.count() > cgroup.before {
            return TaskExit::Failed {
                failure: TaskFailure::MemoryLimit {
                    limit: cgroup.limit,
                },
            };
        }
    }
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => TaskExit::from_code(code),
            (None, Some(signal)) => TaskExit::Failed {
                failure: TaskFailure::Signal {
                    signal,
                    core_dumped: status.core_dumped(),
                },
            },
            (None, None) => TaskExit::from_code(-1),
        },
        Err(error) => TaskExit::Failed {
            failure: TaskFailure::Error {
                message: format!("waiting for the task's process failed: {error}"),
            },
        },
    }
}

/// Passes `output` on line by line (without line ends; invalid UTF-8 replaced; lines
/// longer than [`MAX_LINE`] cut into pieces) until it closes; every line goes through
/// `tracebacks` too.
async fn read_lines(
    mut output: impl AsyncRead + Unpin,
    stream: Stream,
    events: EventSender,
    tracebacks: OutputTracebacks,
) {
    let mut lines = Lines::default();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let read = match output.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        lines.push(&chunk[..read], |line| {
            emit(&events, &tracebacks, stream, line);
        });
    }
    if let Some(last) = lines.rest() {
        emit(
            &events,
            &tracebacks,
            stream,
            last.strip_suffix(b"\r").unwrap_or(&last),
        );
    }
}

/// Passes one line on, and through `tracebacks`.
fn emit(events: &EventSender, tracebacks: &OutputTracebacks, stream: Stream, line: &[u8]) {
    tracebacks.push(stream, &String::from_utf8_lossy(line));
    for piece in line.chunks(MAX_LINE) {
        events.log(stream, String::from_utf8_lossy(piece));
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use trainyard_runtime::TaskEvent;
    use trainyard_runtime::events::{ActorEvent, event_channel};

    use super::*;

    fn path_env() -> BTreeMap<String, String> {
        BTreeMap::from([("PATH".to_owned(), std::env::var("PATH").unwrap_or_default())])
    }

    #[test]
    fn programs_are_found_on_the_tasks_path_or_rejected_as_data() {
        assert!(resolve("sh", &path_env()).is_ok());
        assert_eq!(
            resolve("no-such-program-here", &path_env()),
            Err(TaskRejection::ProgramNotFound {
                program: "no-such-program-here".into()
            })
        );
        assert!(matches!(
            resolve("/tmp", &path_env()),
            Err(TaskRejection::NotExecutable { .. })
        ));
        assert!(matches!(
            resolve("", &path_env()),
            Err(TaskRejection::ProgramNotFound { .. })
        ));
    }

    #[tokio::test]
    async fn output_is_split_into_lines_and_long_lines_are_cut() {
        let (tx, events) = event_channel(1024);
        let mut text = b"one\r\ntwo\n".to_vec();
        text.extend(vec![b'x'; MAX_LINE + 10]);
        text.extend(b"\n\xffbad\nlast");
        let tracebacks = OutputTracebacks::default();
        read_lines(&text[..], Stream::Stdout, tx, tracebacks.clone()).await;
        let lines: Vec<String> = events
            .filter_map(|e| async move {
                match e {
                    ActorEvent::Task {
                        event: TaskEvent::Log { line, .. },
                        ..
                    } => Some(line),
                    _ => None,
                }
            })
            .collect()
            .await;
        assert_eq!(
            lines.len(),
            6,
            "{:?}",
            lines.iter().map(String::len).collect::<Vec<_>>()
        );
        assert_eq!(lines[0], "one");
        assert_eq!(lines[1], "two");
        assert_eq!(lines[2].len(), MAX_LINE);
        assert_eq!(lines[3], "x".repeat(10));
        assert_eq!(lines[4], "\u{fffd}bad");
        assert_eq!(lines[5], "last");
    }
}
