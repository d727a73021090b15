//! How an [`AgentHub`](crate::AgentHub) listens and how patient it is, and the program
//! agents are started with.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

pub use trainyard_wire::config::DRIVER_LOST;

/// The variable naming the agent binary on remote nodes ([`AgentCommand::for_remote_nodes`]).
pub const AGENT_BIN_VAR: &str = "TRAINYARD_AGENT_BIN";
/// The default of [`HubConfig::stop_grace`].
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(5);
/// The default of [`HubConfig::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of [`HubConfig::heartbeat_timeout`].
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default of [`HubConfig::call_timeout`].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How an [`AgentHub`](crate::AgentHub) listens and how patient it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Names the run in logs.
    pub name: String,
    /// The address the hub listens on (any port).
    pub bind: IpAddr,
    /// The address agents are told to connect to, when it is not the bound one (a listener
    /// bound to `0.0.0.0` is reached at a node's own address).
    pub advertise: Option<IpAddr>,
    /// How long a started agent gets to connect.
    pub connect_timeout: Duration,
    /// How long an agent gets to answer a request before it is killed as unresponsive.
    pub call_timeout: Duration,
    /// How long a stopped agent gets to exit before it is killed.
    pub stop_grace: Duration,
    /// How long an agent may stay silent (it says it is alive five times as often, see
    /// [`HubConfig::heartbeat_ms`]) before it is killed as unresponsive: a hung agent is
    /// found in seconds rather than at the next call's timeout. The hub says it is alive to
    /// its agents as often.
    pub heartbeat_timeout: Duration,
    /// The agents' lost-driver bound: an agent that hears nothing from the hub for this long
    /// stops its task and exits ([`AgentConfig::driver_lost_ms`]); an agent whose connection
    /// ends does so at once. Default [`DRIVER_LOST`].
    ///
    /// [`AgentConfig::driver_lost_ms`]: trainyard_wire::config::AgentConfig::driver_lost_ms
    pub driver_lost: Duration,
}

impl HubConfig {
    /// Loopback, the default timeouts.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            advertise: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            stop_grace: DEFAULT_STOP_GRACE,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            driver_lost: DRIVER_LOST,
        }
    }

    /// How often an agent says it is alive, in ms: a fifth of
    /// [`HubConfig::heartbeat_timeout`], for the agent's configuration.
    #[must_use]
    pub fn heartbeat_ms(&self) -> u64 {
        u64::try_from(self.heartbeat_timeout.as_millis() / 5)
            .unwrap_or(u64::MAX)
            .max(10)
    }
}

/// The program an agent is started with: by default this very binary
/// ([`std::env::current_exe`]), which calls `trainyard_agent::run_if_agent` first thing in
/// `main`. Where the runtime starts it (a child of the driver, a Ray actor's child on its
/// node) is the runtime's business, and so is whether the path must be valid elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentCommand {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl AgentCommand {
    /// This very binary, without arguments.
    ///
    /// # Errors
    /// When the path of the running executable cannot be found.
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?, Vec::<String>::new()))
    }

    /// The agent for workers on other nodes: the program `$TRAINYARD_AGENT_BIN`
    /// ([`AGENT_BIN_VAR`]) names, else this very binary (right when the nodes share this
    /// machine or its file system).
    ///
    /// # Errors
    /// When neither is set and the path of the running executable cannot be found.
    pub fn for_remote_nodes() -> std::io::Result<Self> {
        match std::env::var_os(AGENT_BIN_VAR).filter(|v| !v.is_empty()) {
            Some(path) => Ok(Self::new(PathBuf::from(path), Vec::<String>::new())),
            None => Self::current_exe(),
        }
    }

    /// `program` with `args`.
    #[must_use]
    pub fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }
}
