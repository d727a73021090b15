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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use trainyard_config::PlacementStrategy;
use trainyard_resources::{ActorOptions, Resources};

use crate::auth::{AUTH_MODE_VAR, AUTH_TOKEN_VAR, AuthLookup, file_has_token};
use crate::error::{BridgeError, StderrTail};
use crate::protocol::{
    ActorEnded, ClusterView, CreatePgReply, Empty, Event, GroupReadiness, GroupStatus, Holdings,
    Incoming, NodeInfo, NodesReply, Op, Outcome, PlacementGroupId, RayFailure, ReadyInfo, Request,
    SignalReply, Started,
};

/// The bridge script, shipped inside the crate.
pub const BRIDGE_SCRIPT: &str = include_str!("bridge.py");

/// The interpreter variable: the Python that has `ray` installed.
pub const PYTHON_VAR: &str = "TRAINYARD_RAY_PYTHON";

/// How many stderr lines are kept for error messages.
const STDERR_LINES: usize = 40;
/// How long the GCS port may take to accept a TCP connection before start-up gives up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Extra time a call waits beyond the bound it gives the bridge for the same work.
const SLACK: Duration = Duration::from_secs(5);

/// How to start the bridge.
#[derive(Debug, Clone, PartialEq)]
pub struct BridgeConfig {
    /// The interpreter: `$TRAINYARD_RAY_PYTHON`, else `python3`.
    pub python: PathBuf,
    /// The cluster's GCS address (`host:port`); `None` starts a throwaway local head.
    pub address: Option<String>,
    /// The Ray namespace of the bridge's job (named actors live in it).
    pub namespace: String,
    /// Extra environment for the bridge, applied last (also what the token lookup sees first).
    pub env: Vec<(String, String)>,
    /// How long `ray.init` may take.
    pub start_timeout: Duration,
    /// How long an ordinary call may take.
    pub request_timeout: Duration,
    /// How long an actor whose node stopped answering (`ActorUnavailableError`) may stay
    /// unreported: Ray declares a lost node dead after about 15 s, and the end then comes as
    /// `node_died`; past this bound it comes as `unavailable`.
    pub unavailable_grace: Duration,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            python: std::env::var_os(PYTHON_VAR)
                .filter(|p| !p.is_empty())
                .map_or_else(|| PathBuf::from("python3"), PathBuf::from),
            address: None,
            namespace: "trainyard".to_owned(),
            env: Vec::new(),
            start_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(30),
            unavailable_grace: Duration::from_secs(30),
        }
    }
}

impl BridgeConfig {
    /// Sets the interpreter.
    #[must_use]
    pub fn python(mut self, python: impl Into<PathBuf>) -> Self {
        self.python = python.into();
        self
    }

    /// Sets the cluster address.
    #[must_use]
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// Sets the namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Adds an environment variable for the bridge.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Sets the start-up bound.
    #[must_use]
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Sets the per-call bound.
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the grace for unavailable actors.
    #[must_use]
    pub fn unavailable_grace(mut self, grace: Duration) -> Self {
        self.unavailable_grace = grace;
        self
    }

    /// A variable as the bridge will see it: `env` first, then this process's environment.
    fn var(&self, name: &str) -> Option<String> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    }
}

/// One actor to start: its Ray options, its placement and the agent it runs.
#[derive(Clone, PartialEq)]
pub struct ActorLaunch {
    /// The actor's name (unique in the namespace; include the run's name).
    pub name: String,
    /// The placement group and bundle index it is pinned to.
    pub placement: Option<(PlacementGroupId, u32)>,
    /// Its Ray options, passed exactly (`memory` as an option, never a custom resource).
    pub options: ActorOptions,
    /// The agent program, as a path valid on the actor's node.
    pub program: String,
    /// The agent's arguments.
    pub args: Vec<String>,
    /// Extra environment for the agent.
    pub env: BTreeMap<String, String>,
    /// The agent's configuration template (a JSON object); the actor fills in `parent`,
    /// `node_id`, `node_ip` and `accelerator_ids`.
    pub config: serde_json::Value,
    /// The run token, written to the agent's stdin.
    pub token: String,
    /// The agent's working directory, used when it exists on the actor's node (the
    /// driver's, for nodes that share its file system); else the actor's own.
    pub cwd: Option<String>,
}

impl fmt::Debug for ActorLaunch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorLaunch")
            .field("name", &self.name)
            .field("placement", &self.placement)
            .field("options", &self.options)
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env)
            .field("config", &self.config)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// What start-up waits for.
type StartSignal = Result<ReadyInfo, RayFailure>;

#[derive(Default)]
struct State {
    pending: HashMap<u64, oneshot::Sender<Outcome>>,
    ends: HashMap<String, oneshot::Sender<ActorEnded>>,
    start: Option<oneshot::Sender<StartSignal>>,
    lost: Option<StderrTail>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    stderr: Mutex<VecDeque<String>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind: still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn tail(&self) -> StderrTail {
        let lines = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        StderrTail(lines.iter().cloned().collect())
    }

    /// Fails everything that waits on the bridge; later calls see `lost`.
    fn mark_lost(&self) {
        let tail = self.tail();
        let mut state = self.state();
        if state.lost.is_some() {
            return;
        }
        state.lost = Some(tail.clone());
        state.pending.clear();
        state.start = None;
        let message = format!("the Ray bridge process was lost: {tail}");
        for (name, tx) in state.ends.drain() {
            let _ = tx.send(ActorEnded::bridge_lost(name, message.clone()));
        }
    }

    fn dispatch(&self, incoming: Incoming) {
        match incoming {
            Incoming::Reply(reply) => {
                if let Some(tx) = self.state().pending.remove(&reply.id) {
                    let _ = tx.send(reply.outcome);
                } else {
                    tracing::debug!(id = reply.id, "reply to a call that gave up");
                }
            }
            Incoming::Event(Event::Ready(info)) => {
                if let Some(tx) = self.state().start.take() {
                    let _ = tx.send(Ok(info));
                }
            }
            Incoming::Event(Event::Failed(failure)) => {
                if let Some(tx) = self.state().start.take() {
                    let _ = tx.send(Err(failure));
                }
            }
            Incoming::Event(Event::ActorEnded(ended)) => {
                let tx = self.state().ends.remove(&ended.name);
                match tx {
                    Some(tx) => {
                        let _ = tx.send(ended);
                    }
                    None => tracing::warn!(actor = %ended.name, "end of an actor nobody waits for"),
                }
            }
            Incoming::Event(Event::ProtocolError { message }) => {
                tracing::error!(%message, "the Ray bridge rejected a request line");
            }
        }
    }
}

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

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("lost", &self.state().lost.is_some())
            .finish_non_exhaustive()
    }
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

/// SIGKILLs the bridge's process group: the bridge, if it still runs, and what it started
/// (a throwaway head). Called only before the bridge is reaped or right as it exits: a group
/// id is not handed out again while any member lives, and the bridge's own pid is at most
/// just freed.
fn sweep(pid: Option<u32>) {
    if let Some(pgid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Checks that something accepts TCP connections at `address` (`host:port`, port 6379 when
/// absent) within [`PROBE_TIMEOUT`].
async fn probe(address: &str) -> Result<(), BridgeError> {
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
fn write_script() -> Result<(tempfile::TempDir, PathBuf), BridgeError> {
    let dir = tempfile::Builder::new()
        .prefix("trainyard-ray-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(|source| BridgeError::Script {
            path: std::env::temp_dir(),
            source,
        })?;
    let path = dir.path().join("trainyard_bridge.py");
    let script_error = |source| BridgeError::Script {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(script_error)?;
    file.write_all(BRIDGE_SCRIPT.as_bytes())
        .map_err(script_error)?;
    Ok((dir, path))
}

/// A random token for a throwaway head, so that `ray.init()` does not write
/// `$HOME/.ray/auth_token` (which would silently turn auth on for the user's later clusters).
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    if getrandom::fill(&mut bytes).is_err() {
        // No OS randomness: fall back to something unique per process and moment; the token
        // only guards a head that lives as long as this bridge.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes[..16].copy_from_slice(&nanos.to_le_bytes());
        bytes[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    }
    hex::encode(bytes)
}

/// The environment the bridge gets, besides this process's.
fn bridge_env(config: &BridgeConfig, auth: &AuthLookup) -> Vec<(String, String)> {
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
    // A wrong token otherwise costs 20 retries a second apart; 1 s makes it fail in ~1.5 s.
    if config.var("RAY_gcs_server_port_wait_time_s").is_none() {
        env.push(("RAY_gcs_server_port_wait_time_s".to_owned(), "1".to_owned()));
    }
    if let Some(mode) = auth.mode_to_set() {
        env.push((AUTH_MODE_VAR.to_owned(), mode.to_owned()));
    }
    if config.address.is_none() && auth.token.is_none() && auth.mode.is_none() {
        env.push((AUTH_TOKEN_VAR.to_owned(), random_token()));
    }
    env.extend(config.env.iter().cloned());
    env
}

/// Reads the bridge's stderr into the ring and `tracing`.
async fn pump_stderr(shared: Arc<Shared>, stderr: tokio::process::ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(target: "trainyard_runtime_ray::bridge::stderr", "{line}");
        let mut ring = shared.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() == STDERR_LINES {
            ring.pop_front();
        }
        ring.push_back(line);
    }
}

/// Reads the protocol stream until it ends, then marks the bridge lost.
async fn read_protocol(
    shared: Arc<Shared>,
    stdout: ChildStdout,
    stderr: JoinHandle<()>,
    group: Option<u32>,
) {
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => match serde_json::from_str::<Incoming>(&line) {
                Ok(incoming) => shared.dispatch(incoming),
                Err(err) => {
                    tracing::warn!(%line, error = %err, "unreadable line from the Ray bridge")
                }
            },
            Ok(None) => break,
            Err(err) => {
                tracing::warn!(error = %err, "reading the Ray bridge failed");
                break;
            }
        }
    }
    // The protocol stream closes only when the bridge exits (no child inherits it): stop
    // what it leaves behind, which also closes their copies of its stderr.
    sweep(group);
    let _ = tokio::time::timeout(Duration::from_secs(1), stderr).await;
    shared.mark_lost();
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
    /// [`BridgeError::Timeout`] and the errors of writing and spawning the script.
    pub async fn start(config: BridgeConfig) -> Result<(Self, ReadyInfo), BridgeError> {
        if let Some(address) = config.address.as_deref().filter(|a| *a != "auto") {
            probe(address).await?;
        }
        let auth = AuthLookup::find(|name| config.var(name), file_has_token);
        let (dir, script) = write_script()?;
        let mut command = Command::new(&config.python);
        command
            .arg("-u")
            .arg(&script)
            .envs(bridge_env(&config, &auth))
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
        let (start_tx, start_rx) = oneshot::channel();
        shared.state().start = Some(start_tx);
        // All three pipes were requested above, so they are present.
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("stdin, stdout and stderr are piped");
        };
        let stderr_task = tokio::spawn(pump_stderr(Arc::clone(&shared), stderr));
        let reader = tokio::spawn(read_protocol(Arc::clone(&shared), stdout, stderr_task, pid));
        let bridge = Self {
            shared,
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            child: tokio::sync::Mutex::new(Some(child)),
            pid,
            next_id: AtomicU64::new(1),
            request_timeout: config.request_timeout,
            reader,
            _script: dir,
        };
        let address = config
            .address
            .clone()
            .unwrap_or_else(|| "a throwaway local head".to_owned());
        match tokio::time::timeout(config.start_timeout, start_rx).await {
            Ok(Ok(Ok(ready))) => {
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

    /// Waits up to `grace` for the process to exit, then kills it; reaps it either way and
    /// returns its last stderr lines.
    async fn reap(&self, grace: Duration) -> StderrTail {
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
            while self.shared.state().lost.is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        self.shared.tail()
    }

    fn lost_error(&self) -> BridgeError {
        let stderr = self
            .shared
            .state()
            .lost
            .clone()
            .unwrap_or_else(|| self.shared.tail());
        BridgeError::Lost { stderr }
    }

    /// Sends one request and waits for its reply for at most `timeout`.
    async fn call<T: DeserializeOwned>(
        &self,
        op: Op<'_>,
        timeout: Duration,
    ) -> Result<T, BridgeError> {
        let name = op.name();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = serde_json::to_string(&Request { id, op })
            .map_err(|source| BridgeError::Protocol { op: name, source })?;
        line.push('\n');
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.state();
            if state.lost.is_some() {
                drop(state);
                return Err(self.lost_error());
            }
            state.pending.insert(id, tx);
        }
        let written = {
            let mut stdin = self.stdin.lock().await;
            match stdin.as_mut() {
                Some(stdin) => stdin.write_all(line.as_bytes()).await.is_ok(),
                None => false,
            }
        };
        if !written {
            self.shared.state().pending.remove(&id);
            return Err(self.lost_error());
        }
        let outcome = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_dropped)) => return Err(self.lost_error()),
            Err(_elapsed) => {
                self.shared.state().pending.remove(&id);
                return Err(BridgeError::Timeout {
                    op: name,
                    after: timeout,
                });
            }
        };
        match outcome {
            Outcome::Ok(value) => serde_json::from_value(value)
                .map_err(|source| BridgeError::Protocol { op: name, source }),
            Outcome::Error(failure) => Err(BridgeError::Ray {
                op: name,
                kind: failure.kind,
                message: failure.message,
            }),
        }
    }

    /// Every node Ray knows, dead ones included (`alive == false`).
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, BridgeError> {
        let reply: NodesReply = self.call(Op::Nodes, self.request_timeout).await?;
        Ok(reply.nodes)
    }

    /// Creates a placement group (asynchronously in Ray: wait for it with
    /// [`Bridge::wait_placement_group`]). Amounts must already be validated: Ray accepts
    /// negative ones.
    ///
    /// # Errors
    /// [`BridgeError::Ray`] with kind `invalid` for bundles Ray rejects.
    pub async fn create_placement_group(
        &self,
        name: &str,
        bundles: &[Resources],
        strategy: PlacementStrategy,
    ) -> Result<PlacementGroupId, BridgeError> {
        let op = Op::CreatePg {
            name,
            bundles,
            strategy: strategy.as_str(),
        };
        let reply: CreatePgReply = self.call(op, self.request_timeout).await?;
        Ok(reply.pg)
    }

    /// A group's state and where its bundles are.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn placement_group_state(
        &self,
        pg: &PlacementGroupId,
    ) -> Result<GroupStatus, BridgeError> {
        self.call(Op::PgState { pg }, self.request_timeout).await
    }

    /// Waits up to `timeout` for every bundle of the group to be placed.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails; not being ready in time is `ready: false`.
    pub async fn wait_placement_group(
        &self,
        pg: &PlacementGroupId,
        timeout: Duration,
    ) -> Result<GroupReadiness, BridgeError> {
        let op = Op::WaitPg {
            pg,
            timeout_s: timeout.as_secs_f64(),
        };
        self.call(op, timeout + self.request_timeout).await
    }

    /// Removes a group; Ray kills the actors in it.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn remove_placement_group(&self, pg: &PlacementGroupId) -> Result<(), BridgeError> {
        let _: Empty = self.call(Op::RemovePg { pg }, self.request_timeout).await?;
        Ok(())
    }

    /// Creates the actor, starts its agent, and returns what the actor reported together with
    /// a receiver that resolves once, when the agent exits or the actor dies.
    ///
    /// # Errors
    /// [`BridgeError::Ray`] (`invalid` options, `name_taken`, `actor_died`, `timeout` when the
    /// actor could not be scheduled within the request timeout) and the bridge's own failures.
    pub async fn spawn_actor(
        &self,
        launch: &ActorLaunch,
    ) -> Result<(Started, oneshot::Receiver<ActorEnded>), BridgeError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.state();
            if state.lost.is_some() {
                drop(state);
                return Err(self.lost_error());
            }
            if state.ends.contains_key(&launch.name) {
                return Err(BridgeError::Ray {
                    op: "spawn",
                    kind: "name_taken".to_owned(),
                    message: format!("this bridge already runs an actor named {}", launch.name),
                });
            }
            // Registered before the request, so an end right after the reply is not missed.
            state.ends.insert(launch.name.clone(), tx);
        }
        let op = Op::Spawn {
            name: &launch.name,
            pg: launch.placement.as_ref().map(|(pg, _)| pg),
            bundle: launch.placement.as_ref().map_or(0, |(_, i)| *i),
            options: &launch.options,
            program: &launch.program,
            args: &launch.args,
            env: &launch.env,
            config: &launch.config,
            token: &launch.token,
            cwd: launch.cwd.as_deref(),
            timeout_s: self.request_timeout.as_secs_f64(),
        };
        match self.call(op, self.request_timeout + SLACK).await {
            Ok(started) => Ok((started, rx)),
            Err(err) => {
                self.shared.state().ends.remove(&launch.name);
                Err(err)
            }
        }
    }

    /// Has the actor send `signal` to its agent; with `SIGKILL` and a `task_pgid`, that
    /// process group is killed first. Returns whether the agent was still running.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails (`actor_died` when the actor is gone).
    pub async fn signal_actor(
        &self,
        name: &str,
        signal: Signal,
        task_pgid: Option<i32>,
    ) -> Result<bool, BridgeError> {
        let op = Op::Signal {
            name,
            signal: signal as i32,
            task_pgid,
        };
        let reply: SignalReply = self.call(op, self.request_timeout).await?;
        Ok(reply.sent)
    }

    /// `ray.kill` on the actor (its agent gets `SIGKILL`, no `SIGTERM` first).
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn kill_actor(&self, name: &str) -> Result<(), BridgeError> {
        let _: Empty = self.call(Op::Kill { name }, self.request_timeout).await?;
        Ok(())
    }

    /// What the bridge holds: its actors with their state, and its groups.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn actors(&self) -> Result<Holdings, BridgeError> {
        self.call(Op::Actors, self.request_timeout).await
    }

    /// Every actor and group in the cluster, as the GCS sees them (what a leftover check needs).
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn cluster(&self) -> Result<ClusterView, BridgeError> {
        self.call(Op::Cluster, self.request_timeout).await
    }

    /// Asks the bridge to kill its actors, remove its groups and exit; waits up to `grace`
    /// for that, then kills the process. The process is reaped either way.
    ///
    /// # Errors
    /// The shutdown call's error, if it failed (the process is still stopped).
    pub async fn shutdown(&self, grace: Duration) -> Result<(), BridgeError> {
        let asked = self.call::<Empty>(Op::Shutdown, grace).await;
        self.reap(grace).await;
        match asked {
            Ok(_) | Err(BridgeError::Lost { .. }) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throwaway_head_gets_a_random_token_and_an_explicit_address_does_not() {
        let none = AuthLookup {
            mode: None,
            token: None,
            looked_at: Vec::new(),
        };
        let local = bridge_env(&BridgeConfig::default(), &none);
        let token = local
            .iter()
            .find(|(k, _)| k == AUTH_TOKEN_VAR)
            .map(|(_, v)| v.clone())
            .expect("a throwaway head gets a token");
        assert_eq!(token.len(), 64);
        let remote = bridge_env(&BridgeConfig::default().address("10.0.0.1:6379"), &none);
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
        let env = bridge_env(&config, &found);
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
