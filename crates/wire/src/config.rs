//! What a runtime tells the agent it starts: its configuration through the agent's
//! environment, and the run's token as one line of hex on its stdin (never argv, which every
//! user of the machine can read, nor the environment, which the tasks the agent runs in its
//! own process would inherit).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use trainyard_runtime::{ActorId, NodeId};

use crate::token::Token;

/// Selects what a binary that calls `trainyard_agent::run_if_agent` does: [`ROLE_AGENT`] or
/// [`ROLE_WATCHDOG`].
pub const ROLE: &str = "TRAINYARD_ROLE";
/// Serve as a worker agent.
pub const ROLE_AGENT: &str = "agent";
/// Be the agent's watchdog, which kills what is left of its tasks once the agent is gone
/// (where the agent cannot fork it: a process with other threads already).
pub const ROLE_WATCHDOG: &str = "watchdog";
/// The agent's [`AgentConfig`], as JSON.
pub const CONFIG: &str = "TRAINYARD_AGENT_CONFIG";

/// Exit code of an agent that could not start (bad configuration, no driver).
pub const AGENT_FAILED: u8 = 2;

/// Whether this process's program called `trainyard_agent::run_if_agent`
/// ([`entered_run_if_agent`]).
static ENTERED: AtomicBool = AtomicBool::new(false);

/// Notes that this process's program called `trainyard_agent::run_if_agent`, which it does
/// first thing: see [`skipped_run_if_agent`].
pub fn entered_run_if_agent() {
    ENTERED.store(true, Ordering::Relaxed);
}

/// Whether a runtime started this process as an agent ([`ROLE`] in its environment) and its
/// program went on without calling `trainyard_agent::run_if_agent`: it runs the user's
/// program instead of serving, so it must not start workers of its own (each would do the
/// same). A function task that starts a run inside a real agent is not such a process.
#[must_use]
pub fn skipped_run_if_agent() -> bool {
    std::env::var_os(ROLE).is_some() && !ENTERED.load(Ordering::Relaxed)
}

/// The ledger's liveness file, when the runtime keeps a ledger: the agent holds a shared
/// lock on it while it lives, so that its run's entry counts the agent as one of the run's
/// processes even once the driver is gone.
pub const LEDGER_LIVE: &str = "TRAINYARD_LEDGER_LIVE";

/// Every variable of the agent's own: none reaches a task.
pub const PRIVATE: [&str; 3] = [ROLE, CONFIG, LEDGER_LIVE];

/// How the agent enforces its worker's memory limit, and the worker's cgroup when it has
/// one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MemoryLimit {
    /// The worker's cgroup, made by the runtime: the task joins it.
    Cgroup {
        /// Its directory.
        path: PathBuf,
        /// The limit, in bytes.
        limit: u64,
    },
    /// No cgroup could be had: each task process's address space is capped (weak).
    AddressSpace {
        /// The limit, in bytes.
        limit: u64,
    },
    /// No limit was asked, but the worker has a cgroup, made by the runtime: the task joins
    /// it all the same, so that every process it starts is killed through it at its end.
    Unlimited {
        /// Its directory.
        path: PathBuf,
    },
    /// A scheduler holds the worker to `limit` in the memory cgroup the agent was started in
    /// (a Slurm job step's): the task stays there too, and the agent counts the OOM kills
    /// of its own cgroup.
    Scheduler {
        /// The limit, in bytes.
        limit: u64,
    },
}

impl MemoryLimit {
    /// The limit, in bytes; `None` for [`MemoryLimit::Unlimited`].
    #[must_use]
    pub const fn bytes(&self) -> Option<u64> {
        match self {
            Self::Cgroup { limit, .. }
            | Self::AddressSpace { limit }
            | Self::Scheduler { limit } => Some(*limit),
            Self::Unlimited { .. } => None,
        }
    }

    /// The worker's cgroup directory, when it has one.
    #[must_use]
    pub fn cgroup(&self) -> Option<&std::path::Path> {
        match self {
            Self::Cgroup { path, .. } | Self::Unlimited { path } => Some(path),
            Self::AddressSpace { .. } | Self::Scheduler { .. } => None,
        }
    }
}

/// What the runtime tells an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentConfig {
    /// The driver's address (`127.0.0.1:PORT`).
    pub driver: String,
    /// The actor this agent serves.
    pub actor: ActorId,
    /// The driver's process id: the agent exits when its parent is another. 0: whichever
    /// process started it (a scheduler's step daemon), whose death ends it too.
    pub parent: u32,
    /// The node the worker runs on.
    pub node_id: NodeId,
    /// That node's address.
    pub node_ip: String,
    /// The device ids the worker holds, per accelerator resource.
    pub accelerator_ids: BTreeMap<String, Vec<String>>,
    /// The worker's memory limit, when enforced.
    pub memory: Option<MemoryLimit>,
    /// How long a task gets between SIGTERM and SIGKILL when it is stopped, in ms.
    pub grace_ms: u64,
    /// How often the agent says it is alive, in ms ([`crate::wire::AgentMessage::Heartbeat`]),
    /// and the driver too ([`crate::wire::DriverMessage::Heartbeat`]).
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// The agent's lost-driver bound, in ms: an agent that has heard nothing from its driver
    /// for this long (no frame, no heartbeat) takes it for lost, stops its task (as at the
    /// end of a run: SIGTERM, [`AgentConfig::grace_ms`], SIGKILL) and exits, as it does at
    /// once when the connection ends. Attempts of a run come and go inside an agent's life;
    /// this bounds how long a task may outlive a driver cut off from its node.
    #[serde(default = "default_driver_lost_ms")]
    pub driver_lost_ms: u64,
    /// A SIGTERM comes from a scheduler ending the job (Slurm's `scancel`, a time limit, a
    /// preemption), not from the driver: the agent stops its task without reporting the
    /// task's end, so that the driver hears the scheduler's reason (the job step's end)
    /// rather than a task killed by SIGTERM.
    #[serde(default)]
    pub scheduler_stops: bool,
    /// A warm Python on the agent's node that starts the agent's Python tasks as forks of
    /// itself, when the run has one (`trainyard run --warm-python`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_python: Option<WarmPython>,
    /// A warm Python the agent starts itself as it starts, next to its worker, when the run
    /// asks for one and the runtime shares none with its workers ([`AgentConfig::warm_python`]
    /// is `None`): on Ray and Slurm, where workers are on other hosts than the driver. It
    /// imports while the agent connects, outlives the attempts the agent serves, and ends
    /// with the agent; its tasks are below the agent, which adopts what they leave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_warm_python: Option<WarmPythonSpec>,
}

/// What a warm Python is: an interpreter, and what it imports before any task
/// (`trainyard run --warm-python MODULES`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmPythonSpec {
    /// The interpreter, as the task's command names it once found on `PATH`. Tasks whose
    /// program is this path start from it; others start as always.
    pub python: PathBuf,
    /// The modules it imports first (`torch`, `numpy`, ...).
    pub modules: Vec<String>,
}

/// A warm Python: an interpreter that imported the run's heavy modules once and starts each
/// task whose program is [`WarmPython::python`] as a fork of itself, asked through the Unix
/// socket at [`WarmPython::socket`] (the protocol is `python/trainyard/_warm.py`'s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmPython {
    /// The interpreter, as the command names it once found on `PATH`: only tasks whose
    /// program is this very path start warm.
    pub python: PathBuf,
    /// Its listening socket, in a directory only this user can enter.
    pub socket: PathBuf,
    /// What a request must carry, as hex: the socket's own secret, not the run's token.
    pub token: String,
    /// Its process id and start time (clock ticks after boot, as `/proc/PID/stat` has it),
    /// by which an agent waiting for it to listen sees it end; 0 when unknown.
    #[serde(default)]
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
}

/// The default of [`AgentConfig::heartbeat_ms`].
const fn default_heartbeat_ms() -> u64 {
    1_000
}

/// The default of [`AgentConfig::driver_lost_ms`]: [`DRIVER_LOST`].
const fn default_driver_lost_ms() -> u64 {
    DRIVER_LOST.as_secs() * 1_000
}

/// The lost-driver bound agents get unless their runtime says otherwise
/// ([`AgentConfig::driver_lost_ms`]): 10 s, five of the driver's heartbeats at their default
/// pace (as long as a driver waits for a silent agent before it kills it).
pub const DRIVER_LOST: std::time::Duration = std::time::Duration::from_secs(10);

impl AgentConfig {
    /// The variables that start an agent with this configuration. The run's token goes to
    /// the agent's stdin ([`token_line`]).
    ///
    /// # Errors
    /// When the configuration cannot be serialised (it always can: plain data).
    pub fn to_env(&self) -> Result<Vec<(String, String)>, serde_json::Error> {
        Ok(vec![
            (ROLE.to_owned(), ROLE_AGENT.to_owned()),
            (CONFIG.to_owned(), serde_json::to_string(self)?),
        ])
    }
}

/// What a runtime writes to a new agent's stdin: the run's token as hex, and a line end.
#[must_use]
pub fn token_line(token: &Token) -> String {
    let mut line = token.to_hex();
    line.push('\n');
    line
}
