//! The [`Backend`] trait: what a framework (PyTorch, TensorFlow, JAX, ...) needs done around
//! the workers' lifecycle, and the environment it gives them.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use trainyard_config::RunConfig;
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
        matches!(self, Self::Workers { source, .. } if crate::error::is_death(source.as_ref()))
    }
}

/// Hooks around a worker group's life, as Ray Train's `Backend`. Object safe; custom
/// backends live in the crates that need them.
#[async_trait]
pub trait Backend: Send + Sync + Debug + 'static {
    /// A short name for logs and errors (`torch`).
    fn name(&self) -> &str;

    /// Whether workers on one node see each other's GPUs (`CUDA_VISIBLE_DEVICES` is the
    /// node's union of the run's GPU ids) rather than only their own.
    fn share_accelerator_ids(&self) -> bool {
        false
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

/// Configuration that names and builds its backend, as Ray Train's `BackendConfig`.
pub trait BackendConfig: Debug + Send + Sync {
    /// The backend's name (`torch`, `none`).
    fn backend_name(&self) -> &str;

    /// Builds the backend.
    fn build(&self) -> Arc<dyn Backend>;
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

impl BackendConfig for NoBackend {
    fn backend_name(&self) -> &str {
        "none"
    }

    fn build(&self) -> Arc<dyn Backend> {
        Arc::new(Self)
    }
}
