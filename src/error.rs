use trainyard_backend_executor::ExecutorError;
use trainyard_config::ConfigError;
use trainyard_resources::ResourceError;
use trainyard_runtime::RuntimeError;
use trainyard_worker_group::WorkerGroupError;

/// Any error of trainyard; the layer's own error is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A resource dictionary is invalid.
    #[error("invalid resources")]
    Resources(#[from] ResourceError),
    /// A configuration is invalid.
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    /// The runtime failed.
    #[error("the runtime failed")]
    Runtime(#[from] RuntimeError),
    /// The worker group failed.
    #[error("the worker group failed")]
    WorkerGroup(#[from] WorkerGroupError),
    /// The run could not be scheduled, started, or completed.
    #[error("the training run failed")]
    Executor(#[from] ExecutorError),
}

/// `Result` with trainyard's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
