use std::io;

use crate::detect::DetectError;
use crate::ledger::LedgerError;
use trainyard_hub::HubError;

/// Why the local runtime cannot be configured or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    /// The machine cannot be split into nodes as asked.
    #[error("cannot split this machine into nodes")]
    Detect(#[from] DetectError),
    /// The running executable, which agents are started as, cannot be found.
    #[error("cannot find the running executable to start agents with")]
    CurrentExe(#[source] io::Error),
    /// The configuration has no node.
    #[error("the local runtime needs at least one node, got 0")]
    NoNodes,
    /// The hub agents connect to cannot start.
    #[error(transparent)]
    Hub(#[from] HubError),
    /// The machine-wide ledger cannot be opened.
    #[error("cannot open the machine's reservation ledger")]
    Ledger(#[source] LedgerError),
    /// The run's warm Python cannot be started.
    #[error("cannot start the warm Python `{}`", python.display())]
    WarmPython {
        /// The interpreter.
        python: std::path::PathBuf,
        /// Why.
        #[source]
        error: io::Error,
    },
}
