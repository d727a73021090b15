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
    /// This process was started as a worker's agent, but its program did not call
    /// `run_if_agent` and went on as a driver: it would start workers that do the same.
    #[error(
        "this process was started as a worker, but its `main` does not call \
         `trainyard::run_if_agent(functions)` first thing: a worker cannot start workers"
    )]
    NotServing,
}
