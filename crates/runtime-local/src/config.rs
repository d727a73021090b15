//! What a [`LocalRuntime`](crate::LocalRuntime) is started with.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use trainyard_hub::{
    AgentCommand, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_STOP_GRACE,
};
use trainyard_resources::GPU;
use trainyard_runtime::reservations::NodeSpec;

use crate::LocalError;
use crate::detect::{LocalNode, Machine, Overrides, plan_nodes};
use crate::ledger::LedgerLocation;

/// The IP address every local node reports.
const NODE_IP: &str = "127.0.0.1";

/// What a placement group that fits the machine, but not what other runs leave free, does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WhenBusy {
    /// Waits for the other runs to free enough, up to the placement timeout.
    #[default]
    Wait,
    /// Fails at once, naming what is missing and the runs that hold it.
    Fail,
}

/// How a [`LocalRuntime`](crate::LocalRuntime) runs: its nodes, how agents are started, and
/// its limits.
///
/// ```no_run
/// use std::time::Duration;
/// use trainyard_runtime_local::LocalConfig;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = LocalConfig::detect("my-run")?.stop_grace(Duration::from_secs(10));
/// # let _ = config;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// The (virtual) nodes, from [`plan_nodes`].
    pub nodes: Vec<LocalNode>,
    /// How agents are started. Each agent must be a direct child of the driver (it checks
    /// its parent's pid), so the program must not be a wrapper that starts the agent as a
    /// grandchild.
    pub agent: AgentCommand,
    /// Names the run's memory cgroups and appears in its logs; unique to this driver.
    pub run_name: String,
    /// The name other runs see for this one in the machine-wide ledger (what `trainyard
    /// cluster` and a waiting run show): the run's own name (`--name`) when it has one, else
    /// [`LocalConfig::run_name`].
    pub label: Option<String>,
    /// The host name every node reports.
    pub hostname: String,
    /// Whether a worker's `memory` option is a hard limit: a memory cgroup per worker, or,
    /// where none can be made, an `RLIMIT_AS` on each of its processes (with a warning).
    pub enforce_memory: bool,
    /// How long an agent gets between SIGTERM and SIGKILL when the runtime shuts down, and
    /// how long it gives its task when it is stopped.
    pub stop_grace: Duration,
    /// How long an agent may take to connect back after it is started.
    pub connect_timeout: Duration,
    /// How long an agent may take to answer a request (a stop gets `stop_grace` more)
    /// before it is taken to be hung, killed, and reported dead as unresponsive.
    pub call_timeout: Duration,
    /// How long an agent may stay silent before it is killed as unresponsive (it says it is
    /// alive five times as often).
    pub heartbeat_timeout: Duration,
    /// The address the control plane listens on; agents connect to it (to loopback when it
    /// is unspecified, such as `0.0.0.0`).
    pub bind: IpAddr,
    /// The machine-wide ledger the run records what it holds in, and reads what other runs
    /// hold from ([`LedgerLocation::from_env`] by default).
    pub ledger: LedgerLocation,
    /// What a group does when other runs hold what it needs.
    pub when_busy: WhenBusy,
    /// The run's warm Python, when it has one: started with the runtime, it starts the
    /// Python tasks whose program is its interpreter as forks of itself, with its modules
    /// imported already.
    pub warm_python: Option<crate::WarmPythonSpec>,
}

impl LocalConfig {
    /// A configuration for `nodes` whose agents are this very binary, with the defaults:
    /// no memory enforcement, [`DEFAULT_STOP_GRACE`], [`DEFAULT_CONNECT_TIMEOUT`],
    /// [`DEFAULT_CALL_TIMEOUT`], listening on `127.0.0.1`, sharing the machine through the
    /// ledger of [`LedgerLocation::from_env`] and waiting while other runs hold what it
    /// needs.
    ///
    /// # Errors
    /// [`LocalError::CurrentExe`] when the running executable cannot be found.
    pub fn new(nodes: Vec<LocalNode>, run_name: impl Into<String>) -> Result<Self, LocalError> {
        let agent = AgentCommand::current_exe().map_err(LocalError::CurrentExe)?;
        Ok(Self {
            nodes,
            agent,
            run_name: run_name.into(),
            label: None,
            hostname: own_hostname(),
            enforce_memory: false,
            stop_grace: DEFAULT_STOP_GRACE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            ledger: LedgerLocation::from_env(),
            when_busy: WhenBusy::Wait,
            warm_python: None,
        })
    }

    /// This machine as one node ([`Machine::detect`], no overrides), agents being this very
    /// binary. Blocks while the GPUs are detected (a few seconds at most).
    ///
    /// # Errors
    /// [`LocalError::CurrentExe`], or [`LocalError::Detect`] (which does not happen for one
    /// node without overrides).
    pub fn detect(run_name: impl Into<String>) -> Result<Self, LocalError> {
        let machine = Machine::detect();
        let nodes = plan_nodes(&machine, &Overrides::default(), 1)?;
        let mut config = Self::new(nodes, run_name)?;
        config.hostname = machine.hostname;
        Ok(config)
    }

    /// Sets [`LocalConfig::agent`].
    #[must_use]
    pub fn with_agent(mut self, agent: AgentCommand) -> Self {
        self.agent = agent;
        self
    }

    /// Sets [`LocalConfig::enforce_memory`].
    #[must_use]
    pub fn enforce_memory(mut self, enforce: bool) -> Self {
        self.enforce_memory = enforce;
        self
    }

    /// Sets [`LocalConfig::stop_grace`].
    #[must_use]
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Sets [`LocalConfig::connect_timeout`].
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`LocalConfig::heartbeat_timeout`].
    #[must_use]
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    /// Sets [`LocalConfig::call_timeout`].
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets [`LocalConfig::bind`].
    #[must_use]
    pub fn bind(mut self, address: IpAddr) -> Self {
        self.bind = address;
        self
    }

    /// Sets [`LocalConfig::ledger`].
    #[must_use]
    pub fn ledger(mut self, ledger: LedgerLocation) -> Self {
        self.ledger = ledger;
        self
    }

    /// Sets [`LocalConfig::when_busy`].
    #[must_use]
    pub fn when_busy(mut self, when_busy: WhenBusy) -> Self {
        self.when_busy = when_busy;
        self
    }

    /// The nodes as the reservation bookkeeping describes them.
    #[must_use]
    pub fn node_specs(&self) -> Vec<NodeSpec> {
        self.nodes
            .iter()
            .map(|node| {
                let mut devices = BTreeMap::new();
                if !node.gpu_ids.is_empty() {
                    devices.insert(GPU.to_owned(), node.gpu_ids.clone());
                }
                NodeSpec {
                    id: node.id.clone(),
                    ip: NODE_IP.to_owned(),
                    hostname: self.hostname.clone(),
                    resources: node.resources.clone(),
                    devices,
                }
            })
            .collect()
    }
}

fn own_hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use trainyard_runtime::NodeId;

    use super::*;

    #[test]
    fn gpu_ids_become_devices_and_every_node_is_on_loopback() {
        let nodes = vec![
            LocalNode {
                id: NodeId::from("local-0"),
                resources: "CPU=2,GPU=2".parse().expect("resources"),
                gpu_ids: vec!["0".into(), "1".into()],
            },
            LocalNode {
                id: NodeId::from("local-1"),
                resources: "CPU=2".parse().expect("resources"),
                gpu_ids: Vec::new(),
            },
        ];
        let mut config = LocalConfig::new(nodes, "run")
            .expect("the test binary's path")
            .with_agent(AgentCommand::new("agent", ["x"]));
        config.hostname = "box".into();
        let specs = config.node_specs();
        assert_eq!(specs[0].devices[GPU], ["0", "1"]);
        assert!(specs[1].devices.is_empty());
        assert!(specs.iter().all(|s| s.ip == NODE_IP && s.hostname == "box"));
        assert_eq!(config.agent.args, ["x"]);
    }
}
