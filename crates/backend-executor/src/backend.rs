//! The [`Backend`] trait: what a framework (PyTorch, TensorFlow, JAX, ...) needs done around
//! the workers' lifecycle, and the environment it gives them.

use std::collections::BTreeMap;
use std::fmt::{self, Debug};
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use trainyard_config::RunConfig;
use trainyard_runtime::{ActorRuntimeExt, Endpoint};
use trainyard_worker_group::{WorkerGroup, WorkerGroupError};

use crate::RankInfo;

/// Environment added to each worker's task, in world-rank order. Empty when a hook adds
/// nothing; otherwise one map per worker.
pub type WorkerEnv = Vec<BTreeMap<String, String>>;

/// What a backend hook can see: the started, sorted worker group and its ranks.
#[derive(Debug, Clone, Copy)]
pub struct BackendContext<'a> {
    /// The workers, in world-rank order.
    pub group: &'a WorkerGroup,
    /// Each worker's ranks, in world-rank order.
    pub ranks: &'a [RankInfo],
    /// How many times the run was restarted before this attempt.
    pub restart_count: u32,
    /// The run's configuration (its `env` is what the user set explicitly).
    pub run: &'a RunConfig,
}

impl BackendContext<'_> {
    /// A port that is free on the node of the worker at `worker` (an index in world-rank
    /// order), as a rendezvous needs.
    ///
    /// # Errors
    /// [`BackendError::FreePort`] when there is no such worker, or it cannot be reached or
    /// answers with something other than a port.
    pub async fn free_port(&self, worker: usize) -> Result<u16, BackendError> {
        let workers = self.group.workers();
        let fail = |source| BackendError::FreePort {
            source: Box::new(source),
        };
        let actor = workers
            .get(worker)
            .ok_or_else(|| {
                fail(WorkerGroupError::InvalidWorkerIndex {
                    index: worker,
                    len: workers.len(),
                })
            })?
            .actor;
        self.group
            .runtime()
            .find_free_port(actor)
            .await
            .map_err(|source| fail(WorkerGroupError::Worker { worker, source }))
    }

    /// Every worker's address, in world-rank order: its node's IP address (known since the
    /// workers started) and a port found free there (all workers are asked at once).
    ///
    /// # Errors
    /// [`BackendError::FreePort`] for the first worker that cannot give a port.
    pub async fn worker_addresses(&self) -> Result<Vec<WorkerAddress>, BackendError> {
        let ports = try_join_all((0..self.group.len()).map(|i| self.free_port(i))).await?;
        Ok(self
            .group
            .workers()
            .iter()
            .zip(ports)
            .map(|(worker, port)| WorkerAddress {
                ip: worker.metadata.node_ip.clone(),
                port,
            })
            .collect())
    }
}

/// Where a worker can be reached: its node's IP address and a port.
///
/// `Display` writes `ip:port`, with an IPv6 address in brackets:
///
/// ```
/// use trainyard_backend_executor::WorkerAddress;
///
/// let v4 = WorkerAddress { ip: "10.0.0.1".into(), port: 29500 };
/// let v6 = WorkerAddress { ip: "::1".into(), port: 29500 };
/// assert_eq!(v4.to_string(), "10.0.0.1:29500");
/// assert_eq!(v6.to_string(), "[::1]:29500");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerAddress {
    /// The IP address of the worker's node (as the runtime reports it).
    pub ip: String,
    /// The port.
    pub port: u16,
}

impl fmt::Display for WorkerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => write!(f, "[{}]:{}", self.ip, self.port),
            _ => write!(f, "{}:{}", self.ip, self.port),
        }
    }
}

/// Why a backend hook failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A call to the workers failed (a worker died, or answered unexpectedly).
    #[error("backend `{backend}` could not reach the workers")]
    Workers {
        /// The backend.
        backend: String,
        /// The worker group's error (it names the worker).
        #[source]
        source: Box<WorkerGroupError>,
    },
    /// No free port could be found on a worker ([`BackendContext::free_port`]).
    #[error("cannot find a free port on a worker")]
    FreePort {
        /// The worker group's error (it names the worker).
        #[source]
        source: Box<WorkerGroupError>,
    },
    /// A worker answered a backend's request with something unexpected (counted as a failed
    /// start and retried).
    #[error("backend `{backend}` got an unexpected answer from worker {worker}: {reason}")]
    Protocol {
        /// The backend.
        backend: String,
        /// The worker's index.
        worker: usize,
        /// What was wrong.
        reason: String,
    },
    /// The backend's own configuration is unusable.
    #[error("backend `{backend}` is misconfigured: {reason}")]
    Config {
        /// The backend.
        backend: String,
        /// What is wrong.
        reason: String,
    },
}

impl BackendError {
    /// A failed call to the workers of `backend`.
    #[must_use]
    pub fn workers(backend: impl Into<String>, source: WorkerGroupError) -> Self {
        Self::Workers {
            backend: backend.into(),
            source: Box::new(source),
        }
    }

    /// Whether the failure comes from a worker that died (a system failure).
    #[must_use]
    pub fn is_worker_death(&self) -> bool {
        match self {
            Self::Workers { source, .. } | Self::FreePort { source } => {
                crate::error::is_death(source.as_ref())
            }
            Self::Protocol { .. } | Self::Config { .. } => false,
        }
    }
}

/// Hooks around a worker group's life, as Ray Train's `Backend`. Object safe; custom
/// backends live in the crates that need them.
///
/// The hooks are `async`: implement the trait under `#[async_trait]` (the macro is
/// re-exported as [`trainyard_backend_executor::async_trait`](crate::async_trait) and, by
/// the facade, as `trainyard::async_trait`), and override only the hooks you need. A
/// backend that is `Clone` is its own [`BackendConfig`].
///
/// A backend that tells every worker where all the others listen, then runs on a
/// simulated cluster:
///
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::Arc;
///
/// use trainyard_backend_executor::{
///     Backend, BackendContext, BackendError, BackendExecutor, WorkerEnv, async_trait,
/// };
/// use trainyard_config::ScalingConfig;
/// use trainyard_runtime::sim::{SimNode, SimRuntime};
/// use trainyard_runtime::{FunctionRegistry, TaskSpec};
///
/// #[derive(Debug, Clone)]
/// struct Peers;
///
/// #[async_trait]
/// impl Backend for Peers {
///     fn name(&self) -> &str {
///         "peers"
///     }
///
///     async fn on_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
///         let peers: Vec<String> = ctx.worker_addresses().await?.iter().map(ToString::to_string).collect();
///         let vars = BTreeMap::from([("PEERS".to_owned(), peers.join(","))]);
///         Ok(vec![vars; ctx.ranks.len()])
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let functions = FunctionRegistry::new().register("peers", |task| async move {
///     Ok(serde_json::json!(task.var("PEERS")))
/// });
/// let cluster = SimRuntime::new([SimNode::new("node-a").ip("10.0.0.1").cpus(2)]).with_functions(functions);
/// let scaling = ScalingConfig::default().num_workers(2);
/// let executor = BackendExecutor {
///     backend: Arc::new(Peers),
///     scaling,
///     ..BackendExecutor::new(Arc::new(cluster))
/// };
/// let report = executor.fit(&TaskSpec::function("peers", serde_json::Value::Null)).await?;
/// assert_eq!(report.returns[0], report.returns[1]);
/// assert!(report.returns[0].as_str().is_some_and(|peers| peers.starts_with("10.0.0.1:")));
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Backend: Send + Sync + Debug + 'static {
    /// A short name for logs and errors (`torch`).
    fn name(&self) -> &str;

    /// Whether workers on one node see each other's GPUs (`CUDA_VISIBLE_DEVICES` is the
    /// node's union of the run's GPU ids) rather than only their own.
    fn share_accelerator_ids(&self) -> bool {
        false
    }

    /// The variables this backend's hooks set on every worker's task, each with what its
    /// value is. The run's own environment (`RunConfig::env`) cannot set them: the backend's
    /// value replaces it. A variable the backend sets only where the run's environment does
    /// not (torch's `OMP_NUM_THREADS`) is not listed. [`reserved_env`](#method.reserved_env)
    /// adds the executor's own variables.
    fn owned_env(&self) -> BTreeMap<&'static str, &'static str> {
        BTreeMap::new()
    }

    /// Where the ranks meet once their tasks start (PyTorch's `MASTER_ADDR:MASTER_PORT`), as
    /// the task of a rank whose variables are `env` (the run's own included) will be told:
    /// before any task starts, the executor has every rank's host try to reach it (the
    /// preflight), so that a host that cannot fails the attempt in seconds, named, rather than
    /// the rendezvous timing out. None by default.
    fn rendezvous(&self, env: &BTreeMap<String, String>) -> Vec<Endpoint> {
        let _ = env;
        Vec::new()
    }

    /// After the workers are started and sorted, before training: set up the framework's
    /// rendezvous. Returns environment for each worker's task.
    async fn on_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
        let _ = ctx;
        Ok(Vec::new())
    }

    /// Right before the training task starts on every worker. Returns environment for each
    /// worker's task.
    async fn on_training_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
        let _ = ctx;
        Ok(Vec::new())
    }

    /// Before the workers are stopped. Errors from workers that already died are expected
    /// and only logged by the executor.
    async fn on_shutdown(&self, group: &WorkerGroup) -> Result<(), BackendError> {
        let _ = group;
        Ok(())
    }
}

impl dyn Backend {
    /// Every variable of a worker's task that the run's environment cannot set, each with
    /// what its value is: the executor's (the rank context of
    /// [`rank_env`](crate::rank_env), and where the task's checkpoints go and come from) and
    /// the backend's ([`Backend::owned_env`]).
    ///
    /// ```
    /// use trainyard_backend_executor::{BackendConfig, NoBackend};
    ///
    /// let reserved = NoBackend.build().reserved_env();
    /// assert!(reserved.contains_key("TRAINYARD_WORLD_RANK"));
    /// assert!(!reserved.contains_key("RANK"), "no backend, no torchrun variables");
    /// ```
    #[must_use]
    pub fn reserved_env(&self) -> BTreeMap<&'static str, &'static str> {
        let mut reserved: BTreeMap<_, _> = crate::context::EXECUTOR_ENV.iter().copied().collect();
        reserved.extend(self.owned_env());
        reserved
    }
}

/// Configuration that builds its backend, as Ray Train's `BackendConfig`.
///
/// Every backend that is `Clone` is its own configuration (it builds a copy of itself), so
/// a custom backend needs no second type; a configuration such as `TorchConfig` builds a
/// backend of another type.
pub trait BackendConfig: Debug + Send + Sync {
    /// Builds the backend.
    fn build(&self) -> Arc<dyn Backend>;
}

impl<B: Backend + Clone> BackendConfig for B {
    fn build(&self) -> Arc<dyn Backend> {
        Arc::new(self.clone())
    }
}

/// A backend that sets nothing up: workers get their ranks and accelerator ids only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoBackend;

#[async_trait]
impl Backend for NoBackend {
    fn name(&self) -> &str {
        "none"
    }
}
