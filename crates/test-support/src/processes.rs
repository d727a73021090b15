//! Every run of a test carries a marker in its workers' environment, and these helpers find
//! the processes that still carry it; every run reserves through a ledger of its test's own
//! and keeps its folder in the test's own storage ([`Sandbox`]). The soak's driver
//! ([`crate::soak`]) uses them too.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The variable that marks a test's processes.
pub const MARKER: &str = "TRAINYARD_TEST_MARKER";

/// Where a run reserves what it holds (`trainyard_runtime_local::ledger::LEDGER_ENV`).
pub const LEDGER: &str = "TRAINYARD_LEDGER";

/// Where a run keeps its folder when `--storage` is not given.
pub const STORAGE: &str = "TRAINYARD_STORAGE";

/// The environment entry of an agent's watchdog, which starts with nothing else
/// (`trainyard_wire::config::ROLE` set to `ROLE_WATCHDOG`, see `crates/agent/src/watchdog.rs`).
const WATCHDOG_ROLE: &[u8] = b"TRAINYARD_ROLE=watchdog";

/// What a watchdog the agent forked is called (`/proc/<pid>/comm`; `NAME` in
/// `crates/agent/src/watchdog.rs`). It carries its agent's environment, the test's marker
/// among it.
const WATCHDOG_NAME: &str = "trainyard-wdog";

/// The environment entry of a worker agent.
const AGENT_ROLE: &[u8] = b"TRAINYARD_ROLE=agent";

/// What a test's runs are confined to: a marker of their own, a ledger of their own (so a
/// test never waits for another trainyard run on this machine, nor for another test, and
/// never changes the machine's ledger), and storage of their own for their run folders
/// (never `~/trainyard_results`). A directory under the temporary directory, removed on drop.
#[derive(Debug)]
pub struct Sandbox {
    dir: PathBuf,
    mark: String,
}

impl Sandbox {
    /// A new sandbox; `name` starts its marker.
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        loop {
            let mark = format!(
                "{name}-{}-{}-{nanos}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let dir = std::env::temp_dir().join(format!("trainyard-test-{mark}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Self { dir, mark },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("cannot create {}: {e}", dir.display()),
            }
        }
    }

    /// The marker of this sandbox's runs.
    pub fn mark(&self) -> &str {
        &self.mark
    }

    /// The ledger of this sandbox's runs.
    pub fn ledger(&self) -> PathBuf {
        self.dir.join("ledger")
    }

    /// Where this sandbox's runs keep their folders.
    pub fn storage(&self) -> PathBuf {
        self.dir.join("results")
    }

    /// The variables that confine a `trainyard` command to this sandbox (not the marker:
    /// a run passes that on with `--env`, where its workers get it).
    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        [(LEDGER, self.ledger()), (STORAGE, self.storage())]
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Live (not zombie) processes whose environment holds `MARKER=mark`, and the watchdogs
/// they started (a forked one carries the marker; one started as a program starts with an
/// empty environment, so it carries none).
pub fn marked(mark: &str) -> Vec<u32> {
    let needle = format!("{MARKER}={mark}");
    let live: Vec<u32> = pids().filter(|pid| !is_zombie(*pid)).collect();
    let mut found: Vec<u32> = live
        .iter()
        .copied()
        .filter(|pid| environ_has(*pid, needle.as_bytes()))
        .collect();
    let watchdogs: Vec<u32> = live
        .iter()
        .copied()
        .filter(|pid| !found.contains(pid) && is_watchdog(*pid))
        .filter(|pid| stat(*pid).is_some_and(|s| found.contains(&s.parent)))
        .collect();
    found.extend(watchdogs);
    found
}

/// Live watchdogs whose agent is gone, in this process's session and started after this
/// process: left behind by a run this process started, though which one cannot be told
/// (a watchdog's agent lives as long as it does, or it exits within moments of its agent).
pub fn orphaned_watchdogs() -> Vec<u32> {
    let Some(me) = stat(std::process::id()) else {
        return Vec::new();
    };
    pids()
        .filter(|pid| is_watchdog(*pid) && !is_zombie(*pid))
        .filter(|pid| {
            stat(*pid).is_some_and(|s| {
                s.session == me.session
                    && s.started >= me.started
                    && !environ_has(s.parent, AGENT_ROLE)
            })
        })
        .collect()
}

/// Whether `pid` is an agent's watchdog: one the agent forked (named `trainyard-wdog`), or
/// one started as a program (its environment holds nothing but its role).
pub fn is_watchdog(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim_end() == WATCHDOG_NAME)
        || environ_has(pid, WATCHDOG_ROLE)
}

/// Waits up to `limit` for every marked process, and every watchdog left behind by this
/// process's runs, to be gone; the ones left, if any.
pub fn left_behind(mark: &str, limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let mut left = marked(mark);
        for pid in orphaned_watchdogs() {
            if !left.contains(&pid) {
                left.push(pid);
            }
        }
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
}

/// Whether `pid`'s environment holds the entry `entry` (`NAME=value`).
fn environ_has(pid: u32, entry: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == entry))
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

/// What `/proc/PID/stat` says of a process's family.
struct Stat {
    parent: u32,
    session: u32,
    /// Clock ticks after boot.
    started: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, ppid, pgrp, session, ... and the
    // start time as the 20th.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Stat {
        parent: fields.get(1)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        started: fields.get(19)?.parse().ok()?,
    })
}

/// The events of a `--log-format json` run's stdout, one per line.
pub fn json_events(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON event per line"))
        .collect()
}

/// The `step` of each report of `rank`, in the order they arrived.
pub fn report_steps(events: &[serde_json::Value], rank: u64) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["event"] == "report" && e["rank"] == rank)
        .filter_map(|e| e["metrics"]["step"].as_u64())
        .collect()
}

/// The agent process of each rank of attempt `attempt` in a run's record (`run.json`), by
/// rank: the same pids in two attempts mean the restart kept the agents.
pub fn agent_pids(record: &serde_json::Value, attempt: usize) -> Vec<u64> {
    record["attempts"][attempt]["workers"]
        .as_array()
        .map(|workers| {
            workers
                .iter()
                .filter_map(|worker| worker["agent_pid"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

/// The example program `name` of the test's own package, which cargo builds beside the
/// test binary (`target/<profile>/examples/<name>`).
///
/// # Panics
/// When it is not there.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("examples").join(name))
        .filter(|path| path.exists())
        .unwrap_or_else(|| {
            panic!("examples/{name} is built with the tests (cargo test builds examples)")
        })
}

/// The workspace's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why the torch tests may skip, when CI knows and has said so loudly (`.ci/run`: the
/// package registry could not be reached to install torch).
pub const TORCH_SKIP: &str = "TRAINYARD_TORCH_SKIP";

/// The interpreter with torch: `$TRAINYARD_TORCH_PYTHON`, else the venv of
/// `scripts/python-env.sh`, which installs torch when it is missing. `None` (after a loud
/// `SKIP:`) only when the package registry cannot be reached, and then, under `CI=true`,
/// only when CI has said so ([`TORCH_SKIP`]): any other way to miss torch fails the test.
pub fn torch_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("TRAINYARD_TORCH_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(python));
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/python-env.sh"))
        .stdin(Stdio::null())
        .output()
        .expect("bash runs scripts/python-env.sh");
    match out.status.code() {
        Some(0) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .map(|line| PathBuf::from(line.trim())),
        Some(3) => {
            let reason = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            let known = std::env::var(TORCH_SKIP).ok().filter(|why| !why.is_empty());
            let under_ci = std::env::var("CI").is_ok_and(|ci| ci == "true");
            assert!(
                known.is_some() || !under_ci,
                "under CI=true the torch tests run unless CI said why not ({TORCH_SKIP}): {reason}"
            );
            eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
            eprintln!(
                "SKIP: the torch tests cannot run: {}",
                known.unwrap_or(reason)
            );
            eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
            None
        }
        _ => panic!(
            "scripts/python-env.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Waits for `child` to end, with its piped output (read while it runs, so that it is never
/// held up by a full pipe); kills it and panics, showing what it printed, when it runs past
/// `limit`.
pub fn wait_bounded(child: Child, limit: Duration) -> Output {
    wait_within(child, limit).unwrap_or_else(|output| {
        panic!(
            "the process did not finish within {limit:?}; stdout: {} stderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// [`wait_bounded`], where running past `limit` is the `Err` (with what the process printed
/// before it was killed) rather than a panic.
///
/// # Panics
/// When the child's status cannot be read.
pub fn wait_within(mut child: Child, limit: Duration) -> Result<Output, Output> {
    let stdout = child.stdout.take().map(crate::running::read_alongside);
    let stderr = child.stderr.take().map(crate::running::read_alongside);
    let deadline = Instant::now() + limit;
    let (status, ended) = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break (status, true);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break (child.wait().expect("wait"), false);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Output that something the process left holds open is given a little longer.
    let until = Instant::now() + Duration::from_secs(10);
    let gather = |reader: Option<crate::running::Alongside>| {
        reader.map_or_else(Vec::new, |reader| reader.gathered(until))
    };
    let output = Output {
        status,
        stdout: gather(stdout),
        stderr: gather(stderr),
    };
    if ended { Ok(output) } else { Err(output) }
}

/// A Python program (`python3 -c`) that writes to 512 MiB, and prints `survived` if it can.
pub const TOUCH_512MIB: &str = "b = bytearray(512 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')";

/// Asserts that `out` is the run of [`TOUCH_512MIB`] on one rank limited to 64 MiB, stopped
/// by the limit: its cgroup's (reported as the limit), else its address space's (a
/// `MemoryError`).
///
/// # Panics
/// When it is not.
pub fn assert_stopped_by_64mib_limit(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let cgroup = stderr.contains("rank 0 exceeded its memory limit of 64MiB");
    let rlimit = stderr.contains("MemoryError");
    assert!(
        cgroup || rlimit,
        "neither the cgroup nor the address-space limit stopped the worker: {stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("survived"));
}
