//! [`Bridge`]: the Rust client of the Python bridge to Ray.
//!
//! The bridge script (`bridge.py`, compiled in) is written to a private temporary directory and
//! run with a configurable interpreter. Requests go to its stdin, one JSON object a line; a
//! reader task routes replies to their callers by id and `actor_ended` events to a receiver per
//! actor. When the bridge dies, every pending and later call fails with [`BridgeError::Lost`]
//! carrying its last stderr lines, and every actor's receiver gets a `bridge_lost` end.
//!
//! Fate sharing: the bridge asks the kernel for `SIGKILL` when its parent *thread* exits
//! (`PR_SET_PDEATHSIG`), so a killed driver takes the bridge along and Ray then removes the
//! bridge job's actors and groups. Start the bridge from a long-lived thread (a tokio worker or
//! the main thread), not from a `spawn_blocking` thread that may retire.
//!
//! One module per concern: `config` (how to start it, what an actor runs), `process` (the
//! interpreter, its script, environment and process group), `replies` (routing what the
//! bridge says to whoever waits for it) and `ops` (the typed calls).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::process::{Child, ChildStdin};
use tokio::task::JoinHandle;
use trainyard_sys::process_group;

use crate::auth::{AuthLookup, file_has_token};
use crate::error::BridgeError;
use crate::protocol::ReadyInfo;

mod config;
mod ops;
mod process;
mod replies;

pub use config::{ActorLaunch, BridgeConfig};
#[cfg(feature = "testing")]
pub(crate) use process::random_token;

use process::{launch, probe};
use replies::Shared;

/// The bridge script, shipped inside the crate.
pub const BRIDGE_SCRIPT: &str = include_str!("../bridge.py");

/// The Ray release the bridge is written for and tested against (`scripts/ray-env.sh`
/// installs it). The bridge reads some of Ray's internals (the GCS actor table and its typed
/// death causes, the placement group table), whose shape may change in any minor release;
/// [`Bridge::start`] therefore refuses another minor series, and accepts another patch release
/// of this one with a warning.
pub const RAY_VERSION: &str = "2.60.0";

/// The interpreter variable: the Python that has `ray` installed.
pub const PYTHON_VAR: &str = "TRAINYARD_RAY_PYTHON";

/// A running bridge to one Ray cluster.
#[derive(Debug)]
pub struct Bridge {
    shared: Arc<Shared>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    child: tokio::sync::Mutex<Option<Child>>,
    pid: Option<u32>,
    next_id: AtomicU64,
    request_timeout: Duration,
    reader: JoinHandle<()>,
    /// Holds the script's directory; removed on drop.
    _script: tempfile::TempDir,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // The bridge and whatever it started go; `kill_on_drop` reaps the child. Receivers of
        // actor ends get a `bridge_lost` end rather than a closed channel.
        let unreaped = self.child.try_lock().map_or(true, |child| child.is_some());
        if unreaped {
            sweep(self.pid);
        }
        self.reader.abort();
        self.shared.mark_lost();
    }
}

impl Bridge {
    /// Starts the bridge and waits until it is connected to Ray.
    ///
    /// For an explicit address the GCS port is probed first, because `ray.init` against a
    /// port where nothing listens hangs for minutes. Token auth is set up as [`AuthLookup`]
    /// describes; a throwaway head (no address) gets a random token.
    ///
    /// # Errors
    /// [`BridgeError::Unreachable`], [`BridgeError::Auth`], [`BridgeError::Start`],
    /// [`BridgeError::Timeout`], [`BridgeError::RayVersion`] when the interpreter's Ray is not
    /// of the [`RAY_VERSION`] series, and the errors of writing and spawning the script.
    pub async fn start(config: BridgeConfig) -> Result<(Self, ReadyInfo), BridgeError> {
        if let Some(address) = config.address.as_deref().filter(|a| *a != "auto") {
            probe(address).await?;
        }
        let auth = AuthLookup::find(|name| config.var(name), file_has_token);
        let (bridge, start) = launch(&config, &auth)?;
        let address = config
            .address
            .clone()
            .unwrap_or_else(|| "a throwaway local head".to_owned());
        match tokio::time::timeout(config.start_timeout, start).await {
            Ok(Ok(Ok(ready))) => {
                if let Err(refused) = check_ray_version(&ready.ray_version, &config.python) {
                    if let Err(error) = bridge.shutdown(VERSION_REFUSED_GRACE).await {
                        tracing::debug!(%error, "the refused Ray bridge did not shut down cleanly");
                    }
                    return Err(refused);
                }
                tracing::info!(
                    ray_version = %ready.ray_version,
                    address = %ready.address,
                    started_head = ready.started_head,
                    "Ray bridge ready"
                );
                Ok((bridge, ready))
            }
            Ok(Ok(Err(failure))) => {
                let stderr = bridge.reap(Duration::from_secs(2)).await;
                Err(match failure.kind.as_str() {
                    "auth" => BridgeError::Auth {
                        address,
                        looked_at: auth.describe(),
                        message: failure.message,
                    },
                    "unreachable" => BridgeError::Unreachable {
                        address,
                        source: std::io::Error::other(failure.message),
                    },
                    "no_ray" => BridgeError::NoRay {
                        python: config.python.clone(),
                        message: failure.message,
                        supported: crate::RAY_VERSION,
                    },
                    _ => BridgeError::Start {
                        kind: failure.kind,
                        message: failure.message,
                        stderr,
                    },
                })
            }
            Ok(Err(_closed)) => {
                let stderr = bridge.reap(Duration::from_secs(2)).await;
                Err(BridgeError::Start {
                    kind: "exited".to_owned(),
                    message: "the bridge exited before connecting to Ray".to_owned(),
                    stderr,
                })
            }
            Err(_elapsed) => {
                bridge.reap(Duration::ZERO).await;
                Err(BridgeError::Timeout {
                    op: "start",
                    after: config.start_timeout,
                })
            }
        }
    }

    /// The bridge process's pid (for tests and diagnostics).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }
}

/// How long a bridge whose Ray is refused gets to shut down (with a throwaway head).
const VERSION_REFUSED_GRACE: Duration = Duration::from_secs(10);

/// SIGKILLs the bridge's process group: the bridge, if it still runs, and what it started
/// (a throwaway head), while the group is the bridge's (`trainyard_sys::process_group`:
/// its leader unreaped, or a member still in it).
fn sweep(pid: Option<u32>) {
    if let Some(group) = pid {
        process_group::kill(group);
    }
}

/// Accepts a Ray of the [`RAY_VERSION`] series: the same release, or another patch release
/// (with a warning).
fn check_ray_version(found: &str, python: &Path) -> Result<(), BridgeError> {
    if found == RAY_VERSION {
        return Ok(());
    }
    let series = |version: &str| {
        let mut parts = version.split('.').map(|part| {
            let digits = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            part[..digits].parse::<u32>().ok()
        });
        Some((parts.next()??, parts.next()??))
    };
    match (series(found), series(RAY_VERSION)) {
        (Some(found_series), Some(supported)) if found_series == supported => {
            tracing::warn!(
                found,
                supported = RAY_VERSION,
                "the Ray bridge runs another patch release of the Ray it was built for"
            );
            Ok(())
        }
        _ => Err(BridgeError::RayVersion {
            python: python.to_path_buf(),
            found: found.to_owned(),
            supported: RAY_VERSION,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn start_fails_unreachable_before_running_any_interpreter() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let config = BridgeConfig::default()
            .python("/nonexistent/python")
            .address(&address);
        let err = Bridge::start(config).await.expect_err("nothing listens");
        assert!(
            matches!(err, BridgeError::Unreachable { address: ref a, .. } if *a == address),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_missing_interpreter_is_a_spawn_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        let config = BridgeConfig::default()
            .python("/nonexistent/python")
            .address(&address);
        let err = Bridge::start(config).await.expect_err("no interpreter");
        assert!(matches!(err, BridgeError::Spawn { .. }), "{err}");
    }

    #[test]
    fn only_the_supported_ray_series_is_accepted() {
        let python = Path::new("/venv/bin/python");
        for accepted in [RAY_VERSION, "2.60.1", "2.60.0rc1"] {
            assert!(check_ray_version(accepted, python).is_ok(), "{accepted}");
        }
        for refused in ["2.59.0", "2.61.0", "3.60.0", "2.6.0", "nightly", ""] {
            let err = check_ray_version(refused, python).expect_err(refused);
            assert!(
                matches!(err, BridgeError::RayVersion { ref found, .. } if found == refused),
                "{err}"
            );
        }
        let err = check_ray_version("2.61.0", python).expect_err("another series");
        assert_eq!(
            err.to_string(),
            "the Ray bridge's interpreter /venv/bin/python has Ray 2.61.0, but this build of \
             trainyard supports Ray 2.60.0 and its patch releases; install ray==2.60.0 there"
        );
    }

    #[test]
    fn the_supported_ray_is_the_one_the_test_environment_installs() {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ray-env.sh");
        let text = std::fs::read_to_string(script).expect("scripts/ray-env.sh is readable");
        assert!(
            text.lines()
                .any(|line| line == format!("RAY_VERSION=\"{RAY_VERSION}\"")),
            "scripts/ray-env.sh does not install Ray {RAY_VERSION}"
        );
    }
}
