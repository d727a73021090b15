//! Faults across hosts, for the test clusters whose nodes have network namespaces of their
//! own (`scripts/netns-env.sh`): the hosts' layout, a link cut that is mended when dropped,
//! and what a fault test reads of a run while it goes on (its `run.json`, its ranks' pids,
//! the checkpoint it resumed from).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::running::Running;

/// The test hosts' layout (`NAME NAMESPACE ADDRESS HOST_LINK` a line), as
/// `scripts/netns-env.sh up` writes it.
pub const LAYOUT: &str = "/run/trainyard-netns/hosts";

/// One test host of [`LAYOUT`] that has a network namespace of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Its name (`n1`, `r2`, …).
    pub name: String,
    /// Its network namespace (`ty-n1`, …).
    pub namespace: String,
    /// Its address.
    pub address: String,
    /// The link on this machine's side of its namespace (`tyv-n1`, …).
    pub link: String,
}

/// The hosts of [`LAYOUT`] with network namespaces of their own; none when it cannot be read.
#[must_use]
pub fn layout() -> Vec<Host> {
    std::fs::read_to_string(LAYOUT)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [name, namespace, address, link] if *namespace != "-" => Some(Host {
                    name: (*name).to_owned(),
                    namespace: (*namespace).to_owned(),
                    address: (*address).to_owned(),
                    link: (*link).to_owned(),
                }),
                _ => None,
            }
        })
        .collect()
}

fn set_link(link: &str, state: &str) {
    let status = Command::new("ip")
        .args(["link", "set", link, state])
        .status()
        .expect("ip runs");
    assert!(status.success(), "ip link set {link} {state}: {status}");
}

/// Links taken down, brought back up when dropped (a failing test leaves no host cut off).
#[derive(Debug)]
pub struct Cut(Vec<String>);

impl Cut {
    /// Takes `links` down.
    ///
    /// # Panics
    /// When `ip link set` fails.
    #[must_use]
    pub fn new(links: Vec<String>) -> Self {
        let mut cut = Self(Vec::new());
        for link in links {
            // Pushed first: a link half taken down is brought up again too.
            cut.0.push(link.clone());
            set_link(&link, "down");
        }
        cut
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        for link in &self.0 {
            let _ = Command::new("ip")
                .args(["link", "set", link, "up"])
                .status();
        }
    }
}

/// The run record (`run.json`) of the run folder `run`.
///
/// # Panics
/// When it cannot be read as JSON.
#[must_use]
pub fn record(run: &Path) -> serde_json::Value {
    let path = run.join("run.json");
    serde_json::from_slice(&std::fs::read(&path).expect("run.json")).expect("JSON")
}

/// The highest committed checkpoint's index.
#[must_use]
pub fn last_committed(record: &serde_json::Value) -> u64 {
    record["checkpoints"]
        .as_array()
        .and_then(|all| all.iter().filter_map(|c| c["index"].as_u64()).max())
        .unwrap_or(0)
}

/// Where one rank of an attempt runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rank {
    /// Its node's id.
    pub node: String,
    /// Its node's address.
    pub ip: String,
    /// Its task's pid.
    pub task: u32,
    /// Its agent's pid.
    pub agent: u32,
}

/// Where rank `rank` of attempt `attempt` runs.
///
/// # Panics
/// When the record does not say.
#[must_use]
pub fn rank_of(record: &serde_json::Value, attempt: usize, rank: usize) -> Rank {
    let worker = &record["attempts"][attempt]["workers"][rank];
    let pid = |key: &str| {
        worker[key]
            .as_u64()
            .and_then(|pid| u32::try_from(pid).ok())
            .unwrap_or_else(|| panic!("no {key} for rank {rank}: {record}"))
    };
    let text = |key: &str| {
        worker[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} for rank {rank}: {record}"))
            .to_owned()
    };
    Rank {
        node: text("node"),
        ip: text("ip"),
        task: pid("pid"),
        agent: pid("agent_pid"),
    }
}

/// Whether process `pid` lives (the test shares the hosts' pid namespace).
#[must_use]
pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// When every pid of `pids` is gone, within `limit` of now; `None` past it.
#[must_use]
pub fn gone_by(pids: &[u32], limit: Duration) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if !pids.iter().copied().any(alive) {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// When the driver booked attempt `attempt` of the run folder `run` as failed in its record,
/// within `limit`.
#[must_use]
pub fn failed_by(run: &Path, attempt: usize, limit: Duration) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let failed = std::fs::read(run.join("run.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .is_some_and(|record| !record["attempts"][attempt]["failure"].is_null());
        if failed {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The checkpoint index a rank's `resumed from …/checkpoint_NNNNNN` line names.
///
/// # Panics
/// When the line names none.
#[must_use]
pub fn resumed_index(line: &str) -> u64 {
    line.split("checkpoint_")
        .nth(1)
        .and_then(|rest| rest.get(..6))
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint in `{line}`"))
}

/// Seconds from `from` to `to`.
#[must_use]
pub fn seconds(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

/// Waits up to `within` for `running` to print a line with `needle` (a rank's `resumed from
/// …/checkpoint_NNNNNN`) and returns when it came, asserting that it names a checkpoint no
/// older than `committed`, the last one committed before the fault.
///
/// # Panics
/// When no such line comes in time, or it names an older checkpoint.
pub fn resumed_from_at_least(
    running: &mut Running,
    needle: &str,
    within: Duration,
    committed: u64,
) -> Instant {
    let again = running.expect_line(needle, within);
    let stdout = running.stdout();
    let line = stdout
        .lines()
        .find(|line| line.contains(needle))
        .expect("the resumed line");
    assert!(
        resumed_index(line) >= committed,
        "checkpoint {committed} was committed before the fault, but the run resumed from: {line}"
    );
    again
}
