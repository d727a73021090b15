//! `cargo xtask bench-slurm [--nodes N]`: N workers (default 4) on N nodes of the Slurm test
//! cluster (`scripts/slurm-env.sh`, brought up with N nodes), each running a trivial task,
//! through `trainyard run --runtime slurm` (which requests the allocation, starts one job
//! step per worker with the rank environment, runs the task and releases the allocation) and
//! through `srun -N N -n N` (which requests the allocation and runs the task once per node),
//! interleaved round by round. Each is timed from its command's start to its exit. It also
//! counts the `srun` processes on the driver's host while a run's tasks run: one per worker
//! (each worker's agent is a job step of its own, and its `srun` is how the driver sees the
//! step). A cluster brought up with other than 4 nodes is brought back to 4 at the end.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 9;
/// The test cluster's size unless `--nodes` says otherwise (the tests' cluster).
const NODES: usize = 4;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let nodes = match args {
        [] => NODES,
        [flag, n] if flag == "--nodes" => n
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| format!("--nodes must be a number from 1 to 64, got `{n}`"))?,
        other => return Err(format!("unknown arguments {other:?}: expected --nodes N")),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    cluster_of(&root, nodes)?;
    let measured = measure(&root, nodes);
    if nodes != NODES {
        cluster_of(&root, NODES)?;
    }
    measured
}

fn measure(root: &Path, nodes: usize) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let n = nodes.to_string();
    let ours_command = |task: &[&str]| {
        let mut command = Command::new(&trainyard);
        command
            .current_dir(root)
            .args(["run", "--runtime", "slurm", "-n", &n, "-s", "STRICT_SPREAD"])
            .args(["-r", "CPU=1,memory=100MiB", "--"])
            .args(task)
            .env("CI", "1");
        command
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        ours.push(crate::bench_e2e::timed(&mut ours_command(&["true"]))?);
        theirs.push(crate::bench_e2e::timed(
            Command::new("srun").current_dir(root).args([
                "-N",
                &n,
                "-n",
                &n,
                "-c",
                "1",
                "--mem=100M",
                "true",
            ]),
        )?);
        eprintln!(
            "round {round}: trainyard --runtime slurm {:.3}s  srun -n {n} {:.3}s",
            ours[round - 1].as_secs_f64(),
            theirs[round - 1].as_secs_f64()
        );
    }
    let sruns = sruns_while_tasks_run(ours_command(&["sleep", "3"]))?;
    let (ours, theirs) = (
        crate::bench_e2e::median(ours),
        crate::bench_e2e::median(theirs),
    );
    println!(
        "{nodes} workers on {nodes} Slurm nodes, a trivial task, median of {ROUNDS} interleaved rounds:"
    );
    println!(
        "  trainyard run --runtime slurm -n {nodes}  {:.3}s",
        ours.as_secs_f64()
    );
    println!(
        "  srun -N {nodes} -n {nodes}                      {:.3}s",
        theirs.as_secs_f64()
    );
    println!(
        "  trainyard / srun = {:.2} (target <= 1.50)",
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
    println!(
        "  srun processes on the driver's host while the tasks run: {} started by the driver, {} in all",
        sruns.0, sruns.1
    );
    Ok(())
}

/// The `srun` processes while `run` (a run of a task of seconds) runs, sampled every 50 ms
/// (the median of the samples with any, leaving out the moments of launch and shutdown):
/// those the driver started (one per job step it launched), and all of them on this host
/// (each `srun` forks a helper of its own).
fn sruns_while_tasks_run(mut run: Command) -> Result<(usize, usize), String> {
    let mut child = run
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run trainyard: {e}"))?;
    let driver = child.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut started, mut all) = (Vec::new(), Vec::new());
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        let parents = Command::new("ps")
            .args(["-o", "ppid=", "-C", "srun"])
            .output()
            .map_err(|e| format!("cannot run ps: {e}"))?;
        let parents = String::from_utf8_lossy(&parents.stdout);
        let parents: Vec<&str> = parents.split_whitespace().collect();
        if !parents.is_empty() {
            started.push(parents.iter().filter(|p| **p == driver).count());
            all.push(parents.len());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the counted run failed ({status})"));
    }
    let median = |mut counts: Vec<usize>| {
        counts.sort_unstable();
        counts.get(counts.len() / 2).copied().unwrap_or(0)
    };
    Ok((median(started), median(all)))
}

/// Brings the Slurm test cluster up (`scripts/slurm-env.sh`), or says why it is not.
pub(crate) fn cluster_up(root: &Path) -> Result<(), String> {
    cluster_of(root, NODES)
}

/// Brings the Slurm test cluster up with `nodes` nodes (reconfigured when it has others).
fn cluster_of(root: &Path, nodes: usize) -> Result<(), String> {
    let up = Command::new("bash")
        .arg(root.join("scripts/slurm-env.sh"))
        .env("TRAINYARD_SLURM_NODES", nodes.to_string())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run scripts/slurm-env.sh: {e}"))?;
    if !up.success() {
        return Err(format!("scripts/slurm-env.sh failed ({up})"));
    }
    Ok(())
}
