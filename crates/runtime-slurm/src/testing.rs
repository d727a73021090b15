//! The test cluster: fake Slurm nodes on this machine (`scripts/slurm-env.sh`), and
//! allocations on it for tests that run inside one.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Says why Slurm tests cannot run under `CI=true`, where they would otherwise fail.
pub const SKIP_VAR: &str = "TRAINYARD_SLURM_SKIP";

/// The set-up script of the test cluster.
#[must_use]
pub fn setup_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/slurm-env.sh")
}

fn controller_answers() -> bool {
    Command::new("scontrol")
        .arg("ping")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("is UP"))
}

/// The test cluster, for one test at a time in this process (tests in one binary run on
/// threads of one process under `cargo test`; nextest runs the Slurm tests one at a time).
#[derive(Debug)]
pub struct Cluster {
    _only: std::sync::MutexGuard<'static, ()>,
}

/// The test cluster once it is up (it is set up with `scripts/slurm-env.sh` when it is not,
/// which needs root), held by this test until the value is dropped. `None` after printing
/// `SKIP:` and why; under `CI=true` without [`SKIP_VAR`] saying why, a missing cluster panics
/// instead: a test must not pass silently.
#[must_use]
pub fn cluster() -> Option<Cluster> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let only = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cluster_up().then_some(Cluster { _only: only })
}

fn cluster_up() -> bool {
    if controller_answers() {
        return true;
    }
    let script = setup_script();
    let ran = Command::new("bash")
        .arg(&script)
        .arg("up")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status();
    if matches!(ran, Ok(status) if status.success()) && controller_answers() {
        return true;
    }
    let why = match ran {
        Ok(status) => format!("{} up exited with {status}", script.display()),
        Err(error) => format!("cannot run {}: {error}", script.display()),
    };
    if let Ok(skip) = std::env::var(SKIP_VAR) {
        eprintln!("SKIP: the Slurm test cluster is not available: {skip}");
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the Slurm test cluster is not available under CI=true ({why}); {SKIP_VAR} must say why"
    );
    eprintln!("SKIP: the Slurm test cluster is not available: {why}");
    false
}

/// An allocation held for a test, like one made with `salloc`; cancelled when dropped.
#[derive(Debug)]
pub struct HeldAllocation {
    /// Its job id.
    pub job: String,
    salloc: Child,
}

impl HeldAllocation {
    /// Holds an allocation made with the `salloc` options `flags` (up to 30 s to be granted).
    ///
    /// # Panics
    /// When Slurm does not grant it in time.
    #[must_use]
    // `salloc` is reaped in `Drop` once it is held, and here on the failing path.
    #[allow(clippy::zombie_processes)]
    pub fn new(name: &str, flags: &[&str]) -> Self {
        let mut salloc = Command::new("salloc")
            .arg(format!("--job-name={name}"))
            .args(flags)
            .args(["sh", "-c", "cat >/dev/null; scancel \"$SLURM_JOB_ID\""])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("salloc starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("squeue")
                .args(["-h", "-n", name, "-t", "RUNNING", "-o", "%A"])
                .output()
                .expect("squeue");
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(job) = text.lines().next().map(str::trim).filter(|j| !j.is_empty()) {
                return Self {
                    job: job.to_owned(),
                    salloc,
                };
            }
            if Instant::now() >= deadline {
                let _ = salloc.kill();
                let _ = salloc.wait();
                panic!("Slurm did not grant `{name}` in 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for HeldAllocation {
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg(&self.job).status();
        drop(self.salloc.stdin.take());
        let _ = self.salloc.wait();
    }
}

/// The jobs Slurm has whose name starts with `prefix`, in any state but ended.
#[must_use]
pub fn jobs_named(prefix: &str) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%A %j"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, name)| name.starts_with(prefix))
        .map(|(job, _)| job.to_owned())
        .collect()
}

/// Waits up to `limit` for Slurm to have no job whose name starts with `prefix` (a cancelled
/// job shows as completing for a moment); returns those still there.
#[must_use]
pub fn wait_for_no_jobs(prefix: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    loop {
        let left = jobs_named(prefix);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
