use std::fmt;

use trainyard_backend_executor::ExecutorError;
use trainyard_config::ConfigError;
use trainyard_resources::{ResourceError, chain_text};
use trainyard_runtime::RuntimeError;
#[cfg(feature = "local")]
use trainyard_runtime_local::LocalError;
use trainyard_worker_group::WorkerGroupError;

/// Any error of trainyard; the layer's own error is the [`source`](std::error::Error::source).
///
/// `Display` says what failed and keeps the cause in [`source`](std::error::Error::source),
/// as every error of the workspace does (so that a chain printer never repeats a cause).
/// The alternate form, `{error:#}`, says it with every cause, `a: b: c`, as `anyhow` does:
/// what a program prints for its user. `Debug` says the same, so that
/// `fn main() -> trainyard::Result<()>` and `{:?}` show the whole story rather than a nested
/// dump; so does [`ErrorChain`](crate::resources::ErrorChain) for `{}`:
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
/// assert!(format!("{error:#}").starts_with("invalid configuration: "));
/// assert_eq!(format!("{error:#}"), format!("{error:?}"));
/// assert_eq!(ErrorChain(&error).to_string(), format!("{error:#}"));
/// eprintln!("error: {error:#}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[non_exhaustive]
pub enum Error {
    /// A resource dictionary is invalid.
    Resources(ResourceError),
    /// A configuration is invalid.
    Config(ConfigError),
    /// The runtime failed.
    Runtime(RuntimeError),
    /// The worker group failed.
    WorkerGroup(WorkerGroupError),
    /// The run could not be scheduled, started, or completed.
    Executor(ExecutorError),
    /// The local runtime cannot be configured or started.
    #[cfg(feature = "local")]
    Local(LocalError),
}

/// `Result` with trainyard's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// What failed, without its cause: a run refused before anything was started says so,
    /// rather than that training failed.
    const fn what(&self) -> &'static str {
        match self {
            Self::Resources(_) => "invalid resources",
            Self::Config(_) => "invalid configuration",
            Self::Runtime(_) => "the runtime failed",
            Self::WorkerGroup(_) => "the worker group failed",
            Self::Executor(ExecutorError::Config(_)) => "the run cannot start",
            Self::Executor(error) => error.what(),
            #[cfg(feature = "local")]
            Self::Local(_) => "the local runtime cannot start",
        }
    }
}

impl fmt::Display for Error {
    /// What failed; with `{:#}`, followed by every cause: `a: b: c`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            let shown = self.what().to_owned();
            f.write_str(&chain_text(shown, std::error::Error::source(self)))
        } else {
            f.write_str(self.what())
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:#}")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Resources(error) => Some(error),
            Self::Config(error) => Some(error),
            Self::Runtime(error) => Some(error),
            Self::WorkerGroup(error) => Some(error),
            Self::Executor(error) => Some(error),
            #[cfg(feature = "local")]
            Self::Local(error) => Some(error),
        }
    }
}

impl From<ResourceError> for Error {
    fn from(error: ResourceError) -> Self {
        Self::Resources(error)
    }
}

impl From<ConfigError> for Error {
    fn from(error: ConfigError) -> Self {
        Self::Config(error)
    }
}

impl From<RuntimeError> for Error {
    fn from(error: RuntimeError) -> Self {
        Self::Runtime(error)
    }
}

impl From<WorkerGroupError> for Error {
    fn from(error: WorkerGroupError) -> Self {
        Self::WorkerGroup(error)
    }
}

impl From<ExecutorError> for Error {
    fn from(error: ExecutorError) -> Self {
        Self::Executor(error)
    }
}

#[cfg(feature = "local")]
impl From<LocalError> for Error {
    fn from(error: LocalError) -> Self {
        Self::Local(error)
    }
}
