use trainyard_backend_executor::ExecutorError;
use trainyard_config::ConfigError;
use trainyard_resources::ResourceError;
use trainyard_runtime::RuntimeError;
use trainyard_worker_group::WorkerGroupError;

/// Any error of trainyard; the layer's own error is the [`source`](std::error::Error::source).
///
/// `Display` says what failed and keeps the cause in [`source`](std::error::Error::source),
/// as every error of the workspace does (so that a chain printer never repeats a cause).
/// `Debug` says it with every cause on one line, so that `fn main() -> trainyard::Result<()>`
/// and `{:?}` show the whole story rather than a nested dump; so does
/// [`ErrorChain`](crate::resources::ErrorChain) for `{}`:
///
/// ```
/// use trainyard::config::ScalingConfig;
/// use trainyard::resources::ErrorChain;
///
/// let Err(cause) = ScalingConfig::default().num_workers(0).validate() else {
///     return Ok(());
/// };
/// let error = trainyard::Error::from(cause);
/// assert_eq!(error.to_string(), "invalid configuration");
/// assert!(format!("{error:?}").starts_with("invalid configuration: "));
/// assert_eq!(ErrorChain(&error).to_string(), format!("{error:?}"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(thiserror::Error)]
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

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", trainyard_resources::ErrorChain(self))
    }
}
