//! The stacks of the running task, for [`Request::Stacks`](trainyard_runtime::Request::Stacks):
//! what a hung task waits in, read without stopping it.
//!
//! A command task is its process and every descendant (found through the parent pids of
//! `/proc/*/stat`), the task's own process first and the others in tree order. A function
//! task runs inside the agent: the agent's own process, its task's threads first. Each thread
//! shows its name, scheduler state and kernel wait channel from `/proc/<pid>/task/<tid>/`.
//!
//! A Python process (its executable's or its `comm`'s name says `python`) also gets its
//! frames from `py-spy dump --json`: the py-spy that [`PY_SPY`] names, else the one beside
//! the process's `argv[0]` (a venv's `bin/`: the kernel's `/proc/<pid>/exe` names the base
//! interpreter a venv's `python` links to, never the venv), else beside `/proc/<pid>/exe`,
//! else the one on the task's `PATH`.
//!
//! py-spy runs twice, one after the other: plainly first (Python's frames), then with
//! `--native` in the time left, whose frames replace the plain ones: a thread blocked in a C
//! call then shows where (`clock_nanosleep (libc.so.6) ← time_sleep (libpython3.11.so.1.0) ←
//! <module> (train.py:9)` instead of `<module> (train.py:9)` alone), which is what tells a
//! hang in a collective or a data loader apart from one in Python code. Measured with py-spy
//! 0.4.3: for a process that has imported torch a native dump takes 0.2 to 0.6 s and 110 MB
//! (plain: 10 ms, 8 MB), for a bare interpreter some 30 ms: on a loaded host it can take
//! longer than the bound, and the plain dump taken first keeps the Python frames then. When
//! the native dump fails or runs too long, a note says so.
//!
//! Bounded: the `/proc` reads run off the async threads, every py-spy runs at once, and
//! the answer goes out within [`LIMIT`] with what could be read by then; a py-spy still
//! running is killed. A process or thread that ends mid-read is left out, never a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;
use trainyard_resources::ErrorChain;
use trainyard_runtime::stacks::{Frame, ProcessStacks, TaskStacks, ThreadStack};

use trainyard_sys::procfs;

/// The longest a capture takes: the answer goes out by then.
pub(crate) const LIMIT: Duration = Duration::from_secs(3);

/// What is kept of [`LIMIT`] for the answer itself, after the last read.
const MARGIN: Duration = Duration::from_millis(200);

/// The variable that names the py-spy executable to use.
pub const PY_SPY: &str = "TRAINYARD_PY_SPY";

/// The name of a function task's threads (as `comm` shows it: 15 bytes at most).
pub(crate) const TASK_THREAD: &str = "trainyard-task";

/// What runs, as far as stacks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject {
    /// No task runs.
    Idle,
    /// A command task: its process tree.
    Command {
        /// The task's own process.
        pid: u32,
    },
    /// A function task: the agent itself.
    Function,
}

/// Where to look for py-spy besides the Python process's own directories: the task's
/// environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PySpyLookup {
    /// [`PY_SPY`], used as is.
    pub(crate) explicit: Option<PathBuf>,
    /// `PATH`, searched last.
    pub(crate) path: Option<String>,
}

impl PySpyLookup {
    /// The lookup the task's environment `env` says.
    pub(crate) fn from_env(env: &BTreeMap<String, String>) -> Self {
        Self {
            explicit: env
                .get(PY_SPY)
                .filter(|path| !path.is_empty())
                .map(PathBuf::from),
            path: env.get("PATH").cloned(),
        }
    }
}

/// Which threads of a process come first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// The main thread (tid = pid).
    Main,
    /// The function task's threads ([`TASK_THREAD`]), then the main thread.
    TaskThreads,
}

/// A Python process whose frames py-spy is to read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Python {
    /// Its index in the capture's processes.
    index: usize,
    /// Its process id.
    pid: u32,
    /// The py-spy to use, when one was found.
    py_spy: Option<PathBuf>,
}

/// What the `/proc` reads found.
#[derive(Debug, Default)]
struct Read {
    stacks: TaskStacks,
    python: Vec<Python>,
}

/// Captures the stacks of `subject`, within [`LIMIT`].
pub(crate) async fn capture(subject: Subject, lookup: PySpyLookup) -> TaskStacks {
    let deadline = Instant::now() + LIMIT.saturating_sub(MARGIN);
    let (root, first, tree) = match subject {
        Subject::Idle => return note("no task runs"),
        Subject::Command { pid } => (pid, First::Main, true),
        Subject::Function => (std::process::id(), First::TaskThreads, false),
    };
    let reading = tokio::task::spawn_blocking(move || read(root, first, tree, &lookup));
    let read = match tokio::time::timeout_at(deadline, reading).await {
        Ok(Ok(read)) => read,
        Ok(Err(error)) => return note(&format!("reading /proc failed: {error}")),
        Err(_) => return note(&format!("reading /proc took longer than {LIMIT:?}")),
    };
    with_python_frames(read, deadline).await
}

/// Stacks that say only why there are none.
fn note(text: &str) -> TaskStacks {
    TaskStacks {
        processes: Vec::new(),
        notes: vec![text.to_owned()],
    }
}

/// Reads the processes of `root` (with its descendants when `tree`) from `/proc`, and finds
/// py-spy for the Python ones. Blocks.
fn read(root: u32, first: First, tree: bool, lookup: &PySpyLookup) -> Read {
    let pids = if tree {
        tree_order(root, &parents())
    } else {
        vec![root]
    };
    let mut read = Read::default();
    for pid in pids {
        let Some(process) = read_process(pid, first) else {
            if pid == root {
                read.stacks
                    .notes
                    .push(format!("process {pid} ended before it could be read"));
            }
            continue;
        };
        if is_python(pid, &process) {
            read.python.push(Python {
                index: read.stacks.processes.len(),
                pid,
                py_spy: find_py_spy(pid, lookup),
            });
        }
        read.stacks.processes.push(process);
    }
    read
}

/// Every process's parent, as `/proc` says. Blocks: a scan of `/proc`.
fn parents() -> Vec<(u32, u32)> {
    procfs::pids()
        .filter_map(|pid| Some((pid, procfs::read_stat(pid).ok()??.parent)))
        .collect()
}

/// `root` and its descendants among `parents` (`(pid, parent)` pairs), depth first, each
/// process's children by pid.
fn tree_order(root: u32, parents: &[(u32, u32)]) -> Vec<u32> {
    let mut children: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for &(pid, parent) in parents {
        children.entry(parent).or_default().insert(pid);
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        if !seen.insert(pid) {
            continue;
        }
        order.push(pid);
        if let Some(kids) = children.get(&pid) {
            next.extend(kids.iter().rev());
        }
    }
    order
}

/// One process and its threads; `None` when it is gone.
fn read_process(pid: u32, first: First) -> Option<ProcessStacks> {
    let command = command_line(pid)?;
    let mut threads: Vec<ThreadStack> = thread_ids(pid)
        .into_iter()
        .filter_map(|tid| read_thread(pid, tid))
        .collect();
    if threads.is_empty() {
        return None;
    }
    threads.sort_by_key(|thread| (thread_rank(pid, thread, first), thread.tid));
    Some(ProcessStacks {
        pid,
        command,
        threads,
    })
}

/// Where a thread goes in its process's list: lower first.
fn thread_rank(pid: u32, thread: &ThreadStack, first: First) -> u8 {
    let main = thread.tid == pid;
    match first {
        First::Main => u8::from(!main),
        First::TaskThreads if thread.name == TASK_THREAD => 0,
        First::TaskThreads => 1 + u8::from(!main),
    }
}

/// The command line (arguments joined by spaces), else `comm` for a process without one
/// (a zombie, a kernel thread); `None` when the process is gone.
fn command_line(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&byte| byte == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    if args.is_empty() {
        read_trimmed(&format!("/proc/{pid}/comm"))
    } else {
        Some(args.join(" "))
    }
}

/// The ids of a process's threads, as listed now.
fn thread_ids(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}

/// One thread's name, state and wait channel; `None` when it is gone.
fn read_thread(pid: u32, tid: u32) -> Option<ThreadStack> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    let state = procfs::parse_stat(&stat)?.state;
    Some(ThreadStack {
        tid,
        name: read_trimmed(&format!("{dir}/comm")).unwrap_or_default(),
        state: state.to_string(),
        wchan: read_trimmed(&format!("{dir}/wchan")).and_then(|wchan| wait_channel(&wchan)),
        frames: Vec::new(),
    })
}

/// A file's text without its line end.
fn read_trimmed(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.trim_end_matches('\n').to_owned())
}

/// What `wchan` says: `"0"` or nothing is a thread that waits in no kernel function (it
/// runs) or one the kernel will not name.
fn wait_channel(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty() && text != "0").then(|| text.to_owned())
}

/// Whether the process runs Python: its executable's name, or its main thread's, says so.
fn is_python(pid: u32, process: &ProcessStacks) -> bool {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let exe_says = exe
        .as_deref()
        .and_then(Path::file_name)
        .is_some_and(|name| name.to_string_lossy().contains("python"));
    exe_says
        || process
            .threads
            .iter()
            .find(|thread| thread.tid == pid)
            .is_some_and(|main| main.name.contains("python"))
}

/// The py-spy for Python process `pid`, in the order of the module's doc.
fn find_py_spy(pid: u32, lookup: &PySpyLookup) -> Option<PathBuf> {
    if let Some(explicit) = &lookup.explicit {
        return Some(explicit.clone());
    }
    let beside = [argv0_dir(pid), exe_dir(pid)]
        .into_iter()
        .flatten()
        .map(|dir| dir.join("py-spy"))
        .find(|candidate| is_executable(candidate));
    beside.or_else(|| {
        let path = lookup.path.as_deref()?;
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        which::which_in("py-spy", Some(path), cwd).ok()
    })
}

/// The directory of the process's `argv[0]`, when it names a path (a relative one from the
/// process's working directory).
fn argv0_dir(pid: u32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv0 = cmdline.split(|&byte| byte == 0).next()?;
    let argv0 = Path::new(std::str::from_utf8(argv0).ok()?);
    if argv0.components().count() < 2 {
        return None;
    }
    let path = if argv0.is_absolute() {
        argv0.to_owned()
    } else {
        std::fs::read_link(format!("/proc/{pid}/cwd"))
            .ok()?
            .join(argv0)
    };
    path.parent().map(Path::to_owned)
}

/// The directory of the process's executable, as the kernel resolved it.
fn exe_dir(pid: u32) -> Option<PathBuf> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    exe.parent().map(Path::to_owned)
}

/// Whether `path` is a file someone may execute.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Adds py-spy's frames to the Python processes of `read`, every dump at once, each until
/// `deadline`; what failed becomes a note.
async fn with_python_frames(read: Read, deadline: Instant) -> TaskStacks {
    let Read { mut stacks, python } = read;
    let dumps = python.iter().map(|process| async move {
        match &process.py_spy {
            Some(py_spy) => dump(py_spy, process.pid, deadline).await,
            None => (Err(DumpError::NotFound), None),
        }
    });
    let results = futures::future::join_all(dumps).await;
    for (process, (result, native_note)) in python.iter().zip(results) {
        let Some(stacks_of) = stacks.processes.get_mut(process.index) else {
            continue;
        };
        stacks.notes.extend(native_note);
        match result {
            Ok(threads) => stacks.notes.extend(attach(stacks_of, threads)),
            Err(error) => stacks
                .notes
                .push(dump_note(process, &stacks_of.command, &error)),
        }
    }
    stacks
}

/// What a failed dump of `process` says to the reader.
fn dump_note(process: &Python, command: &str, error: &DumpError) -> String {
    let pid = process.pid;
    match error {
        DumpError::NotFound => format!(
            "py-spy was not found for Python process {pid} ({command}), so its threads show \
             their kernel state only: install it where the task's Python is \
             (`pip install py-spy`, or `pip install trainyard[stacks]`), or set {PY_SPY} to \
             its path"
        ),
        other => format!(
            "no Python frames for process {pid} ({command}): {}",
            ErrorChain(other)
        ),
    }
}

/// Why py-spy gave no frames.
#[derive(Debug, thiserror::Error)]
enum DumpError {
    /// No py-spy was found.
    #[error("py-spy was not found")]
    NotFound,
    /// It could not be started.
    #[error("py-spy at {} cannot be started", py_spy.display())]
    CannotStart {
        /// The executable.
        py_spy: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
    /// It ended with an error.
    #[error("py-spy failed ({status}): {reason}")]
    Failed {
        /// How it ended.
        status: std::process::ExitStatus,
        /// The first line of what it said.
        reason: String,
    },
    /// It did not finish in time, and was killed.
    #[error("py-spy did not finish within {limit:?} and was killed")]
    TimedOut {
        /// The time it had.
        limit: Duration,
    },
    /// Its output is not the JSON of py-spy 0.4.
    #[error("py-spy's output is not understood")]
    BadOutput(#[source] serde_json::Error),
}

/// Dumps process `pid` with py-spy, plainly, then natively with the time left; the native
/// dump's threads when it succeeded, else the plain one's and a note on the native dump.
async fn dump(
    py_spy: &Path,
    pid: u32,
    deadline: Instant,
) -> (Result<Vec<DumpedThread>, DumpError>, Option<String>) {
    let plain = match run_py_spy(py_spy, pid, Mode::Plain, deadline).await {
        Ok(threads) => threads,
        Err(error) => return (Err(error), None),
    };
    match run_py_spy(py_spy, pid, Mode::Native, deadline).await {
        Ok(threads) => (Ok(threads), None),
        Err(error) => (
            Ok(plain),
            Some(format!(
                "py-spy --native on process {pid}: {}; its frames are Python's only",
                ErrorChain(&error)
            )),
        ),
    }
}

/// How py-spy reads a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Python frames and the native frames around them (`--native`).
    Native,
    /// Python frames only.
    Plain,
}

/// Runs `py-spy dump --pid PID --json` until `deadline` (killed then) and parses its output.
async fn run_py_spy(
    py_spy: &Path,
    pid: u32,
    mode: Mode,
    deadline: Instant,
) -> Result<Vec<DumpedThread>, DumpError> {
    let mut command = tokio::process::Command::new(py_spy);
    command
        .args(["dump", "--json", "--pid"])
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if mode == Mode::Native {
        command.arg("--native");
    }
    let limit = deadline.saturating_duration_since(Instant::now());
    let child = command.spawn().map_err(|error| DumpError::CannotStart {
        py_spy: py_spy.to_owned(),
        error,
    })?;
    // The agent's own: the sweep at the end of a task spares it.
    let _helper = child.id().map(crate::descendants::helper);
    let output = tokio::time::timeout_at(deadline, child.wait_with_output())
        .await
        .map_err(|_| DumpError::TimedOut { limit })?
        .map_err(|error| DumpError::CannotStart {
            py_spy: py_spy.to_owned(),
            error,
        })?;
    if !output.status.success() {
        return Err(DumpError::Failed {
            status: output.status,
            reason: first_line(&output.stderr),
        });
    }
    parse_dump(&output.stdout).map_err(DumpError::BadOutput)
}

/// The first non-empty line of what a program said.
fn first_line(text: &[u8]) -> String {
    String::from_utf8_lossy(text)
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("it said nothing")
        .to_owned()
}

/// One thread of `py-spy dump --json` (py-spy 0.4); what is not used is not read.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct DumpedThread {
    /// The kernel's thread id; py-spy cannot always tell it.
    #[serde(default)]
    os_thread_id: Option<u64>,
    /// Python's name of the thread (`MainThread`).
    #[serde(default)]
    thread_name: Option<String>,
    /// Innermost first.
    #[serde(default)]
    frames: Vec<DumpedFrame>,
}

/// One frame of a [`DumpedThread`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct DumpedFrame {
    /// The function (`<module>`, `Thread.run`, `clock_nanosleep`).
    name: String,
    /// Its file, in full.
    #[serde(default)]
    filename: Option<String>,
    /// Its file as py-spy shortens it (the package part only).
    #[serde(default)]
    short_filename: Option<String>,
    /// Its line; 0 for a native frame.
    #[serde(default)]
    line: Option<i64>,
}

/// Parses py-spy's JSON output.
fn parse_dump(stdout: &[u8]) -> Result<Vec<DumpedThread>, serde_json::Error> {
    serde_json::from_slice(stdout)
}

impl From<DumpedFrame> for Frame {
    fn from(frame: DumpedFrame) -> Self {
        let non_empty = |name: Option<String>| name.filter(|name| !name.is_empty());
        Self {
            function: frame.name,
            file: non_empty(frame.short_filename).or_else(|| non_empty(frame.filename)),
            line: frame
                .line
                .filter(|&line| line > 0)
                .and_then(|line| u32::try_from(line).ok()),
        }
    }
}

/// Puts py-spy's threads on the process's threads, by thread id (Python's main thread on
/// the process's own, should py-spy not know its id); notes what matched no thread.
fn attach(process: &mut ProcessStacks, dumped: Vec<DumpedThread>) -> Option<String> {
    let mut unmatched = 0usize;
    for thread in dumped {
        let main = thread.thread_name.as_deref() == Some("MainThread");
        let tid = thread
            .os_thread_id
            .and_then(|tid| u32::try_from(tid).ok())
            .or_else(|| main.then_some(process.pid));
        let Some(target) = process.threads.iter_mut().find(|t| Some(t.tid) == tid) else {
            unmatched += 1;
            continue;
        };
        if let Some(name) = thread.thread_name.filter(|name| !name.is_empty()) {
            target.name = name;
        }
        target.frames = thread.frames.into_iter().map(Frame::from).collect();
    }
    (unmatched > 0).then(|| {
        format!(
            "{unmatched} Python thread(s) of process {} matched no thread in /proc \
             (started or ended meanwhile)",
            process.pid
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `py-spy dump --pid P --json --native` (py-spy 0.4.3) of
    /// `threading.Thread(target=lambda: time.sleep(600), name="loader-0")` started from a
    /// script that then sleeps too, trimmed to the main thread and two frames of the other.
    const NATIVE_DUMP: &str = r#"[
      {"pid": 27130, "thread_id": 140675323020992, "thread_name": "loader-0",
       "os_thread_id": 27133, "active": false, "owns_gil": false,
       "frames": [
         {"name": "clock_nanosleep", "filename": "/usr/lib/x86_64-linux-gnu/libc.so.6",
          "module": "/usr/lib/x86_64-linux-gnu/libc.so.6", "short_filename": "libc.so.6",
          "line": 0, "locals": null, "is_entry": true, "is_shim_entry": true},
         {"name": "worker", "filename": "/tmp/sleepy.py", "module": null,
          "short_filename": "sleepy.py", "line": 3, "locals": null, "is_entry": true,
          "is_shim_entry": false}],
       "process_info": null},
      {"pid": 27130, "thread_id": 140675334798208, "thread_name": "MainThread",
       "os_thread_id": 27130, "active": false, "owns_gil": false,
       "frames": [
         {"name": "<module>", "filename": "/tmp/sleepy.py", "module": null,
          "short_filename": "sleepy.py", "line": 6, "locals": null, "is_entry": true,
          "is_shim_entry": true}],
       "process_info": null}
    ]"#;

    fn thread(tid: u32, name: &str) -> ThreadStack {
        ThreadStack {
            tid,
            name: name.to_owned(),
            state: "S".to_owned(),
            wchan: Some("hrtimer_nanosleep".to_owned()),
            frames: Vec::new(),
        }
    }

    #[test]
    fn py_spy_json_lands_on_the_threads_by_their_ids_with_pythons_names() {
        let dumped = parse_dump(NATIVE_DUMP.as_bytes()).expect("py-spy 0.4's JSON parses");
        let mut process = ProcessStacks {
            pid: 27130,
            command: "python /tmp/sleepy.py".to_owned(),
            threads: vec![thread(27130, "python"), thread(27133, "python")],
        };
        assert_eq!(attach(&mut process, dumped), None);
        let main = &process.threads[0];
        assert_eq!(main.name, "MainThread");
        assert_eq!(
            main.frames,
            vec![Frame {
                function: "<module>".to_owned(),
                file: Some("sleepy.py".to_owned()),
                line: Some(6),
            }]
        );
        let loader = &process.threads[1];
        assert_eq!(loader.name, "loader-0");
        assert_eq!(
            loader.frames[0].to_string(),
            "clock_nanosleep (libc.so.6)",
            "a native frame has no line"
        );
        assert_eq!(loader.frames[1].to_string(), "worker (sleepy.py:3)");
        assert_eq!(loader.state, "S", "the kernel's view stays");
    }

    #[test]
    fn python_threads_that_match_none_are_noted_and_a_main_thread_without_id_is_the_process() {
        let dumped = parse_dump(
            br#"[{"thread_name": "MainThread", "os_thread_id": null,
                  "frames": [{"name": "f", "filename": "/x/a.py", "line": 2}]},
                 {"thread_name": "gone", "os_thread_id": 99, "frames": []}]"#,
        )
        .expect("parses");
        let mut process = ProcessStacks {
            pid: 7,
            command: "python".to_owned(),
            threads: vec![thread(7, "python")],
        };
        let note = attach(&mut process, dumped).expect("a note");
        assert!(
            note.starts_with("1 Python thread(s) of process 7"),
            "{note}"
        );
        assert_eq!(process.threads[0].frames[0].to_string(), "f (/x/a.py:2)");
        assert!(parse_dump(b"Error: Failed to find python version").is_err());
    }

    #[test]
    fn the_tree_is_the_root_then_its_descendants_depth_first_by_pid() {
        let parents = [
            (10, 1),
            (30, 10),
            (20, 10),
            (31, 30),
            (21, 20),
            (99, 1),
            (5, 31),
        ];
        assert_eq!(tree_order(10, &parents), vec![10, 20, 21, 30, 31, 5]);
        assert_eq!(tree_order(42, &parents), vec![42], "a lone root");
        assert_eq!(tree_order(1, &[(1, 1), (2, 1)]), vec![1, 2], "no loops");
    }

    #[test]
    fn a_thread_state_is_read_after_the_last_parenthesis_of_its_name() {
        let line = "4242 (we) (ird) S) D 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9";
        let stat = procfs::parse_stat(line).expect("parses");
        assert_eq!((stat.state, stat.parent), ('D', 1));
        assert_eq!(wait_channel("0"), None);
        assert_eq!(wait_channel(""), None);
        assert_eq!(
            wait_channel("hrtimer_nanosleep\n"),
            Some("hrtimer_nanosleep".to_owned())
        );
    }

    #[test]
    fn the_main_thread_comes_first_and_a_functions_threads_before_it() {
        let main = thread(7, "agent");
        let task = thread(9, TASK_THREAD);
        let other = thread(8, "tokio-runtime-w");
        assert_eq!(thread_rank(7, &main, First::Main), 0);
        assert_eq!(thread_rank(7, &task, First::Main), 1);
        assert_eq!(thread_rank(7, &task, First::TaskThreads), 0);
        assert_eq!(thread_rank(7, &main, First::TaskThreads), 1);
        assert_eq!(thread_rank(7, &other, First::TaskThreads), 2);
    }

    #[test]
    fn this_process_reads_with_its_threads_and_a_gone_one_is_noted() {
        let me = std::process::id();
        let read = read(me, First::Main, true, &PySpyLookup::default());
        let process = &read.stacks.processes[0];
        assert_eq!(process.pid, me);
        assert_eq!(process.threads[0].tid, me, "the main thread first");
        assert!(!process.command.is_empty());
        assert!(read.python.is_empty());

        let gone = super::read(u32::MAX - 1, First::Main, true, &PySpyLookup::default());
        assert!(gone.stacks.processes.is_empty());
        assert_eq!(gone.stacks.notes.len(), 1, "{:?}", gone.stacks.notes);
    }

    #[tokio::test]
    async fn no_task_is_said_and_a_missing_py_spy_says_how_to_get_one() {
        let idle = capture(Subject::Idle, PySpyLookup::default()).await;
        assert!(idle.processes.is_empty());
        assert_eq!(idle.notes, vec!["no task runs".to_owned()]);

        let python = Python {
            index: 0,
            pid: 5,
            py_spy: None,
        };
        let note = dump_note(&python, "python train.py", &DumpError::NotFound);
        assert!(
            note.contains("pip install py-spy") && note.contains(PY_SPY),
            "{note}"
        );
    }

    /// A stand-in for py-spy: a shell script of `body`, in `dir`.
    fn fake_py_spy(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("py-spy");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("written");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("made executable");
        path
    }

    /// [`dump`], again while the script cannot be run yet: a process another test thread
    /// forked meanwhile may hold it open for writing until it executes (`ETXTBSY`).
    async fn dump_fake(
        py_spy: &Path,
        deadline: Duration,
    ) -> (Result<Vec<DumpedThread>, DumpError>, Option<String>) {
        for _ in 0..50 {
            let dumped = dump(py_spy, 1, Instant::now() + deadline).await;
            match &dumped.0 {
                Err(DumpError::CannotStart { error, .. }) if error.raw_os_error() == Some(26) => {
                    tokio::task::yield_now().await;
                }
                _ => return dumped,
            }
        }
        panic!("{} stayed busy", py_spy.display());
    }

    #[tokio::test]
    async fn a_py_spy_that_does_not_finish_is_killed_at_the_deadline() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let slow = fake_py_spy(dir.path(), "exec sleep 30");
        let started = Instant::now();
        let (result, native) = dump_fake(&slow, Duration::from_millis(900)).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(result, Err(DumpError::TimedOut { .. })),
            "{result:?}"
        );
        assert_eq!(native, None, "no native dump after a plain one that failed");
    }

    #[tokio::test]
    async fn a_native_dump_that_runs_out_of_time_leaves_the_plain_frames() {
        let dir = tempfile::tempdir().expect("a temp dir");
        // Plain, a dump at once; with --native, longer than the time left, as on a loaded host.
        let body = r#"case "$*" in
  *--native*) exec sleep 30 ;;
  *) echo '[{"os_thread_id": 1, "thread_name": "MainThread", "frames": [{"name": "all_reduce", "line": 7}]}]' ;;
esac"#;
        let py_spy = fake_py_spy(dir.path(), body);
        let started = Instant::now();
        let (result, native) = dump_fake(&py_spy, Duration::from_millis(900)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        let threads = result.expect("the plain dump's threads");
        assert_eq!(threads[0].frames[0].name, "all_reduce");
        let native = native.expect("a note on the native dump");
        assert!(native.contains("did not finish"), "{native}");
    }

    #[tokio::test]
    async fn a_failed_native_dump_leaves_the_plain_frames_and_is_told() {
        let dir = tempfile::tempdir().expect("a temp dir");
        // Fails with --native, as py-spy on a platform it cannot unwind; plain, prints a dump.
        let body = r#"case "$*" in
  *--native*) echo "Error: native unwinding is not supported" >&2; exit 1 ;;
  *) echo '[{"os_thread_id": 1, "thread_name": "MainThread", "frames": []}]' ;;
esac"#;
        let py_spy = fake_py_spy(dir.path(), body);
        let (result, native) = dump_fake(&py_spy, Duration::from_secs(2)).await;
        assert_eq!(result.map(|threads| threads.len()).ok(), Some(1));
        let native = native.expect("a note on the native dump");
        assert!(
            native.contains("Error: native unwinding is not supported"),
            "{native}"
        );

        let broken = fake_py_spy(dir.path(), "echo 'Error: Permission denied' >&2; exit 1");
        let (result, _) = dump_fake(&broken, Duration::from_secs(2)).await;
        let error = result.expect_err("failed");
        let python = Python {
            index: 0,
            pid: 1,
            py_spy: Some(broken),
        };
        let note = dump_note(&python, "python train.py", &error);
        assert!(
            note.contains("python train.py") && note.contains("Error: Permission denied"),
            "{note}"
        );
    }
}
