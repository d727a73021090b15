use std::io;
use std::net::SocketAddr;

use crate::detect::DetectError;
use crate::ledger::LedgerError;

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
    /// The control plane cannot listen.
    #[error("cannot listen for agents on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The machine-wide ledger cannot be opened.
    #[error("cannot open the machine's reservation ledger")]
    Ledger(#[source] LedgerError),
    /// The run's secret token cannot be made.
    #[error("cannot make the run's secret token")]
    Token(#[source] getrandom::Error),
}
