//! [`BridgeError`]: what can go wrong between the Rust driver and the Ray bridge.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// The last lines the bridge wrote to stderr, kept for error messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StderrTail(pub Vec<String>);

impl fmt::Display for StderrTail {
    /// The lines on one line, `; ` between them, so that a one-line error message stays one
    /// line; `(none)` when there are none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(none)");
        }
        for (i, line) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str(line.trim())?;
        }
        Ok(())
    }
}

impl StderrTail {
    /// `; its last stderr lines: …`, or nothing when there are none.
    fn suffix(&self) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            format!("; its last stderr lines: {self}")
        }
    }
}

/// A failure of the bridge or of a Ray call made through it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// Nothing answers at the cluster's GCS address (checked before starting the bridge,
    /// because `ray.init` would hang for minutes), or Ray reported the connection failed.
    #[error("the Ray cluster at {address} is unreachable")]
    Unreachable {
        /// The address tried.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Token authentication failed: the token is missing or wrong.
    #[error(
        "Ray rejected the authentication token for {address}: the token is missing or wrong ({looked_at}): {message}"
    )]
    Auth {
        /// The address tried (`local head` for a throwaway one).
        address: String,
        /// Where the token was looked for.
        looked_at: String,
        /// Ray's message.
        message: String,
    },
    /// The bridge script could not be written out.
    #[error("cannot write the bridge script to {path}")]
    Script {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The interpreter could not be started.
    #[error("cannot start the bridge interpreter {python}")]
    Spawn {
        /// The interpreter.
        python: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bridge's interpreter cannot import Ray.
    #[error(
        "--runtime ray needs a Python with Ray {supported}, and {} cannot import ray ({message}): install it there (pip install 'ray[train]=={supported}'), or set TRAINYARD_RAY_PYTHON to an interpreter that has it",
        python.display()
    )]
    NoRay {
        /// The interpreter.
        python: PathBuf,
        /// Why the import failed.
        message: String,
        /// The release this build is written for.
        supported: &'static str,
    },
    /// The bridge started but `ray.init` failed (or it exited before saying ready).
    #[error("the Ray bridge failed to start ({kind}): {message}{}", stderr.suffix())]
    Start {
        /// The bridge's classification (`start`, or `exited` when it said nothing).
        kind: String,
        /// Its message.
        message: String,
        /// Its last stderr lines.
        stderr: StderrTail,
    },
    /// The bridge's interpreter (and so the cluster, whose Ray must match it) has a Ray
    /// release this build does not support; see [`RAY_VERSION`](crate::RAY_VERSION).
    #[error(
        "the Ray bridge's interpreter {} has Ray {found}, but this build of trainyard supports Ray {supported} and its patch releases; install ray=={supported} there",
        python.display()
    )]
    RayVersion {
        /// The interpreter.
        python: PathBuf,
        /// Its `ray.__version__`.
        found: String,
        /// The release this build is written for.
        supported: &'static str,
    },
    /// A Ray call failed; `kind` is the bridge's classification (`invalid`, `timeout`,
    /// `deadline`, `closing`, `name_taken`, `actor_died`, `unknown_group`, `unknown_actor`,
    /// `protocol`, `ray`).
    #[error("ray {op} failed ({kind}): {message}")]
    Ray {
        /// The op.
        op: &'static str,
        /// The classification.
        kind: String,
        /// Ray's message.
        message: String,
    },
    /// No answer in time.
    #[error("the Ray bridge did not answer {op} within {after:?}")]
    Timeout {
        /// The op (`start` for start-up).
        op: &'static str,
        /// The bound that passed.
        after: Duration,
    },
    /// The bridge process is gone.
    #[error("the Ray bridge process was lost; its last stderr lines: {stderr}")]
    Lost {
        /// Its last stderr lines.
        stderr: StderrTail,
    },
    /// The operating system gives no randomness for the token of a throwaway head: the bridge
    /// is not started rather than guarded by a guessable token.
    #[error(
        "cannot make an authentication token for the throwaway Ray head: the operating system gives no randomness"
    )]
    Randomness {
        /// Why.
        #[source]
        source: getrandom::Error,
    },
    /// The bridge wrote a protocol line longer than the client accepts; the bridge was
    /// stopped, as what it says can no longer be followed.
    #[error(
        "the Ray bridge wrote a line longer than {limit} bytes, which breaks its protocol; it was stopped. Its last stderr lines: {stderr}"
    )]
    LineTooLong {
        /// The longest line accepted, in bytes.
        limit: usize,
        /// Its last stderr lines.
        stderr: StderrTail,
    },
    /// The bridge sent something this client does not understand.
    #[error("the Ray bridge sent an unexpected reply to {op}")]
    Protocol {
        /// The op.
        op: &'static str,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

/// Why a [`RayRuntime`](crate::RayRuntime) cannot be configured or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RayError {
    /// The bridge to the cluster cannot start (unreachable cluster, wrong token, no Ray in
    /// the interpreter).
    #[error(transparent)]
    Bridge(#[from] BridgeError),
    /// The hub the agents connect to cannot start.
    #[error(transparent)]
    Hub(#[from] trainyard_hub::HubError),
    /// The agent binary cannot be found.
    #[error("cannot find the agent binary {}", .path.display())]
    AgentBinary {
        /// The path tried.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The address Ray reports for the driver's node is not an IP address.
    #[deprecated(
        since = "0.2.0",
        note = "never returned: the driver's address is the one this host sends from toward the cluster's head (`trainyard_sys::net::advertise_toward`)"
    )]
    #[error("Ray reports the driver's node at `{ip}`, which is not an IP address")]
    NodeIp {
        /// What Ray reported.
        ip: String,
    },
}
