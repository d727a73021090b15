//! `cargo xtask bench-ray`: the same trivial 2-worker PyTorch job (join a gloo group,
//! all-reduce once) through `trainyard run --runtime ray` and through Ray Train's own
//! `TorchTrainer`, on one Ray cluster started for the benchmark, interleaved round by round.
//! Each contender is timed from its command's start to its exit, interpreter start included.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;

/// A one-node Ray cluster with room for both jobs' workers (and Ray Train's controller),
/// stopped when dropped.
struct Cluster {
    head: Child,
    address: String,
    dir: PathBuf,
}

impl Cluster {
    fn start(python: &Path) -> Result<Self, String> {
        let ray = python.with_file_name("ray");
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("tyb{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let log = std::fs::File::create(dir.join("head.log")).map_err(|e| e.to_string())?;
        let head = Command::new(&ray)
            .args(["start", "--head", "--block", "--disable-usage-stats"])
            .arg(format!("--port={port}"))
            .arg(format!("--temp-dir={}", dir.display()))
            .args(["--num-cpus=4", "--include-dashboard=false"])
            .arg("--object-store-memory=200000000")
            .env("RAY_AUTH_MODE", "disabled")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", ray.display()))?;
        let address = format!("{}:{port}", node_ip(python)?);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(60) {
                return Err("the Ray head did not open its port within 60 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Let the head's raylet register before the first driver.
        std::thread::sleep(Duration::from_secs(3));
        Ok(Self { head, address, dir })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.head.id()) {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = self.head.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn node_ip(python: &Path) -> Result<String, String> {
    let out = Command::new(python)
        .args([
            "-c",
            "from ray._private.services import get_node_ip_address; print(get_node_ip_address())",
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The venv with torch and ray, from `scripts/ray-env.sh`.
fn ray_python(root: &Path) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(root.join("scripts/ray-env.sh"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run scripts/ray-env.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/ray-env.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(|line| PathBuf::from(line.trim()))
        .ok_or_else(|| "scripts/ray-env.sh printed no interpreter".to_owned())
}

pub(crate) fn run() -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let python = ray_python(&root)?;
    let cluster = Cluster::start(&python)?;
    let storage = cluster.dir.join("ray-train-storage");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        ours.push(crate::bench_e2e::timed(
            Command::new(&trainyard)
                .current_dir(&root)
                .args(["run", "--runtime", "ray", "--address", &cluster.address])
                .args(["-n", "2", "-r", "CPU=1", "--"])
                .arg(&python)
                .arg("benches/ray/trivial_worker.py")
                .env("TRAINYARD_RAY_PYTHON", &python)
                .env("RAY_AUTH_MODE", "disabled")
                .env("CI", "1"),
        )?);
        theirs.push(crate::bench_e2e::timed(
            Command::new(&python)
                .current_dir(&root)
                .arg("benches/ray/ray_train_trivial.py")
                .arg(&cluster.address)
                .arg(&storage)
                .env("RAY_AUTH_MODE", "disabled"),
        )?);
        eprintln!(
            "round {round}: trainyard --runtime ray {:.2}s  Ray Train TorchTrainer {:.2}s",
            ours[round - 1].as_secs_f64(),
            theirs[round - 1].as_secs_f64()
        );
    }
    let (ours, theirs) = (
        crate::bench_e2e::median(ours),
        crate::bench_e2e::median(theirs),
    );
    println!(
        "trivial 2-worker torch job on one Ray cluster, median of {ROUNDS} interleaved rounds:"
    );
    println!("  trainyard run --runtime ray   {:.2}s", ours.as_secs_f64());
    println!(
        "  Ray Train TorchTrainer.fit()  {:.2}s",
        theirs.as_secs_f64()
    );
    println!(
        "  trainyard / Ray Train = {:.2} (target <= 0.30)",
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
    Ok(())
}
