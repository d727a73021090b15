//! The soak itself: back-to-back `trainyard run`s of the local runtime, a fixed mix of
//! endings, and the machine's figures before and after.
//!
//! Shared by `cargo xtask soak` and by the CLI's test `crates/cli/tests/soak.rs`, which alone
//! gets the built binary's path without a nested cargo.
//!
//! Every run reserves through a private ledger, keeps its folder in private storage, and
//! carries the CLI tests' marker (`TRAINYARD_TEST_MARKER`, a value of the soak's own) in its
//! driver's and its workers' environment, all from one [`Sandbox`], so the processes it
//! leaves behind are told apart from the rest of a shared machine's. An agent's watchdog,
//! forked by the agent, carries the marker too; one started as a program carries none, and
//! one left behind is found as a watchdog of this session, started after the soak, whose
//! agent is gone.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{BufRead as _, BufReader, Read};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use crate::processes::{MARKER, Sandbox, left_behind, marked, orphaned_watchdogs};

/// How long one run may take, interrupts and a restart's 1 s back-off included.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// How long the figures may take to come back to the baseline after the last run.
const SETTLE: Duration = Duration::from_secs(5);

/// How a run is driven to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drive {
    /// Left to end by itself.
    ToTheEnd,
    /// SIGINT once this many workers have printed `up`.
    InterruptOnceUp(usize),
}

/// One kind of run: `trainyard run ARGS -- PROGRAM`, and the exit code it must give.
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    args: &'static [&'static str],
    program: &'static [&'static str],
    drive: Drive,
    exit_code: i32,
}

/// The mix, run in this order again and again: the first seven runs hold one of each.
const CASES: [Case; 7] = [
    Case {
        name: "2 workers of true",
        args: &["-n", "2"],
        program: &["true"],
        drive: Drive::ToTheEnd,
        exit_code: 0,
    },
    Case {
        name: "an interrupt once 2 workers are up",
        args: &["-n", "2"],
        program: &["sh", "-c", "echo up; exec sleep 30"],
        drive: Drive::InterruptOnceUp(2),
        exit_code: 130,
    },
    Case {
        name: "a failing program",
        args: &[],
        program: &["sh", "-c", "exit 3"],
        drive: Drive::ToTheEnd,
        exit_code: 1,
    },
    Case {
        name: "zero workers",
        args: &["-n", "0"],
        program: &["true"],
        drive: Drive::ToTheEnd,
        exit_code: 2,
    },
    Case {
        name: "3 workers that print",
        args: &["-n", "3"],
        program: &["sh", "-c", "echo x"],
        drive: Drive::ToTheEnd,
        exit_code: 0,
    },
    Case {
        name: "more CPUs than the machine has",
        args: &["-r", "CPU=10000"],
        program: &["true"],
        drive: Drive::ToTheEnd,
        exit_code: 3,
    },
    Case {
        name: "a failure restarted once",
        args: &["--max-failures", "1"],
        program: &["false"],
        drive: Drive::ToTheEnd,
        exit_code: 1,
    },
];

/// What the soak measures on the machine, before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figures {
    /// Processes of this user, the rest of the machine's activity included.
    user_processes: usize,
    /// Live processes that carry the soak's marker, and watchdogs left behind.
    marked: Vec<u32>,
    /// What the soak process's open file descriptors point at.
    open_fds: Vec<String>,
    /// Inodes of the listening TCP sockets (IPv4 and IPv6) of the network namespace.
    listening: BTreeSet<u64>,
    /// Entries in the soak's ledger.
    ledger_entries: usize,
}

impl Figures {
    fn measure(mark: &str, ledger: &Path) -> Result<Self, String> {
        Ok(Self {
            user_processes: user_processes(),
            marked: marked(mark)
                .into_iter()
                .chain(orphaned_watchdogs())
                .collect(),
            open_fds: open_fds(),
            listening: listening_tcp(),
            ledger_entries: ledger_entries(ledger)?,
        })
    }

    /// Inodes of the sockets the soak process holds.
    fn own_sockets(&self) -> BTreeSet<u64> {
        self.open_fds
            .iter()
            .filter_map(|target| {
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .collect()
    }
}

/// What a soak that passed measured.
#[derive(Debug, Clone)]
pub struct Report {
    runs: usize,
    elapsed: Duration,
    before: Figures,
    after: Figures,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, a) = (&self.before, &self.after);
        writeln!(
            f,
            "soak: {} runs in {:.1} s ({:.1} runs/s), every exit code as expected",
            self.runs,
            self.elapsed.as_secs_f64(),
            self.runs as f64 / self.elapsed.as_secs_f64()
        )?;
        writeln!(f, "                                  before  after")?;
        let rows = [
            (
                "processes of the soak's runs",
                b.marked.len(),
                a.marked.len(),
            ),
            (
                "processes of this user (all)",
                b.user_processes,
                a.user_processes,
            ),
            ("open fds of the soak", b.open_fds.len(), a.open_fds.len()),
            (
                "listening tcp sockets",
                b.listening.len(),
                a.listening.len(),
            ),
            ("ledger entries", b.ledger_entries, a.ledger_entries),
        ];
        for (name, before, after) in rows {
            writeln!(f, "  {name:<30} {before:>6} {after:>6}")?;
        }
        write!(
            f,
            "  (this user's processes and the listening sockets include the rest of the machine's activity)"
        )
    }
}

/// Runs `runs` runs of `trainyard` (the CLI binary) one after another; the figures, or the
/// first run that ended wrong, or what was left behind.
pub fn soak(trainyard: &Path, runs: usize) -> Result<Report, String> {
    let sandbox = Sandbox::new("soak");
    let before = Figures::measure(sandbox.mark(), &sandbox.ledger())?;
    let started = Instant::now();
    for (run, case) in CASES.iter().cycle().take(runs).enumerate() {
        run_case(trainyard, &sandbox, case)
            .map_err(|problem| format!("run {run} ({}): {problem}", case.name))?;
    }
    let elapsed = started.elapsed();
    let after = settle(&before, sandbox.mark(), &sandbox.ledger())?;
    check(&before, &after)?;
    Ok(Report {
        runs,
        elapsed,
        before,
        after,
    })
}

/// The figures once the processes of the runs are gone and the soak's descriptors are back
/// to the baseline, or after [`SETTLE`].
fn settle(before: &Figures, mark: &str, ledger: &Path) -> Result<Figures, String> {
    let deadline = Instant::now() + SETTLE;
    left_behind(mark, SETTLE);
    loop {
        let after = Figures::measure(mark, ledger)?;
        let settled = after.marked.is_empty() && after.open_fds.len() <= before.open_fds.len();
        if settled || Instant::now() > deadline {
            return Ok(after);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn check(before: &Figures, after: &Figures) -> Result<(), String> {
    let mut problems = Vec::new();
    if !after.marked.is_empty() {
        problems.push(format!(
            "{} processes of the runs are still alive {SETTLE:?} after the last run: pids {:?}",
            after.marked.len(),
            after.marked
        ));
    }
    if after.open_fds.len() > before.open_fds.len() {
        problems.push(format!(
            "the soak holds {} file descriptors, {} before: {:?}",
            after.open_fds.len(),
            before.open_fds.len(),
            after.open_fds
        ));
    }
    let ours: Vec<_> = after
        .listening
        .difference(&before.listening)
        .filter(|inode| after.own_sockets().contains(inode))
        .collect();
    if !ours.is_empty() {
        problems.push(format!(
            "the soak holds listening sockets it did not hold before: inodes {ours:?}"
        ));
    }
    if after.ledger_entries != 0 {
        problems.push(format!(
            "the ledger holds {} entries after every run ended",
            after.ledger_entries
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the soak left things behind:\n  {}",
            problems.join("\n  ")
        ))
    }
}

fn command(trainyard: &Path, sandbox: &Sandbox, case: &Case) -> Command {
    let mut command = Command::new(trainyard);
    command
        .arg("run")
        .args(["--backend", "none", "--num-cpus", "4", "--memory", "4GB"])
        .args(["--env", &format!("{MARKER}={}", sandbox.mark())])
        .args(case.args)
        .arg("--")
        .args(case.program)
        .env(MARKER, sandbox.mark())
        .envs(sandbox.env())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// One run, driven as its case says; an error names the exit and the run's stderr.
fn run_case(trainyard: &Path, sandbox: &Sandbox, case: &Case) -> Result<(), String> {
    let deadline = Instant::now() + RUN_LIMIT;
    let stdout = match case.drive {
        Drive::ToTheEnd => Stdio::null(),
        Drive::InterruptOnceUp(_) => Stdio::piped(),
    };
    let mut child = command(trainyard, sandbox, case)
        .stdout(stdout)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", trainyard.display()))?;
    let stderr = drain(child.stderr.take());
    if let Drive::InterruptOnceUp(workers) = case.drive {
        let up = lines(child.stdout.take());
        if let Err(problem) = wait_until_up(&up, workers, deadline) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{problem}; stderr:\n{}", text(&stderr, deadline)));
        }
        interrupt(child.id())?;
    }
    let status = wait_bounded(&mut child, deadline);
    let stderr = text(&stderr, deadline);
    match status {
        Some(status) if status.code() == Some(case.exit_code) => Ok(()),
        Some(status) => Err(format!(
            "{status}, expected exit code {}; stderr:\n{stderr}",
            case.exit_code
        )),
        None => Err(format!(
            "still running after {RUN_LIMIT:?}; stderr:\n{stderr}"
        )),
    }
}

/// The exit status, or `None` (the run killed) when it is not over by `deadline`.
fn wait_bounded(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Waits for `workers` lines that end in `up`.
fn wait_until_up(
    lines: &Receiver<String>,
    workers: usize,
    deadline: Instant,
) -> Result<(), String> {
    let mut up = 0;
    while up < workers {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.trim_end().ends_with("up") => up += 1,
            Ok(_) => {}
            Err(_) => return Err(format!("{up} of {workers} workers came up")),
        }
    }
    Ok(())
}

fn interrupt(pid: u32) -> Result<(), String> {
    let status = Command::new("kill")
        .args(["-s", "INT", &pid.to_string()])
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -s INT {pid} failed ({status})"))
    }
}

/// The pipe's lines, as they come, from a thread of their own.
fn lines(pipe: Option<impl Read + Send + 'static>) -> Receiver<String> {
    let (send, receive) = mpsc::channel();
    if let Some(pipe) = pipe {
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
    }
    receive
}

/// All of the pipe, once every writer has closed it, from a thread of its own: a process
/// left behind that holds the pipe shows as text that never comes, not as a hung soak.
fn drain(pipe: Option<impl Read + Send + 'static>) -> Receiver<String> {
    let (send, receive) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            let _ = send.send(text);
        });
    }
    receive
}

fn text(drained: &Receiver<String>, deadline: Instant) -> String {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    drained
        .recv_timeout(left)
        .unwrap_or_else(|_| "(still open: a process left behind holds it)".to_owned())
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}

fn user_processes() -> usize {
    let Ok(me) = std::fs::metadata("/proc/self") else {
        return 0;
    };
    pids()
        .filter(|pid| std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == me.uid()))
        .count()
}

fn open_fds() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            std::fs::read_link(e.path())
                .map_or_else(|_| "?".to_owned(), |t| t.display().to_string())
        })
        .collect()
}

/// Inodes of the sockets in state `0A` (listen) in `/proc/net/tcp` and `/proc/net/tcp6`.
fn listening_tcp() -> BTreeSet<u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<_> = line.split_whitespace().collect();
                    (fields.get(3) == Some(&"0A")).then(|| fields.get(9)?.parse().ok())?
                })
                .collect::<Vec<u64>>()
        })
        .collect()
}

/// The entries of the ledger at `path`, dead owners' included; none when there is no file.
fn ledger_entries(path: &Path) -> Result<usize, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(format!("cannot read the ledger {}: {e}", path.display())),
    };
    let ledger: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the ledger {} is not JSON: {e}", path.display()))?;
    Ok(ledger["runs"].as_array().map_or(0, Vec::len))
}
