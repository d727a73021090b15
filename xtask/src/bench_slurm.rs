//! `cargo xtask bench-slurm`: four workers on four nodes of the Slurm test cluster
//! (`scripts/slurm-env.sh`), each running a trivial task, through `trainyard run --runtime
//! slurm` (which requests the allocation, starts one job step per worker with the rank
//! environment, runs the task and releases the allocation) and through `srun -N 4 -n 4`
//! (which requests the allocation and runs the task once per node), interleaved round by
//! round. Each is timed from its command's start to its exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ROUNDS: usize = 9;

pub(crate) fn run() -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    cluster_up(&root)?;
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        ours.push(crate::bench_e2e::timed(
            Command::new(&trainyard)
                .current_dir(&root)
                .args([
                    "run",
                    "--runtime",
                    "slurm",
                    "-n",
                    "4",
                    "-s",
                    "STRICT_SPREAD",
                ])
                .args(["-r", "CPU=1,memory=100MiB", "--", "true"])
                .env("CI", "1"),
        )?);
        theirs.push(crate::bench_e2e::timed(
            Command::new("srun").current_dir(&root).args([
                "-N",
                "4",
                "-n",
                "4",
                "-c",
                "1",
                "--mem=100M",
                "true",
            ]),
        )?);
        eprintln!(
            "round {round}: trainyard --runtime slurm {:.3}s  srun -n 4 {:.3}s",
            ours[round - 1].as_secs_f64(),
            theirs[round - 1].as_secs_f64()
        );
    }
    let (ours, theirs) = (
        crate::bench_e2e::median(ours),
        crate::bench_e2e::median(theirs),
    );
    println!("4 workers on 4 Slurm nodes, a trivial task, median of {ROUNDS} interleaved rounds:");
    println!(
        "  trainyard run --runtime slurm -n 4  {:.3}s",
        ours.as_secs_f64()
    );
    println!(
        "  srun -N 4 -n 4                      {:.3}s",
        theirs.as_secs_f64()
    );
    println!(
        "  trainyard / srun = {:.2} (target <= 1.50)",
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
    Ok(())
}

/// Brings the Slurm test cluster up (`scripts/slurm-env.sh`), or says why it is not.
pub(crate) fn cluster_up(root: &Path) -> Result<(), String> {
    let up = Command::new("bash")
        .arg(root.join("scripts/slurm-env.sh"))
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run scripts/slurm-env.sh: {e}"))?;
    if !up.success() {
        return Err(format!("scripts/slurm-env.sh failed ({up})"));
    }
    Ok(())
}
