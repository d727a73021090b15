//! `cargo xtask bench-restarts [--rounds N] [--readme]`: kill → training again on each
//! runtime. The restart script (`crates/cli/tests/python/restart.py`: 2 gloo ranks, rank 1
//! SIGKILLs itself in the first attempt) runs under `trainyard run --max-failures 1` on the
//! local runtime, on the Ray runtime (a throwaway Ray head on this machine) and on the Slurm
//! runtime (the Slurm test cluster, `scripts/slurm-env.sh`, the ranks on two nodes), each with
//! `--warm-python torch` and without it, interleaved round by round. A figure is the time
//! from the kill to both ranks' first `all_reduce` of the next attempt, as the ranks stamp
//! them; the table has the medians.

use std::time::Duration;

use crate::bench_e2e::{kill_to_training, median, ms, replace_block, restart_on, stamp};

const README_START: &str =
    "<!-- bench-restarts: written by `cargo xtask bench-restarts --readme` -->";
const README_END: &str = "<!-- /bench-restarts -->";

/// The runtimes, in the order they run and appear, and how their row names them.
const RUNTIMES: [(&str, &str); 3] = [
    ("local", "local"),
    ("ray", "Ray (a throwaway head on this machine)"),
    ("slurm", "Slurm (the test cluster, the ranks on two nodes)"),
];

/// Rounds unless `--rounds` says otherwise.
const ROUNDS: usize = 5;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut readme = false;
    let mut rounds = ROUNDS;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--readme" => readme = true,
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--rounds needs a positive number")?;
            }
            other => {
                return Err(format!(
                    "unknown argument {other}: expected --rounds N or --readme"
                ));
            }
        }
    }
    let root = crate::repository_root();
    crate::bench_slurm::cluster_up(&root)?;
    let python = crate::bench_e2e::script_python(&root, "scripts/ray-env.sh")?;
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let storage = tempfile::tempdir().map_err(|e| e.to_string())?;
    let stamp = stamp(&root);
    println!("measured {stamp}");
    // By runtime: the warm and the cold figures.
    let mut figures: Vec<(Vec<Duration>, Vec<Duration>)> = vec![Default::default(); 3];
    for round in 1..=rounds {
        for ((runtime, _), (warm, cold)) in RUNTIMES.iter().zip(&mut figures) {
            for (is_warm, into) in [(true, &mut *warm), (false, &mut *cold)] {
                let mut command =
                    restart_on(runtime, &trainyard, &python, &root, storage.path(), is_warm);
                command.env("TRAINYARD_RAY_PYTHON", &python);
                let time = kill_to_training(&mut command)
                    .map_err(|why| format!("{runtime}, warm {is_warm}: {why}"))?;
                eprintln!(
                    "round {round}: {runtime} {} {:.0} ms",
                    if is_warm { "warm" } else { "cold" },
                    ms(time)
                );
                into.push(time);
            }
        }
    }
    let mut table = format!(
        "Measured with `cargo xtask bench-restarts` ({stamp}; {rounds} interleaved rounds, medians, 2 cores): rank 1 of 2 SIGKILLed → both ranks' first `all_reduce` after the restart (`--max-failures 1`).\n\n\
         | runtime | `--warm-python torch` | cold (a script's default) |\n|---|---|---|\n"
    );
    for ((_, name), (warm, cold)) in RUNTIMES.iter().zip(figures) {
        let (warm, cold) = (median(warm), median(cold));
        table.push_str(&format!(
            "| {name} | {:.0} ms | {:.0} ms |\n",
            ms(warm),
            ms(cold)
        ));
    }
    println!("{table}");
    if readme {
        replace_block(&root.join("README.md"), README_START, README_END, &table)?;
        eprintln!("README.md: the bench-restarts table is rewritten");
    }
    Ok(())
}
