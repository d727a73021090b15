//! [`SlurmConfig`]: where a [`SlurmRuntime`](crate::SlurmRuntime) runs its workers, and what
//! it asks Slurm for when it requests an allocation of its own.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use trainyard_hub::{AgentCommand, HubConfig};
use trainyard_wire::config::WarmPythonSpec;

use crate::error::SlurmError;

/// The variable Slurm sets inside an allocation (`sbatch`, `salloc`, `srun`).
pub const JOB_ID_VAR: &str = "SLURM_JOB_ID";
pub use trainyard_hub::AGENT_BIN_VAR;

/// What an allocation of the runtime's own is requested with (`salloc`/`sbatch` options).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocationOptions {
    /// `--partition` (else the cluster's default partition).
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--qos`.
    pub qos: Option<String>,
    /// `--time`, in Slurm's forms (`30`, `1:00:00`, `2-00:00:00`).
    pub time: Option<String>,
    /// `--signal`, such as `USR1@90`: Slurm signals the workers that long before the time
    /// limit or a preemption, and the agents hand the signal on to the tasks.
    pub signal: Option<String>,
}

impl AllocationOptions {
    /// The `salloc`/`sbatch` options for these settings.
    #[must_use]
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        for (flag, value) in [
            ("--partition", &self.partition),
            ("--account", &self.account),
            ("--qos", &self.qos),
            ("--time", &self.time),
            ("--signal", &self.signal),
        ] {
            if let Some(value) = value {
                flags.push(format!("{flag}={value}"));
            }
        }
        flags
    }
}

/// How a [`SlurmRuntime`](crate::SlurmRuntime) runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmConfig {
    /// Names the run: its allocation's job name and its steps' names start with it.
    pub run_name: String,
    /// The agent program, as a path valid on every node (`$TRAINYARD_AGENT_BIN`, else the
    /// running executable: right on a shared file system, as Slurm clusters have).
    pub agent: AgentCommand,
    /// The allocation to run in: `$SLURM_JOB_ID` inside `sbatch`/`salloc`. `None`: the
    /// runtime requests one that fits the placement group, and releases it at the end.
    pub job: Option<String>,
    /// What that allocation is requested with.
    pub allocation: AllocationOptions,
    /// Where the driver listens for its agents; `None`: this host's address on the route to
    /// the nodes (loopback for fake nodes on this machine).
    pub bind: Option<IpAddr>,
    /// How long a step may take from `srun` to its agent's hello.
    pub connect_timeout: Duration,
    /// How long an agent gets to answer a request.
    pub call_timeout: Duration,
    /// How long a stopped agent gets to exit.
    pub stop_grace: Duration,
    /// The warm Python each agent starts next to its worker, in its job step
    /// (`trainyard run --warm-python`): the tasks of its interpreter start as forks of it, on
    /// first start and on every restart the agent serves. `None`: every task starts cold.
    pub warm_python: Option<WarmPythonSpec>,
}

impl SlurmConfig {
    /// The defaults for a run named `run_name`: inside the allocation of `$SLURM_JOB_ID`
    /// when it is set, the agent from `$TRAINYARD_AGENT_BIN` or the running executable.
    ///
    /// # Errors
    /// [`SlurmError::AgentBinary`] when neither names a file.
    pub fn new(run_name: impl Into<String>) -> Result<Self, SlurmError> {
        let run_name = run_name.into();
        let agent = AgentCommand::for_remote_nodes().map_err(|source| SlurmError::AgentBinary {
            path: PathBuf::from("<current executable>"),
            source,
        })?;
        let hub = HubConfig::new(&run_name);
        Ok(Self {
            job: std::env::var(JOB_ID_VAR)
                .ok()
                .filter(|id| !id.trim().is_empty()),
            run_name,
            agent,
            allocation: AllocationOptions::default(),
            bind: None,
            connect_timeout: Duration::from_secs(60),
            call_timeout: hub.call_timeout,
            stop_grace: hub.stop_grace,
            warm_python: None,
        })
    }

    /// Sets [`SlurmConfig::job`].
    #[must_use]
    pub fn job(mut self, job: Option<String>) -> Self {
        self.job = job;
        self
    }

    /// Sets [`SlurmConfig::allocation`].
    #[must_use]
    pub fn allocation(mut self, allocation: AllocationOptions) -> Self {
        self.allocation = allocation;
        self
    }

    /// Sets [`SlurmConfig::agent`].
    #[must_use]
    pub fn agent(mut self, agent: AgentCommand) -> Self {
        self.agent = agent;
        self
    }

    /// Sets [`SlurmConfig::warm_python`].
    #[must_use]
    pub fn warm_python(mut self, warm: Option<WarmPythonSpec>) -> Self {
        self.warm_python = warm;
        self
    }
}
