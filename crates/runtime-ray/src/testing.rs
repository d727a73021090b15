//! A real two-node Ray cluster on this machine, for end-to-end tests: of this crate, of
//! the `trainyard` command line, and of whatever a user builds on a Ray runtime.
//!
//! `RayCluster::start` runs `ray start --head --block` and a second `ray start --block
//! --address=…` (each in its own process group, with a private `--temp-dir`), waits for the
//! GCS port, and on drop stops exactly those processes: SIGTERM to each `--block` process, then
//! SIGKILL to its process group after a bound. It never runs `ray stop`, which would stop every
//! cluster of this user. The interpreter comes from `TRAINYARD_RAY_PYTHON`
//! (`export TRAINYARD_RAY_PYTHON="$(scripts/ray-env.sh)"`).
//!
//! The tests that need it are ignored by default, so that a run without Ray reads as such:
//! `#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]`.
//! One that runs was asked for (`--run-ignored`, `--ignored`; `cargo xtask ci` does when the
//! variable is set), and [`python`] fails it when the interpreter is missing or has no `ray`.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Bridge, BridgeConfig, RayNodeInfo};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Head node memory (the `memory` resource), in bytes.
pub const HEAD_MEMORY: u64 = 4_000_000_000;
/// Worker node memory, in bytes.
pub const WORKER_MEMORY: u64 = 2_000_000_000;
/// Each node's object store, in bytes (Ray's minimum is about 75 MB).
const OBJECT_STORE: u64 = 100_000_000;
/// How long a `--block` process gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Prints a loud skip reason.
pub fn skip(reason: &str) {
    eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("SKIP: {reason}");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("0.0.0.0:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// Whether a process with this pid still exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Pids of the live (not zombie) processes for which `keep` is true.
fn processes_where(keep: impl Fn(u32) -> bool) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| keep(*pid) && alive(*pid))
        .collect()
}

/// Pids of the processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    processes_where(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
    })
}

/// Pids of the processes in process group `pgid`.
pub fn processes_in_group(pgid: u32) -> Vec<u32> {
    processes_where(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            // After the command's closing parenthesis: state, ppid, pgrp.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<u32>().ok())
                == Some(pgid)
        })
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

/// A random hex token.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .expect("read /dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The interpreter with `ray`: `$TRAINYARD_RAY_PYTHON`.
///
/// # Panics
/// When it is not set, or cannot `import ray`: a test that needs Ray runs only when asked
/// for, and then fails rather than pass without having tested anything.
#[must_use]
pub fn python() -> PathBuf {
    let Some(python) = std::env::var_os("TRAINYARD_RAY_PYTHON").filter(|p| !p.is_empty()) else {
        panic!(
            "TRAINYARD_RAY_PYTHON is not set; run `export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\"` to test against a real Ray cluster"
        );
    };
    let python = PathBuf::from(python);
    let ok = Command::new(&python)
        .args(["-c", "import ray"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} (TRAINYARD_RAY_PYTHON) cannot `import ray`; run scripts/ray-env.sh",
        python.display()
    );
    python
}

/// A two-node Ray cluster owned by one test.
#[derive(Debug)]
pub struct RayCluster {
    /// The interpreter with `ray`.
    pub python: PathBuf,
    /// The GCS address, `ip:port`.
    pub address: String,
    /// The token when auth is on.
    pub token: Option<String>,
    /// The private temp dir (every Ray process of this cluster names it on its command line).
    pub temp_dir: PathBuf,
    /// The `--block` processes, head first.
    blocks: Vec<Child>,
    _temp: tempfile::TempDir,
}

impl RayCluster {
    /// Starts the head (2 CPUs, [`HEAD_MEMORY`], `head_res: 1`) and a worker (1 CPU, 1 GPU,
    /// [`WORKER_MEMORY`], `worker_res: 2`), with token auth when `auth`.
    ///
    /// # Panics
    /// When there is no interpreter with `ray` ([`python`]) or the cluster cannot start.
    #[must_use]
    pub fn start(auth: bool) -> Self {
        let python = python();
        let ray = python.with_file_name("ray");
        assert!(ray.exists(), "no `ray` next to {}", python.display());
        // Short: Ray puts unix sockets under it (108-byte limit).
        let temp = tempfile::Builder::new()
            .prefix("tyr")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let temp_dir = temp.path().to_path_buf();
        let ip = node_ip(&python);
        let port = free_port();
        let address = format!("{ip}:{port}");
        let token = auth.then(random_token);
        let mut cluster = Self {
            python,
            address: address.clone(),
            token,
            temp_dir,
            blocks: Vec::new(),
            _temp: temp,
        };
        let common = |extra: &[String]| {
            let mut args = vec![
                "start".to_owned(),
                "--block".to_owned(),
                "--disable-usage-stats".to_owned(),
                format!("--temp-dir={}", cluster.temp_dir.display()),
                format!("--object-store-memory={OBJECT_STORE}"),
                format!("--dashboard-agent-listen-port={}", free_port()),
            ];
            args.extend_from_slice(extra);
            args
        };
        let head = common(&[
            "--head".to_owned(),
            format!("--port={port}"),
            "--num-cpus=2".to_owned(),
            "--num-gpus=0".to_owned(),
            format!("--memory={HEAD_MEMORY}"),
            r#"--resources={"head_res": 1}"#.to_owned(),
            "--include-dashboard=false".to_owned(),
        ]);
        let worker = common(&[
            format!("--address={address}"),
            "--num-cpus=1".to_owned(),
            "--num-gpus=1".to_owned(),
            format!("--memory={WORKER_MEMORY}"),
            r#"--resources={"worker_res": 2}"#.to_owned(),
            "--include-log-monitor=false".to_owned(),
        ]);
        let started = Instant::now();
        cluster.spawn(&ray, "head", &head);
        cluster.wait_for_port(port, Duration::from_secs(60));
        cluster.spawn(&ray, "worker", &worker);
        eprintln!(
            "ray cluster {address} (auth {}) spawned in {:?}",
            if auth { "on" } else { "off" },
            started.elapsed()
        );
        cluster
    }

    fn spawn(&mut self, ray: &Path, role: &str, args: &[String]) {
        let log = File::create(self.temp_dir.join(format!("{role}.log"))).expect("log file");
        let mut command = Command::new(ray);
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
            .stdout(log.try_clone().expect("log file"))
            .stderr(log);
        match &self.token {
            Some(token) => command.env("RAY_AUTH_TOKEN", token),
            None => command.env_remove("RAY_AUTH_TOKEN"),
        };
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", ray.display()));
        self.blocks.push(child);
    }

    /// The log of one `ray start` (`head` or `worker`).
    pub fn log(&self, role: &str) -> String {
        std::fs::read_to_string(self.temp_dir.join(format!("{role}.log"))).unwrap_or_default()
    }

    fn wait_for_port(&mut self, port: u16, bound: Duration) {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            for child in &mut self.blocks {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("ray start exited ({status}):\n{}", self.log("head"));
                }
            }
            assert!(
                start.elapsed() < bound,
                "the head's GCS port {port} did not open within {bound:?}:\n{}",
                self.log("head")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the worker node's whole process group (its raylet included), as a lost node.
    pub fn kill_worker_node(&mut self) {
        let worker = self.blocks.get_mut(1).expect("a worker node");
        let pid = Pid::from_raw(i32::try_from(worker.id()).expect("pid fits"));
        killpg(pid, Signal::SIGKILL).expect("kill the worker's process group");
        let _ = worker.wait();
    }

    /// A bridge configuration for this cluster, with its auth settings.
    pub fn bridge_config(&self) -> BridgeConfig {
        let config = BridgeConfig::default()
            .python(&self.python)
            .address(&self.address)
            .start_timeout(Duration::from_secs(60))
            .request_timeout(Duration::from_secs(60));
        match &self.token {
            Some(token) => config.env("RAY_AUTH_TOKEN", token),
            None => config.env("RAY_AUTH_MODE", "disabled"),
        }
    }

    /// Waits (bounded) until `count` nodes are alive; returns the node list.
    pub async fn wait_for_nodes(&self, bridge: &Bridge, count: usize) -> Vec<RayNodeInfo> {
        let start = Instant::now();
        loop {
            let nodes = bridge.nodes().await.expect("nodes");
            if nodes.iter().filter(|n| n.alive).count() >= count {
                return nodes;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{count} nodes not alive within 60 s: {nodes:?}\nworker log:\n{}",
                self.log("worker")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for RayCluster {
    fn drop(&mut self) {
        // Worker first, then head.
        for child in self.blocks.iter_mut().rev() {
            let Ok(raw) = i32::try_from(child.id()) else {
                continue;
            };
            let pid = Pid::from_raw(raw);
            let _ = kill(pid, Signal::SIGTERM);
            let start = Instant::now();
            while start.elapsed() < STOP_GRACE {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // Whatever is left of its process group (the leader, if it did not stop).
            let _ = killpg(pid, Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

/// This machine's node IP as Ray computes it.
fn node_ip(python: &Path) -> String {
    let out = Command::new(python)
        .args([
            "-c",
            "from ray._private.services import get_node_ip_address; print(get_node_ip_address())",
        ])
        .stderr(Stdio::inherit())
        .output()
        .expect("run python");
    assert!(out.status.success(), "cannot compute the node IP");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
