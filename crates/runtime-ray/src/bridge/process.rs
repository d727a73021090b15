//! The bridge's process: its script, interpreter, environment and process group, the probe
//! of the cluster's port before it starts, and its reaping.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::io::BufReader;
use tokio::process::Command;
use tokio::sync::oneshot;

use super::replies::{Line, MAX_LINE, Shared, StartSignal, read_line, read_protocol};
use super::{BRIDGE_SCRIPT, Bridge, BridgeConfig};
use crate::auth::{AUTH_MODE_VAR, AUTH_TOKEN_VAR, AuthLookup};
use crate::error::{BridgeError, StderrTail};

/// How long the GCS port may take to accept a TCP connection before start-up gives up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Writes the script and starts the interpreter on it, in its own process group, with the
/// tasks that read its stderr and its protocol stream; the receiver resolves when it says
/// whether it connected to Ray.
pub(super) fn launch(
    config: &BridgeConfig,
    auth: &AuthLookup,
) -> Result<(Bridge, oneshot::Receiver<StartSignal>), BridgeError> {
    let env = bridge_env(config, auth)?;
    let (dir, script) = write_script()?;
    let mut command = Command::new(&config.python);
    command
        .arg("-u")
        .arg(&script)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a throwaway head's processes (GCS, raylet, Ray's agents)
        // are the bridge's children, and Ray's agents outlive a killed bridge; the group
        // lets `sweep` stop them all. It also keeps a terminal's Ctrl-C away from the
        // bridge: the driver decides how to shut down.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|source| BridgeError::Spawn {
        python: config.python.clone(),
        source,
    })?;
    let pid = child.id();
    let shared = Arc::new(Shared::default());
    let start = shared.expect_start();
    // All three pipes were requested above, so they are present.
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        unreachable!("stdin, stdout and stderr are piped");
    };
    let stderr_task = tokio::spawn(pump_stderr(Arc::clone(&shared), stderr));
    let reader = tokio::spawn(read_protocol(
        Arc::clone(&shared),
        stdout,
        stderr_task,
        pid,
        MAX_LINE,
    ));
    let bridge = Bridge {
        shared,
        stdin: tokio::sync::Mutex::new(Some(stdin)),
        child: tokio::sync::Mutex::new(Some(child)),
        pid,
        next_id: AtomicU64::new(1),
        request_timeout: config.request_timeout,
        reader,
        _script: dir,
    };
    Ok((bridge, start))
}

/// Checks that something accepts TCP connections at `address` (`host:port`, port 6379 when
/// absent) within [`PROBE_TIMEOUT`].
pub(super) async fn probe(address: &str) -> Result<(), BridgeError> {
    let target = if address
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        address.to_owned()
    } else {
        format!("{address}:6379")
    };
    let unreachable = |source| BridgeError::Unreachable {
        address: address.to_owned(),
        source,
    };
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(&target)).await {
        Ok(Ok(_stream)) => Ok(()),
        Ok(Err(err)) => Err(unreachable(err)),
        Err(_) => Err(unreachable(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no TCP connection to {target} within {PROBE_TIMEOUT:?}"),
        ))),
    }
}

/// Writes the script, 0600 inside a fresh 0700 directory.
fn write_script() -> Result<(trainyard_sys::private::TempDir, PathBuf), BridgeError> {
    let dir = trainyard_sys::private::temp_dir("trainyard-ray-").map_err(|source| {
        BridgeError::Script {
            path: std::env::temp_dir(),
            source,
        }
    })?;
    let path = dir.path().join("trainyard_bridge.py");
    let script_error = |source| BridgeError::Script {
        path: path.clone(),
        source,
    };
    let mut file = trainyard_sys::private::create_new(&path).map_err(script_error)?;
    file.write_all(BRIDGE_SCRIPT.as_bytes())
        .map_err(script_error)?;
    Ok((dir, path))
}

/// A random token for a throwaway head, so that `ray.init()` does not write
/// `$HOME/.ray/auth_token` (which would silently turn auth on for the user's later clusters),
/// and for the test cluster's token auth: 32 bytes from the operating system, in hex.
///
/// # Errors
/// [`BridgeError::Randomness`] when the operating system gives no randomness: a token made
/// of anything guessable (the time, a pid) would guard nothing.
pub(crate) fn random_token() -> Result<String, BridgeError> {
    token_from(getrandom::fill)
}

/// A token of 32 bytes from `fill`, in hex.
fn token_from(
    fill: impl FnOnce(&mut [u8]) -> Result<(), getrandom::Error>,
) -> Result<String, BridgeError> {
    let mut bytes = [0u8; 32];
    fill(&mut bytes).map_err(|source| BridgeError::Randomness { source })?;
    Ok(hex::encode(bytes))
}

/// The environment the bridge gets, besides this process's.
fn bridge_env(
    config: &BridgeConfig,
    auth: &AuthLookup,
) -> Result<Vec<(String, String)>, BridgeError> {
    let mut env = vec![
        ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
        (
            "TRAINYARD_BRIDGE_PARENT".to_owned(),
            std::process::id().to_string(),
        ),
        (
            "TRAINYARD_RAY_NAMESPACE".to_owned(),
            config.namespace.clone(),
        ),
        (
            "TRAINYARD_RAY_ADDRESS".to_owned(),
            config.address.clone().unwrap_or_default(),
        ),
    ];
    env.push((
        "TRAINYARD_RAY_UNAVAILABLE_GRACE_S".to_owned(),
        config.unavailable_grace.as_secs_f64().to_string(),
    ));
    // Connecting to a cluster, a wrong token otherwise costs 20 retries a second apart; 1 s
    // makes it fail in ~1.5 s. A throwaway head keeps Ray's own wait: the same variable bounds
    // how long its GCS may take to publish its port, over a second on a busy machine.
    if config.address.is_some() && config.var("RAY_gcs_server_port_wait_time_s").is_none() {
        env.push(("RAY_gcs_server_port_wait_time_s".to_owned(), "1".to_owned()));
    }
    if let Some(mode) = auth.mode_to_set() {
        env.push((AUTH_MODE_VAR.to_owned(), mode.to_owned()));
    }
    if config.address.is_none() && auth.token.is_none() && auth.mode.is_none() {
        env.push((AUTH_TOKEN_VAR.to_owned(), random_token()?));
    }
    env.extend(config.env.iter().cloned());
    Ok(env)
}

/// The longest stderr line kept, in bytes; a longer one is kept as a note of its dropping.
const MAX_STDERR_LINE: usize = 64 * 1024;

/// Reads the bridge's stderr into the ring and `tracing`.
async fn pump_stderr(shared: Arc<Shared>, stderr: tokio::process::ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        let line = match read_line(&mut reader, MAX_STDERR_LINE, &mut buf).await {
            Ok(Line::Text) => String::from_utf8_lossy(&buf).into_owned(),
            Ok(Line::TooLong) => format!("(a stderr line over {MAX_STDERR_LINE} bytes, dropped)"),
            Ok(Line::End) | Err(_) => break,
        };
        tracing::debug!(target: "trainyard_runtime_ray::bridge::stderr", "{line}");
        shared.push_stderr(line);
    }
}

impl Bridge {
    /// Waits up to `grace` for the process to exit, then kills it; reaps it either way and
    /// returns its last stderr lines.
    pub(super) async fn reap(&self, grace: Duration) -> StderrTail {
        self.stdin.lock().await.take();
        if let Some(mut child) = self.child.lock().await.take() {
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(_status) => {}
                Err(_elapsed) => {
                    let _ = child.kill().await;
                }
            }
        }
        // The reader marks the bridge lost once the protocol stream closes.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while !self.shared.is_lost() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        self.shared.tail()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_throwaway_head_gets_a_random_token_and_ray_s_start_wait_an_explicit_address_neither() {
        let none = AuthLookup {
            mode: None,
            token: None,
            looked_at: Vec::new(),
        };
        let local = bridge_env(&BridgeConfig::default(), &none).expect("randomness");
        let token = local
            .iter()
            .find(|(k, _)| k == AUTH_TOKEN_VAR)
            .map(|(_, v)| v.clone())
            .expect("a throwaway head gets a token");
        assert_eq!(token.len(), 64);
        assert!(
            !local
                .iter()
                .any(|(k, _)| k == "RAY_gcs_server_port_wait_time_s"),
            "a throwaway head's GCS gets Ray's own time to publish its port"
        );
        let remote = bridge_env(&BridgeConfig::default().address("10.0.0.1:6379"), &none)
            .expect("no token needed");
        assert!(!remote.iter().any(|(k, _)| k == AUTH_TOKEN_VAR));
        assert!(
            remote
                .iter()
                .any(|(k, v)| k == "RAY_gcs_server_port_wait_time_s" && v == "1")
        );
    }

    #[test]
    fn a_found_token_turns_token_mode_on_and_user_env_comes_last() {
        let found = AuthLookup {
            mode: None,
            token: Some(crate::auth::TokenSource::EnvVar),
            looked_at: Vec::new(),
        };
        let config = BridgeConfig::default()
            .address("h:1")
            .env("RAY_AUTH_MODE", "disabled");
        let env = bridge_env(&config, &found).expect("no token needed");
        let modes: Vec<&str> = env
            .iter()
            .filter(|(k, _)| k == AUTH_MODE_VAR)
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(
            modes,
            ["token", "disabled"],
            "the user's value is applied last"
        );
    }

    #[test]
    fn no_randomness_is_an_error_not_a_guessable_token() {
        let err = token_from(|_| Err(getrandom::Error::UNSUPPORTED)).expect_err("no randomness");
        assert!(matches!(err, BridgeError::Randomness { .. }), "{err}");
        assert!(err.to_string().contains("no randomness"), "{err}");
        let token = token_from(|bytes| {
            bytes.fill(0xab);
            Ok(())
        })
        .expect("a token");
        assert_eq!(token, "ab".repeat(32));
        let (a, b) = (random_token().expect("one"), random_token().expect("two"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
    }

    #[tokio::test]
    async fn nothing_listening_is_reported_unreachable_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let started = std::time::Instant::now();
        let err = probe(&format!("127.0.0.1:{port}"))
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, BridgeError::Unreachable { .. }), "{err}");
        assert!(started.elapsed() < PROBE_TIMEOUT + Duration::from_secs(1));
    }

    #[test]
    fn the_script_is_written_private() {
        let (dir, path) = write_script().expect("written");
        let file_mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        let dir_mode = std::fs::metadata(dir.path())
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!((file_mode, dir_mode), (0o600, 0o700));
        assert_eq!(std::fs::read_to_string(&path).expect("read"), BRIDGE_SCRIPT);
        let kept = dir.path().to_path_buf();
        drop(dir);
        assert!(!kept.exists(), "the directory is removed on drop");
    }
}
