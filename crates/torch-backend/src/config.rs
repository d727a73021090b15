use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tracing::{debug, info};
use trainyard_backend_executor::{
    Backend, BackendConfig, BackendContext, BackendError, RankInfo, WorkerAddress, WorkerEnv,
};
use trainyard_resources::{CPU, GPU};
use trainyard_runtime::{Endpoint, root_cause};

/// The process-group backend: `nccl` for GPUs, `gloo` for CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessGroupBackend {
    /// `nccl` when the workers request GPUs, `gloo` otherwise.
    #[default]
    Auto,
    /// NVIDIA's collective library.
    Nccl,
    /// The CPU backend.
    Gloo,
}

/// How workers find each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InitMethod {
    /// `env://`: `MASTER_ADDR` and `MASTER_PORT` (what torchrun scripts expect).
    #[default]
    Env,
    /// `tcp://addr:port`, given in `TRAINYARD_TORCH_INIT_METHOD`.
    Tcp,
}

/// A choice that names no variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{value}`: expected one of {expected}")]
pub struct UnknownChoice {
    /// What was being chosen.
    pub what: &'static str,
    /// The text given.
    pub value: String,
    /// The accepted values.
    pub expected: &'static str,
}

impl FromStr for ProcessGroupBackend {
    type Err = UnknownChoice;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "nccl" => Ok(Self::Nccl),
            "gloo" => Ok(Self::Gloo),
            _ => Err(UnknownChoice {
                what: "torch backend",
                value: text.to_owned(),
                expected: "auto, nccl, gloo",
            }),
        }
    }
}

impl FromStr for InitMethod {
    type Err = UnknownChoice;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "env" => Ok(Self::Env),
            "tcp" => Ok(Self::Tcp),
            _ => Err(UnknownChoice {
                what: "init method",
                value: text.to_owned(),
                expected: "env, tcp",
            }),
        }
    }
}

impl fmt::Display for ProcessGroupBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Nccl => "nccl",
            Self::Gloo => "gloo",
        })
    }
}

/// Configuration of PyTorch's process group, as Ray Train's `TorchConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TorchConfig {
    /// Process-group backend.
    pub backend: ProcessGroupBackend,
    /// How workers find each other.
    pub init_method: InitMethod,
    /// Timeout of process-group operations in seconds (1800), given to workers in
    /// `TRAINYARD_TORCH_TIMEOUT_S`.
    pub timeout_s: u64,
}

impl Default for TorchConfig {
    fn default() -> Self {
        Self {
            backend: ProcessGroupBackend::Auto,
            init_method: InitMethod::Env,
            timeout_s: 1800,
        }
    }
}

impl BackendConfig for TorchConfig {
    fn build(&self) -> Arc<dyn Backend> {
        Arc::new(TorchBackend::new(self.clone()))
    }
}

/// Sets up PyTorch's process-group environment on every worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TorchBackend {
    config: TorchConfig,
}

/// `TRAINYARD_TORCH_INIT_METHOD`: `env://` or the `tcp://` URL of the master.
pub const INIT_METHOD_VAR: &str = "TRAINYARD_TORCH_INIT_METHOD";
/// `TRAINYARD_TORCH_BACKEND`: `nccl` or `gloo`.
pub const BACKEND_VAR: &str = "TRAINYARD_TORCH_BACKEND";
/// `TRAINYARD_TORCH_TIMEOUT_S`: the process-group timeout in seconds.
pub const TIMEOUT_VAR: &str = "TRAINYARD_TORCH_TIMEOUT_S";

impl TorchBackend {
    /// A backend with `config`.
    #[must_use]
    pub fn new(config: TorchConfig) -> Self {
        Self { config }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &TorchConfig {
        &self.config
    }
}

/// NCCL's error-handling switches (current and pre-2.2 names): when the user set any of
/// them, `TORCH_NCCL_ASYNC_ERROR_HANDLING` is left alone.
const NCCL_ERROR_VARS: [&str; 4] = [
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT",
];

/// The variable is one the user set explicitly for the run.
fn user_set(ctx: &BackendContext<'_>, name: &str) -> bool {
    ctx.run.env.contains_key(name)
}

#[async_trait]
impl Backend for TorchBackend {
    fn name(&self) -> &str {
        "torch"
    }

    fn share_accelerator_ids(&self) -> bool {
        true
    }

    async fn on_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
        let workers = ctx.group.workers();
        let Some(first) = workers.first() else {
            return Ok(Vec::new());
        };
        let backend = match self.config.backend {
            ProcessGroupBackend::Auto if first.resources.amount(GPU).is_zero() => {
                ProcessGroupBackend::Gloo
            }
            ProcessGroupBackend::Auto => ProcessGroupBackend::Nccl,
            chosen => chosen,
        };
        let master = WorkerAddress {
            ip: match ctx.run.env.get(MASTER_ADDR) {
                Some(given) => given.clone(),
                None => first.metadata.node_ip.clone(),
            },
            port: match ctx.run.env.get(MASTER_PORT) {
                Some(given) => given_port(given)?,
                None => ctx.free_port(0).await?,
            },
        };
        let init_method = match self.config.init_method {
            InitMethod::Env => "env://".to_owned(),
            InitMethod::Tcp => format!("tcp://{master}"),
        };
        let world_size = workers.len();
        let mut env = Vec::with_capacity(world_size);
        for (worker, rank) in workers.iter().zip(ctx.ranks) {
            let mut vars = BTreeMap::new();
            if self.config.init_method == InitMethod::Env {
                if !user_set(&ctx, MASTER_ADDR) {
                    vars.insert(MASTER_ADDR.to_owned(), master.ip.clone());
                }
                if !user_set(&ctx, MASTER_PORT) {
                    vars.insert(MASTER_PORT.to_owned(), master.port.to_string());
                }
            }
            vars.extend(interface_env(
                &ctx.run.env,
                worker.metadata.interface.as_deref(),
            ));
            vars.insert(INIT_METHOD_VAR.to_owned(), init_method.clone());
            vars.insert(BACKEND_VAR.to_owned(), backend.to_string());
            vars.insert(TIMEOUT_VAR.to_owned(), self.config.timeout_s.to_string());
            if backend == ProcessGroupBackend::Nccl
                && !NCCL_ERROR_VARS.iter().any(|v| user_set(&ctx, v))
            {
                vars.insert("TORCH_NCCL_ASYNC_ERROR_HANDLING".to_owned(), "1".to_owned());
            }
            if !user_set(&ctx, "OMP_NUM_THREADS") {
                let cpus = worker.resources.amount(CPU).whole_units().max(1);
                vars.insert("OMP_NUM_THREADS".to_owned(), cpus.to_string());
            }
            let message = format!(
                "Setting up process group for: {init_method} [rank={}, world_size={world_size}]",
                rank.world_rank
            );
            if rank.world_rank.0 == 0 {
                info!(backend = %backend, "{message}");
            } else {
                debug!(backend = %backend, "{message}");
            }
            env.push(vars);
        }
        Ok(env)
    }

    async fn on_training_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
        let max_restarts = ctx.run.failure_config.max_failures.map_or(-1, i64::from);
        let run_id = ctx.run.name.as_deref().unwrap_or(DEFAULT_RUN_ID);
        Ok(torchrun_env(
            ctx.ranks,
            run_id,
            ctx.restart_count,
            max_restarts,
        ))
    }

    fn owned_env(&self) -> BTreeMap<&'static str, &'static str> {
        TORCHRUN_ENV
            .iter()
            .chain(PROCESS_GROUP_ENV)
            .copied()
            .collect()
    }

    /// `MASTER_ADDR:MASTER_PORT` with `env://`, the `tcp://` URL's address with `tcp`.
    fn rendezvous(&self, env: &BTreeMap<String, String>) -> Vec<Endpoint> {
        let given = match self.config.init_method {
            InitMethod::Env => env
                .get(MASTER_ADDR)
                .map(String::as_str)
                .zip(env.get(MASTER_PORT).and_then(|port| port.parse().ok())),
            InitMethod::Tcp => env
                .get(INIT_METHOD_VAR)
                .and_then(|url| url.strip_prefix("tcp://"))
                .and_then(|address| address.rsplit_once(':'))
                .and_then(|(host, port)| Some((host, port.parse().ok()?))),
        };
        given
            .map(|(host, port)| {
                Endpoint::new(host.trim_start_matches('[').trim_end_matches(']'), port)
            })
            .into_iter()
            .collect()
    }
}

/// torchrun's `--rdzv-id` when none is given: `TORCHELASTIC_RUN_ID` of a run that has no
/// name in its `RunConfig`.
const DEFAULT_RUN_ID: &str = "none";

/// The variables of [`torchrun_env`], each with what its value is.
const TORCHRUN_ENV: &[(&str, &str)] = &[
    ("RANK", "the worker's world rank"),
    ("LOCAL_RANK", "the worker's rank on its node"),
    ("WORLD_SIZE", "the number of workers"),
    (
        "LOCAL_WORLD_SIZE",
        "the number of workers on the worker's node",
    ),
    ("NODE_RANK", "the index of the worker's node"),
    ("GROUP_RANK", "the index of the worker's node"),
    ("GROUP_WORLD_SIZE", "the number of nodes the workers are on"),
    ("ROLE_RANK", "the worker's world rank"),
    ("ROLE_WORLD_SIZE", "the number of workers"),
    ("ROLE_NAME", "torchrun's role, `default`"),
    (
        "TORCHELASTIC_RESTART_COUNT",
        "how many times the run was restarted",
    ),
    (
        "TORCHELASTIC_MAX_RESTARTS",
        "the restarts the run allows (its failure config)",
    ),
    ("TORCHELASTIC_RUN_ID", "the run's name"),
    (
        "TORCHELASTIC_USE_AGENT_STORE",
        "`False`: rank 0 hosts the rendezvous store",
    ),
    (
        root_cause::ERROR_FILE_VAR,
        "the variable that names the task's error file",
    ),
    (
        root_cause::TORCHELASTIC_ERROR_FILE,
        "a fresh error file for each task",
    ),
];

/// The process-group settings every worker gets, each with what its value is.
const PROCESS_GROUP_ENV: &[(&str, &str)] = &[
    (INIT_METHOD_VAR, "how the workers find each other"),
    (BACKEND_VAR, "the process-group backend, nccl or gloo"),
    (TIMEOUT_VAR, "the process-group timeout in seconds"),
];

/// The rendezvous of `env://`: rank 0's node's address, unless the run's environment gives
/// one.
const MASTER_ADDR: &str = "MASTER_ADDR";
/// The rendezvous of `env://`: a port found free on rank 0's node, unless the run's
/// environment gives one.
const MASTER_PORT: &str = "MASTER_PORT";
/// The interface gloo's sockets use: the one that holds the rank's node address on its host.
const GLOO_SOCKET_IFNAME: &str = "GLOO_SOCKET_IFNAME";
/// The interface NCCL's sockets use, the same one (`=name`: that name exactly, not a prefix).
const NCCL_SOCKET_IFNAME: &str = "NCCL_SOCKET_IFNAME";

/// The interface variables of a rank whose node's address its host holds on `interface`
/// (see `trainyard_sys::net::interface_for`), but for those the run's environment sets.
fn interface_env(
    run_env: &BTreeMap<String, String>,
    interface: Option<&str>,
) -> BTreeMap<String, String> {
    let Some(interface) = interface else {
        return BTreeMap::new();
    };
    [
        (GLOO_SOCKET_IFNAME, interface.to_owned()),
        (NCCL_SOCKET_IFNAME, format!("={interface}")),
    ]
    .into_iter()
    .filter(|(name, _)| !run_env.contains_key(*name))
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

/// The run's own `MASTER_PORT`, when it is a port.
fn given_port(value: &str) -> Result<u16, BackendError> {
    value
        .parse::<u16>()
        .ok()
        .filter(|port| *port > 0)
        .ok_or_else(|| BackendError::Config {
            backend: "torch".to_owned(),
            reason: format!(
                "the run's environment sets {MASTER_PORT} to `{value}`; expected a port number from 1 to 65535"
            ),
        })
}

/// The variables `torchrun` gives its workers, for every rank of an attempt in world-rank
/// order: `ranks` as [`assign_ranks`](trainyard_backend_executor::assign_ranks) gives them,
/// the run's name (`TORCHELASTIC_RUN_ID`), how many times the run was restarted and how
/// many restarts it allows (`-1`: unlimited). `GROUP_WORLD_SIZE` is the number of nodes
/// the ranks are on.
#[must_use]
pub fn torchrun_env(
    ranks: &[RankInfo],
    run_id: &str,
    restart_count: u32,
    max_restarts: i64,
) -> Vec<BTreeMap<String, String>> {
    let nodes = ranks
        .iter()
        .map(|rank| rank.node_rank.saturating_add(1))
        .max()
        .unwrap_or(0);
    ranks
        .iter()
        .map(|rank| {
            BTreeMap::from([
                ("RANK".to_owned(), rank.world_rank.to_string()),
                ("LOCAL_RANK".to_owned(), rank.local_rank.to_string()),
                ("WORLD_SIZE".to_owned(), rank.world_size.to_string()),
                (
                    "LOCAL_WORLD_SIZE".to_owned(),
                    rank.local_world_size.to_string(),
                ),
                ("NODE_RANK".to_owned(), rank.node_rank.to_string()),
                ("GROUP_RANK".to_owned(), rank.node_rank.to_string()),
                ("GROUP_WORLD_SIZE".to_owned(), nodes.to_string()),
                ("ROLE_RANK".to_owned(), rank.world_rank.to_string()),
                ("ROLE_WORLD_SIZE".to_owned(), rank.world_size.to_string()),
                ("ROLE_NAME".to_owned(), "default".to_owned()),
                (
                    "TORCHELASTIC_RESTART_COUNT".to_owned(),
                    restart_count.to_string(),
                ),
                // The worker gives each task a fresh `TORCHELASTIC_ERROR_FILE`, where
                // `@record` leaves the exception that ended it.
                (
                    root_cause::ERROR_FILE_VAR.to_owned(),
                    root_cause::TORCHELASTIC_ERROR_FILE.to_owned(),
                ),
                (
                    "TORCHELASTIC_MAX_RESTARTS".to_owned(),
                    max_restarts.to_string(),
                ),
                ("TORCHELASTIC_RUN_ID".to_owned(), run_id.to_owned()),
                // No agent hosts a store: rank 0 creates it at MASTER_ADDR:MASTER_PORT, as
                // `init_process_group("env://")` does when this is not `True`.
                (
                    "TORCHELASTIC_USE_AGENT_STORE".to_owned(),
                    "False".to_owned(),
                ),
            ])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_masters_are_bracketed() {
        let master = |ip: &str| WorkerAddress {
            ip: ip.to_owned(),
            port: 29500,
        };
        assert_eq!(master("::1").to_string(), "[::1]:29500");
        assert_eq!(master("10.0.0.1").to_string(), "10.0.0.1:29500");
        assert_eq!(master("node-a").to_string(), "node-a:29500");
    }

    #[test]
    fn gloo_and_nccl_go_through_the_interface_of_the_ranks_address_unless_the_run_says() {
        let none = BTreeMap::new();
        let env = interface_env(&none, Some("ty0"));
        assert_eq!(env[GLOO_SOCKET_IFNAME], "ty0");
        assert_eq!(
            env[NCCL_SOCKET_IFNAME], "=ty0",
            "exactly that name, not a prefix"
        );
        assert!(
            interface_env(&none, None).is_empty(),
            "unknown: left to torch"
        );
        let own = BTreeMap::from([(NCCL_SOCKET_IFNAME.to_owned(), "ib".to_owned())]);
        let env = interface_env(&own, Some("ty0"));
        assert_eq!(env.get(GLOO_SOCKET_IFNAME).map(String::as_str), Some("ty0"));
        assert!(
            !env.contains_key(NCCL_SOCKET_IFNAME),
            "the run's own value wins"
        );
    }

    #[test]
    fn the_rendezvous_is_what_the_task_will_be_told() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let torch = TorchBackend::default();
        let given = env(&[(MASTER_ADDR, "10.0.0.1"), (MASTER_PORT, "29500")]);
        assert_eq!(torch.rendezvous(&given), [Endpoint::new("10.0.0.1", 29500)]);
        assert!(
            torch
                .rendezvous(&env(&[(MASTER_ADDR, "10.0.0.1")]))
                .is_empty()
        );
        let tcp = TorchBackend::new(TorchConfig {
            init_method: InitMethod::Tcp,
            ..TorchConfig::default()
        });
        let url = env(&[(INIT_METHOD_VAR, "tcp://[fd00::7]:29400")]);
        assert_eq!(tcp.rendezvous(&url), [Endpoint::new("fd00::7", 29400)]);
    }

    #[test]
    fn a_master_port_that_is_no_port_is_refused_naming_it() {
        assert_eq!(given_port("29500").expect("a port"), 29500);
        for bad in ["0", "65536", "http"] {
            let error = given_port(bad).expect_err(bad).to_string();
            assert!(
                error.contains(&format!("MASTER_PORT to `{bad}`"))
                    && error.contains("from 1 to 65535"),
                "{error}"
            );
        }
    }

    #[test]
    fn choices_parse_in_any_case_and_name_the_alternatives() {
        assert_eq!(
            "NCCL".parse::<ProcessGroupBackend>().unwrap(),
            ProcessGroupBackend::Nccl
        );
        assert_eq!("tcp".parse::<InitMethod>().unwrap(), InitMethod::Tcp);
        let err = "mpi".parse::<ProcessGroupBackend>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid torch backend `mpi`: expected one of auto, nccl, gloo"
        );
    }

    #[test]
    fn defaults_match_ray() {
        let config = TorchConfig::default();
        assert_eq!(config.backend, ProcessGroupBackend::Auto);
        assert_eq!(config.init_method, InitMethod::Env);
        assert_eq!(config.timeout_s, 1800);
    }
}
