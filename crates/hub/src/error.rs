//! Why an [`AgentHub`](crate::AgentHub) cannot start.

use std::io;
use std::net::SocketAddr;

/// Why an [`AgentHub`](crate::AgentHub) cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// The hub cannot listen.
    #[error("cannot listen for agents on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The run's secret token cannot be made.
    #[error("cannot make the run's secret token")]
    Token(#[source] getrandom::Error),
}
