//! [`BridgeConfig`]: how the bridge starts; [`ActorLaunch`]: what one actor runs.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use trainyard_resources::ActorOptions;

use super::PYTHON_VAR;
use crate::protocol::RayPlacementGroupId;

/// How to start the bridge.
#[derive(Debug, Clone, PartialEq)]
pub struct BridgeConfig {
    /// The interpreter: `$TRAINYARD_RAY_PYTHON`, else `python3`.
    pub python: PathBuf,
    /// The cluster's GCS address (`host:port`); `None` starts a throwaway local head.
    pub address: Option<String>,
    /// The Ray namespace of the bridge's job (named actors live in it).
    pub namespace: String,
    /// Extra environment for the bridge, applied last (also what the token lookup sees first).
    pub env: Vec<(String, String)>,
    /// How long `ray.init` may take.
    pub start_timeout: Duration,
    /// How long an ordinary call may take.
    pub request_timeout: Duration,
    /// How long an actor whose node stopped answering (`ActorUnavailableError`) may stay
    /// unreported: Ray declares a lost node dead after about 15 s, and the end then comes as
    /// `node_died`; past this bound it comes as `unavailable`.
    pub unavailable_grace: Duration,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            python: std::env::var_os(PYTHON_VAR)
                .filter(|p| !p.is_empty())
                .map_or_else(|| PathBuf::from("python3"), PathBuf::from),
            address: None,
            namespace: "trainyard".to_owned(),
            env: Vec::new(),
            start_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            unavailable_grace: Duration::from_secs(30),
        }
    }
}

impl BridgeConfig {
    /// Sets the interpreter.
    #[must_use]
    pub fn python(mut self, python: impl Into<PathBuf>) -> Self {
        self.python = python.into();
        self
    }

    /// Sets the cluster address.
    #[must_use]
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// Sets the namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Adds an environment variable for the bridge.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Sets the start-up bound.
    #[must_use]
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Sets the per-call bound.
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the grace for unavailable actors.
    #[must_use]
    pub fn unavailable_grace(mut self, grace: Duration) -> Self {
        self.unavailable_grace = grace;
        self
    }

    /// A variable as the bridge will see it: `env` first, then this process's environment.
    pub(super) fn var(&self, name: &str) -> Option<String> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    }
}

/// One actor to start: its Ray options, its placement and the agent it runs.
#[derive(Clone, PartialEq)]
pub struct ActorLaunch {
    /// The actor's name (unique in the namespace; include the run's name).
    pub name: String,
    /// The placement group and bundle index it is pinned to.
    pub placement: Option<(RayPlacementGroupId, u32)>,
    /// Its Ray options, passed exactly (`memory` as an option, never a custom resource).
    pub options: ActorOptions,
    /// The agent program, as a path valid on the actor's node.
    pub program: String,
    /// The agent's arguments.
    pub args: Vec<String>,
    /// Extra environment for the agent.
    pub env: BTreeMap<String, String>,
    /// The agent's configuration template (a JSON object); the actor fills in `parent`,
    /// `node_id`, `node_ip` and `accelerator_ids`.
    pub config: serde_json::Value,
    /// The run token, written to the agent's stdin.
    pub token: String,
    /// The agent's working directory, used when it exists on the actor's node (the
    /// driver's, for nodes that share its file system); else the actor's own.
    pub cwd: Option<String>,
}

impl fmt::Debug for ActorLaunch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorLaunch")
            .field("name", &self.name)
            .field("placement", &self.placement)
            .field("options", &self.options)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env)
            .field("config", &self.config)
            .field("token", &"<redacted>")
            .finish()
    }
}
