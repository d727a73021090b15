//! The preflight's vocabulary: an address a rank's host must reach before its task starts
//! (the rendezvous), and what the host found ([`crate::Request::Preflight`]).

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// An address and port, as a task will be told it (`MASTER_ADDR`, `MASTER_PORT`): the host
/// may be a name.
///
/// `Display` writes `host:port`, with an IPv6 address in brackets:
///
/// ```
/// use trainyard_runtime::Endpoint;
///
/// assert_eq!(Endpoint::new("10.0.0.1", 29500).to_string(), "10.0.0.1:29500");
/// assert_eq!(Endpoint::new("::1", 29500).to_string(), "[::1]:29500");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// An IP address or a host name.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl Endpoint {
    /// `host:port`.
    #[must_use]
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => write!(f, "[{}]:{}", self.host, self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// What a host found when it tried to reach an [`Endpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reach {
    /// What it tried to reach.
    pub endpoint: Endpoint,
    /// The address the endpoint's host resolved to, when it resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The interface of the host's route toward it, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Why it cannot be reached; `None` when something answered there (a refusal too: the
    /// host is there, and its port opens when its task starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<Unreachable>,
}

/// Why an endpoint cannot be reached from a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Unreachable {
    /// Its name resolves to no address there.
    NoAddress {
        /// The resolver's error.
        error: String,
    },
    /// The host has no route to it, or its kernel says it cannot be reached.
    NoRoute {
        /// The kernel's error.
        error: String,
    },
    /// Nothing answered within the bound.
    NoAnswer {
        /// The bound, in milliseconds.
        within_ms: u64,
    },
    /// The connection failed otherwise.
    Failed {
        /// The error.
        error: String,
    },
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoAddress { error } => write!(f, "its name resolves to no address ({error})"),
            Self::NoRoute { error } => write!(f, "no route to it ({error})"),
            Self::NoAnswer { within_ms } => {
                write!(f, "no answer within {} s", *within_ms as f64 / 1000.0)
            }
            Self::Failed { error } => write!(f, "the connection failed ({error})"),
        }
    }
}
