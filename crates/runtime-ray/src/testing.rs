//! Test support (the `testing` feature): a real two-node Ray cluster on this machine, for
//! end-to-end tests of this crate, of the `trainyard` command line, and of whatever a user
//! builds on a Ray runtime.
//!
//! [`RayCluster::start`] runs `ray start --head --block` and a second `ray start --block
//! --address=…` (each in its own process group, with a private `--temp-dir`), waits for the
//! GCS port, and on drop stops exactly those processes: SIGTERM to each `--block` process, then
//! SIGKILL to its process group after a bound ([`process_group::kill`], while the unreaped
//! `--block` process still holds the group's id). It never runs `ray stop`, which would stop
//! every cluster of this user. The interpreter comes from `TRAINYARD_RAY_PYTHON`
//! (`export TRAINYARD_RAY_PYTHON="$(scripts/ray-env.sh)"`).
//!
//! Each node is a host with an address of its own: the head runs in the network namespace
//! `ty-r1`, the worker node in `ty-r2`, the nodes [`RayCluster::add_node`] joins in `ty-r3`,
//! `ty-r4`, … (`scripts/netns-env.sh use`, which makes what is missing; each node's
//! `--node-ip-address` is its namespace's address on `ty0`), while the test and its driver stay
//! on this machine's own stack. Only the network namespace is entered (`nsenter --net`):
//! processes, files and cgroups are this machine's. A Ray driver runs on a node of its cluster
//! (Ray tells the other nodes to reach it at that node's address), so a driver's bridge runs
//! in the head's namespace ([`RayCluster::driver_python`]). `TRAINYARD_NETNS_SKIP=REASON`
//! keeps every node on this machine's own stack, as does a machine where namespaces cannot be
//! made, except under `CI=true` (the script's rule, shared with the Slurm test cluster).
//!
//! The tests that need it are ignored by default, so that a run without Ray reads as such:
//! `#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]`.
//! One that runs was asked for (`--run-ignored`, `--ignored`; `cargo xtask ci` does when the
//! variable is set), and [`python`] returns an error for it to fail with when the interpreter
//! is missing or has no `ray`.
#![allow(
    clippy::disallowed_methods,
    reason = "helpers for tests: they make scratch files of their own"
)]

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use trainyard_sys::{process_group, procfs};

use crate::{Bridge, BridgeConfig, BridgeError, RayNodeInfo};

/// Head node memory (the `memory` resource), in bytes.
pub const HEAD_MEMORY: u64 = 4_000_000_000;
/// Worker node memory, in bytes.
pub const WORKER_MEMORY: u64 = 2_000_000_000;
/// Each node's object store, in bytes (Ray's minimum is about 75 MB).
const OBJECT_STORE: u64 = 100_000_000;
/// How long a `--block` process gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the head's GCS port may take to open.
const PORT_WITHIN: Duration = Duration::from_secs(60);
/// How long the nodes may take to be alive.
const NODES_WITHIN: Duration = Duration::from_secs(60);

/// The test cluster cannot be found, started or asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RayClusterError {
    /// `TRAINYARD_RAY_PYTHON` is not set.
    #[error(
        "TRAINYARD_RAY_PYTHON is not set; run `export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\"` to test against a real Ray cluster"
    )]
    PythonNotSet,
    /// The interpreter cannot `import ray`.
    #[error("{} (TRAINYARD_RAY_PYTHON) cannot `import ray`; run scripts/ray-env.sh", python.display())]
    NoRay {
        /// The interpreter.
        python: PathBuf,
    },
    /// There is no `ray` command next to the interpreter.
    #[error("no `ray` next to {}", python.display())]
    NoRayCommand {
        /// The interpreter.
        python: PathBuf,
    },
    /// A program cannot be run.
    #[error("cannot run {}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Ray cannot say this machine's node IP.
    #[error("{} cannot compute the node IP ({status}): {stderr}", python.display())]
    NodeIp {
        /// The interpreter.
        python: PathBuf,
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// No token can be made for a cluster with auth.
    #[error("cannot make the cluster's authentication token")]
    Token(#[source] BridgeError),
    /// The cluster's private temp dir cannot be made.
    #[error("cannot create a temp dir under /tmp")]
    TempDir(#[source] std::io::Error),
    /// A node's log file cannot be made.
    #[error("cannot create the log {}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No port can be bound.
    #[error("cannot bind an ephemeral port")]
    Port(#[source] std::io::Error),
    /// The nodes' hosts cannot be had (`scripts/netns-env.sh use`).
    #[error("the Ray test cluster's hosts {hosts}: {why}")]
    Hosts {
        /// The hosts asked for (`r1 r2 …`).
        hosts: String,
        /// Why not.
        why: String,
    },
    /// The driver's interpreter in the head's namespace cannot be written.
    #[error("cannot write {}", path.display())]
    DriverPython {
        /// The wrapper script.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A `ray start` exited before the head's GCS port opened.
    #[error(
        "`ray start` ({role}) exited before the head's GCS port {port} opened; its log:\n{log}"
    )]
    Exited {
        /// `head` or `worker`.
        role: &'static str,
        /// The GCS port.
        port: u16,
        /// Its log.
        log: String,
    },
    /// The head's GCS port did not open in time.
    #[error("the head's GCS port {port} did not open within {} s; its log:\n{log}", waited.as_secs())]
    PortClosed {
        /// The GCS port.
        port: u16,
        /// How long it was waited for.
        waited: Duration,
        /// The head's log.
        log: String,
    },
    /// The bridge cannot list the nodes.
    #[error("cannot list the cluster's nodes")]
    Nodes(#[source] BridgeError),
    /// Fewer nodes than expected are alive in time.
    #[error(
        "{count} nodes not alive within {} s ({alive} are); the worker's log:\n{log}",
        waited.as_secs()
    )]
    NodesNotAlive {
        /// How many were expected.
        count: usize,
        /// How many are.
        alive: usize,
        /// How long they were waited for.
        waited: Duration,
        /// The worker's log.
        log: String,
    },
}

/// Prints a loud skip reason.
pub fn skip(reason: &str) {
    eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("SKIP: {reason}");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
}

/// A port nobody listens on right now, and one this process has not handed out before:
/// the ports of one cluster (its GCS, each node's dashboard agent) are chosen before any
/// is bound, and two binds of port 0 in a row may be given the same port.
///
/// # Errors
/// [`RayClusterError::Port`] when no port can be bound.
pub fn free_port() -> Result<u16, RayClusterError> {
    free_port_in(None)
}

/// [`free_port`] on a host: in the network namespace `netns` (its own ports), or on this
/// machine's own stack when `None`.
fn free_port_in(netns: Option<&Path>) -> Result<u16, RayClusterError> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let port = bound_port(netns).map_err(RayClusterError::Port)?;
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
}

/// The port the kernel gives a bind of port 0, in the network namespace `netns` (entered by
/// a thread of its own, which ends with the bind) or on this machine's own stack.
fn bound_port(netns: Option<&Path>) -> io::Result<u16> {
    let bind = || {
        TcpListener::bind("0.0.0.0:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
    };
    let Some(netns) = netns else {
        return bind();
    };
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let namespace = File::open(netns)?;
                setns(&namespace, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                bind()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the thread that binds a port panicked")))
    })
}

/// Pids of the live (not zombie) processes for which `keep` is true.
fn processes_where(keep: impl Fn(u32) -> bool) -> Vec<u32> {
    procfs::pids()
        .filter(|&pid| keep(pid) && procfs::is_alive(pid, None))
        .collect()
}

/// Pids of the live processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    processes_where(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
    })
}

/// Pids of the live processes in process group `group`.
pub fn processes_in_group(group: u32) -> Vec<u32> {
    processes_where(|pid| {
        procfs::read_stat(pid)
            .ok()
            .flatten()
            .is_some_and(|stat| stat.group == group)
    })
}

/// Polls `check` every 50 ms until it is true or `bound` passes; returns whether it became true.
pub async fn eventually(bound: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if check() {
            return true;
        }
        if start.elapsed() > bound {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The interpreter with `ray`: `$TRAINYARD_RAY_PYTHON`.
///
/// # Errors
/// When it is not set ([`RayClusterError::PythonNotSet`]), or cannot `import ray`
/// ([`RayClusterError::NoRay`]): a test that needs Ray runs only when asked for, and then
/// fails rather than pass without having tested anything.
pub fn python() -> Result<PathBuf, RayClusterError> {
    let python = std::env::var_os("TRAINYARD_RAY_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .ok_or(RayClusterError::PythonNotSet)?;
    let imports = Command::new(&python)
        .args(["-c", "import ray"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if imports {
        Ok(python)
    } else {
        Err(RayClusterError::NoRay { python })
    }
}

/// A two-node Ray cluster owned by one test.
#[derive(Debug)]
pub struct RayCluster {
    /// The interpreter with `ray`, on this machine's own stack (a program for the workers).
    pub python: PathBuf,
    /// The interpreter a driver's bridge runs ([`RayCluster::bridge_config`]; the
    /// `TRAINYARD_RAY_PYTHON` of a `trainyard run` on this cluster): [`RayCluster::python`]
    /// on the head's host (in its network namespace), as a Ray driver runs on a node of its
    /// cluster.
    pub driver_python: PathBuf,
    /// The GCS address, `ip:port`.
    pub address: String,
    /// The token when auth is on.
    pub token: Option<String>,
    /// The private temp dir (every Ray process of this cluster names it on its command line).
    pub temp_dir: PathBuf,
    /// The nodes' hosts: network namespaces of their own, or this machine's own stack.
    hosts: Hosts,
    // Fields drop in order: the joined nodes and the worker node stop first, then the head,
    // then the temp dir goes.
    joined: Vec<Node>,
    worker: Node,
    /// Held to be stopped on drop.
    _head: Node,
    _temp: tempfile::TempDir,
}

impl RayCluster {
    /// Starts the head (2 CPUs, [`HEAD_MEMORY`], `head_res: 1`) and a worker (1 CPU, 1 GPU,
    /// [`WORKER_MEMORY`], `worker_res: 2`), with token auth when `auth`: each on a host of its
    /// own (`ty-r1`, `ty-r2`) unless the cluster is single-stack (see the module).
    ///
    /// # Errors
    /// When there is no interpreter with `ray` ([`python`]) or the cluster cannot start;
    /// whatever had started is stopped.
    pub fn start(auth: bool) -> Result<Self, RayClusterError> {
        let python = python()?;
        let ray = python.with_file_name("ray");
        if !ray.exists() {
            return Err(RayClusterError::NoRayCommand { python });
        }
        // Short: Ray puts unix sockets under it (108-byte limit).
        let temp = tempfile::Builder::new()
            .prefix("tyr")
            .tempdir_in("/tmp")
            .map_err(RayClusterError::TempDir)?;
        let hosts = Hosts::find(&python, &["r1", "r2", "r3", "r4"])?;
        let (head_host, worker_host) = (hosts.node(0)?, hosts.node(1)?);
        let port = free_port_in(head_host.netns.as_deref())?;
        let address = format!("{}:{port}", head_host.address);
        let driver_python = head_host.driver_python(&python, temp.path())?;
        let start = Start {
            ray: &ray,
            temp_dir: temp.path(),
            token: auth
                .then(crate::bridge::random_token)
                .transpose()
                .map_err(RayClusterError::Token)?,
        };
        let head_args = start.args(
            &head_host,
            &[
                "--head".to_owned(),
                format!("--port={port}"),
                "--num-cpus=2".to_owned(),
                "--num-gpus=0".to_owned(),
                format!("--memory={HEAD_MEMORY}"),
                r#"--resources={"head_res": 1}"#.to_owned(),
                "--include-dashboard=false".to_owned(),
            ],
        )?;
        let worker_args = start.args(
            &worker_host,
            &[
                format!("--address={address}"),
                "--num-cpus=1".to_owned(),
                "--num-gpus=1".to_owned(),
                format!("--memory={WORKER_MEMORY}"),
                r#"--resources={"worker_res": 2}"#.to_owned(),
                "--include-log-monitor=false".to_owned(),
            ],
        )?;
        let started = Instant::now();
        let head = start.spawn("head", &head_host, &head_args)?;
        wait_for_port(&head, &head_host.address, port, PORT_WITHIN, temp.path())?;
        let worker = start.spawn("worker", &worker_host, &worker_args)?;
        eprintln!(
            "ray cluster {address} (auth {}; {}) spawned in {:?}",
            if auth { "on" } else { "off" },
            hosts,
            started.elapsed()
        );
        Ok(Self {
            python,
            driver_python,
            address,
            token: start.token,
            temp_dir: temp.path().to_path_buf(),
            hosts,
            joined: Vec::new(),
            worker,
            _head: head,
            _temp: temp,
        })
    }

    /// The log of one `ray start` (`head` or `worker`); empty when it cannot be read.
    pub fn log(&self, role: &str) -> String {
        log(&self.temp_dir, role)
    }

    /// SIGKILLs the worker node's whole process group (its raylet included), as a lost node.
    pub fn kill_worker_node(&mut self) {
        self.worker.kill();
    }

    /// Starts one more node with `cpus` CPUs and [`WORKER_MEMORY`], as a node joining the
    /// cluster (on the next host: `ty-r3`, `ty-r4`, …); its index for
    /// [`RayCluster::kill_joined_node`]. Wait for it with [`RayCluster::wait_for_nodes`].
    ///
    /// # Errors
    /// When its host cannot be had or `ray start` cannot be spawned.
    pub fn add_node(&mut self, cpus: u32) -> Result<usize, RayClusterError> {
        let ray = self.python.with_file_name("ray");
        let start = Start {
            ray: &ray,
            temp_dir: &self.temp_dir,
            token: self.token.clone(),
        };
        let index = self.joined.len();
        let host = self.hosts.node(2 + index)?;
        let args = start.args(
            &host,
            &[
                format!("--address={}", self.address),
                format!("--num-cpus={cpus}"),
                "--num-gpus=0".to_owned(),
                format!("--memory={WORKER_MEMORY}"),
                "--include-log-monitor=false".to_owned(),
            ],
        )?;
        self.joined
            .push(start.spawn(&format!("joined-{index}"), &host, &args)?);
        Ok(index)
    }

    /// SIGKILLs the process group of the node [`RayCluster::add_node`] started as `index`
    /// (its raylet included), as a lost node.
    pub fn kill_joined_node(&mut self, index: usize) {
        if let Some(node) = self.joined.get_mut(index) {
            node.kill();
        }
    }

    /// A bridge configuration for this cluster, with its auth settings.
    pub fn bridge_config(&self) -> BridgeConfig {
        let config = BridgeConfig::default()
            .python(&self.driver_python)
            .address(&self.address)
            .start_timeout(Duration::from_secs(60))
            .request_timeout(Duration::from_secs(60));
        match &self.token {
            Some(token) => config.env("RAY_AUTH_TOKEN", token),
            None => config.env("RAY_AUTH_MODE", "disabled"),
        }
    }

    /// Waits (bounded) until `count` nodes are alive; returns the node list.
    ///
    /// # Errors
    /// When the bridge cannot list the nodes, or fewer than `count` are alive within 60 s.
    pub async fn wait_for_nodes(
        &self,
        bridge: &Bridge,
        count: usize,
    ) -> Result<Vec<RayNodeInfo>, RayClusterError> {
        let start = Instant::now();
        loop {
            let nodes = bridge.nodes().await.map_err(RayClusterError::Nodes)?;
            let alive = nodes.iter().filter(|n| n.alive).count();
            if alive >= count {
                return Ok(nodes);
            }
            if start.elapsed() >= NODES_WITHIN {
                return Err(RayClusterError::NodesNotAlive {
                    count,
                    alive,
                    waited: NODES_WITHIN,
                    log: self.log("worker"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The script that makes the test hosts and says whether a cluster uses them.
fn netns_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns-env.sh")
}

/// Where the nodes of one cluster run.
#[derive(Debug)]
enum Hosts {
    /// Node `i` on host `r{i+1}`, each a network namespace of its own, as the layout file
    /// says.
    Namespaces(PathBuf),
    /// Every node on this machine's own stack, at this address.
    SingleStack(String),
}

/// The host of one node.
#[derive(Debug)]
struct Host {
    /// Its network namespace (`/run/netns/ty-rK`); `None` on this machine's own stack.
    netns: Option<PathBuf>,
    /// The node's address there.
    address: String,
}

impl Hosts {
    /// The hosts `names` (`scripts/netns-env.sh use`, which says on stderr why not when it
    /// keeps the cluster single-stack), or this machine's node IP as Ray computes it.
    fn find(python: &Path, names: &[&str]) -> Result<Self, RayClusterError> {
        match Self::made(names)? {
            Some(layout) => Ok(Self::Namespaces(layout)),
            None => node_ip(python).map(Self::SingleStack),
        }
    }

    /// Makes the hosts `names` where they are missing: the layout file when the cluster uses
    /// them (the script's last line), `None` when it is single-stack.
    fn made(names: &[&str]) -> Result<Option<PathBuf>, RayClusterError> {
        let script = netns_script();
        let failed = |why: String| RayClusterError::Hosts {
            hosts: names.join(" "),
            why,
        };
        let out = Command::new("bash")
            .arg(&script)
            .arg("use")
            .args(names)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| failed(format!("cannot run {}: {e}", script.display())))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match out.status.code() {
            Some(0) => stdout
                .lines()
                .last()
                .map(|layout| Some(PathBuf::from(layout.trim())))
                .ok_or_else(|| failed(format!("{} use printed no layout", script.display()))),
            Some(3) => Ok(None),
            _ => Err(failed(format!(
                "{} use failed ({}; see its output above)",
                script.display(),
                out.status
            ))),
        }
    }

    /// The host of node `index` (0 the head, 1 the worker node, then the joined ones), made
    /// when missing.
    fn node(&self, index: usize) -> Result<Host, RayClusterError> {
        match self {
            Self::SingleStack(address) => Ok(Host {
                netns: None,
                address: address.clone(),
            }),
            Self::Namespaces(layout) => Host::namespaced(layout, &format!("r{}", index + 1)),
        }
    }
}

impl std::fmt::Display for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Namespaces(_) => f.write_str("each node on a host of its own: ty-r1, ty-r2, …"),
            Self::SingleStack(address) => write!(f, "single-stack at {address}"),
        }
    }
}

impl Host {
    /// The test host `name` (`r3`) as the file `layout` says (one line a host: `NAME
    /// NAMESPACE ADDRESS HOST_LINK`), made when missing.
    fn namespaced(layout: &Path, name: &str) -> Result<Self, RayClusterError> {
        let missing = |why: String| RayClusterError::Hosts {
            hosts: name.to_owned(),
            why,
        };
        let find = |layout: &Path| {
            std::fs::read_to_string(layout)
                .unwrap_or_default()
                .lines()
                .find_map(
                    |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                        [host, namespace, address, _] if host == name => Some(Self {
                            netns: Some(Path::new("/run/netns").join(namespace)),
                            address: address.to_owned(),
                        }),
                        _ => None,
                    },
                )
        };
        if let Some(host) = find(layout) {
            return Ok(host);
        }
        let layout = Hosts::made(&[name])?.ok_or_else(|| {
            missing("its namespace cannot be made, while the cluster's others were".to_owned())
        })?;
        find(&layout).ok_or_else(|| missing(format!("not in {}", layout.display())))
    }

    /// `python` on this host, for a driver: itself on this machine's own stack, else a
    /// script in `dir` that runs it in the host's network namespace.
    fn driver_python(&self, python: &Path, dir: &Path) -> Result<PathBuf, RayClusterError> {
        let Some(netns) = &self.netns else {
            return Ok(python.to_path_buf());
        };
        let path = dir.join("driver-python");
        let quote =
            |path: &Path| format!("'{}'", path.display().to_string().replace('\'', r"'\''"));
        let script = format!(
            "#!/bin/sh\n# A Ray driver runs on a node of its cluster: this one runs on the head's host.\nexec nsenter --net={} -- {} \"$@\"\n",
            quote(netns),
            quote(python)
        );
        let failed = |source| RayClusterError::DriverPython {
            path: path.clone(),
            source,
        };
        std::fs::write(&path, script).map_err(failed)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
        Ok(path)
    }

    /// `program` on this host: entered into its network namespace only (`nsenter --net`).
    fn command(&self, program: &Path) -> Command {
        match &self.netns {
            None => Command::new(program),
            Some(netns) => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net={}", netns.display()))
                    .arg("--")
                    .arg(program);
                command
            }
        }
    }
}

/// What every `ray start` of one cluster shares.
struct Start<'a> {
    ray: &'a Path,
    temp_dir: &'a Path,
    token: Option<String>,
}

impl Start<'_> {
    /// The arguments of a `--block` start on `host` with `extra`.
    fn args(&self, host: &Host, extra: &[String]) -> Result<Vec<String>, RayClusterError> {
        let mut args = vec![
            "start".to_owned(),
            "--block".to_owned(),
            "--disable-usage-stats".to_owned(),
            format!("--temp-dir={}", self.temp_dir.display()),
            format!("--node-ip-address={}", host.address),
            format!("--object-store-memory={OBJECT_STORE}"),
            format!(
                "--dashboard-agent-listen-port={}",
                free_port_in(host.netns.as_deref())?
            ),
        ];
        args.extend_from_slice(extra);
        Ok(args)
    }

    /// Runs `ray` with `args` on `host` in a process group of its own (`nsenter` executes
    /// `ray` in place: the group's leader is `ray start`), its output in `<role>.log`.
    fn spawn(&self, role: &str, host: &Host, args: &[String]) -> Result<Node, RayClusterError> {
        let path = self.temp_dir.join(format!("{role}.log"));
        let create = |source| RayClusterError::Log {
            path: path.clone(),
            source,
        };
        let log = File::create(&path).map_err(create)?;
        let mut command = host.command(self.ray);
        command
            .args(args)
            .env_remove("RAY_AUTH_TOKEN_PATH")
            .env(
                "RAY_AUTH_MODE",
                if self.token.is_some() {
                    "token"
                } else {
                    "disabled"
                },
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(create)?)
            .stderr(log);
        match &self.token {
            Some(token) => command.env("RAY_AUTH_TOKEN", token),
            None => command.env_remove("RAY_AUTH_TOKEN"),
        };
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command
            .spawn()
            .map(|child| Node(Some(child)))
            .map_err(|source| RayClusterError::Spawn {
                program: self.ray.to_path_buf(),
                source,
            })
    }
}

/// One `ray start --block` process, the leader of its own process group; stopped with its
/// group on drop.
#[derive(Debug)]
struct Node(Option<Child>);

impl Node {
    /// The pid of the `--block` process, while it is not reaped.
    fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }

    /// SIGTERM to the `--block` process; SIGKILL to its process group once it has stopped, or
    /// after [`STOP_GRACE`]; then reaps it.
    fn stop(&mut self) {
        let Some(pid) = self.pid() else {
            return;
        };
        if let Ok(raw) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
        }
        let start = Instant::now();
        // Not reaped: an exited leader stays a zombie, not alive, and keeps its group's id.
        while procfs::is_alive(pid, None) && start.elapsed() < STOP_GRACE {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }

    /// SIGKILLs the process group (the `--block` process too, if it still runs) and reaps
    /// the `--block` process.
    fn kill(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        // Before the reap: the leader, even a zombie, still names the group.
        process_group::kill(child.id());
        let _ = child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The log of one `ray start` in `temp_dir`; empty when it cannot be read.
fn log(temp_dir: &Path, role: &str) -> String {
    std::fs::read_to_string(temp_dir.join(format!("{role}.log"))).unwrap_or_default()
}

/// Waits (bounded) until the head's GCS port accepts connections at its `address`.
fn wait_for_port(
    head: &Node,
    address: &str,
    port: u16,
    bound: Duration,
    temp_dir: &Path,
) -> Result<(), RayClusterError> {
    let start = Instant::now();
    while TcpStream::connect((address, port)).is_err() {
        if !head.pid().is_some_and(|pid| procfs::is_alive(pid, None)) {
            return Err(RayClusterError::Exited {
                role: "head",
                port,
                log: log(temp_dir, "head"),
            });
        }
        if start.elapsed() >= bound {
            return Err(RayClusterError::PortClosed {
                port,
                waited: bound,
                log: log(temp_dir, "head"),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// This machine's node IP as Ray computes it.
fn node_ip(python: &Path) -> Result<String, RayClusterError> {
    let out = Command::new(python)
        .args([
            "-c",
            "from ray._private.services import get_node_ip_address; print(get_node_ip_address())",
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| RayClusterError::Spawn {
            program: python.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        return Err(RayClusterError::NodeIp {
            python: python.to_path_buf(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
