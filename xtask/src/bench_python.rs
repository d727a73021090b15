//! `cargo xtask bench-python [--readme]`: one 2-worker `TorchTrainer` program
//! (`benches/python/linear.py`) run whole, interpreter start to exit, on trainyard (the
//! installed wheel's `fit()`) and on Ray Train 2.60 (the same file, `ray.train` imported
//! instead, which starts its own Ray), the same work as a script through the wheel's
//! `trainyard run -n 2` (`benches/python/linear_script.py`), and one 2-worker PyTorch
//! Lightning program (`benches/python/lightning_classifier.py`) on both, interleaved round by
//! round.
//!
//! The wheel is built and installed into a fresh venv as `cargo xtask python` does; Ray and
//! torch come from the project's venv (`scripts/ray-env.sh`). `--readme` writes the README's
//! table between its markers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::bench_e2e::{median, replace_block, stamp, timed};

/// Ray Train takes tens of seconds a round: fewer rounds than bench-e2e's.
const ROUNDS: usize = 3;

const README_START: &str = "<!-- bench-python: written by `cargo xtask bench-python --readme` -->";
const README_END: &str = "<!-- /bench-python -->";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let (mut readme, mut stall, mut restart) = (false, false, false);
    for arg in args {
        match arg.as_str() {
            "--readme" => readme = true,
            "--stall" => stall = true,
            "--restart" => restart = true,
            other => {
                return Err(format!(
                    "unknown argument `{other}`: expected --stall, --restart or --readme"
                ));
            }
        }
    }
    let Installed {
        root,
        ray_python: _,
        python,
    } = Installed::fresh("bench-python")?;
    if stall {
        return stalls(&root, &python, readme);
    }
    if restart {
        return restarts(&root, &python, readme);
    }
    let trainyard = python.with_file_name("trainyard");
    let program = root.join("benches/python/linear.py");
    let script = root.join("benches/python/linear_script.py");
    let lightning = root.join("benches/python/lightning_classifier.py");

    let (mut ours, mut ray, mut cli) = (Vec::new(), Vec::new(), Vec::new());
    let (mut lightning_ours, mut lightning_ray) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let storage = tempfile::tempdir().map_err(|e| e.to_string())?;
        // As a user's shell would start them: no variable of ours, no Ray address.
        let plain = |program: &Path| plain(program, storage.path());
        let fit_of = |program: &Path, which: &str| {
            let mut command = plain(&python);
            command
                .arg(program)
                .arg(which)
                .arg(storage.path().join(which));
            command
        };
        let fit = |which: &str| fit_of(&program, which);
        let mut through_cli = plain(&trainyard);
        through_cli
            .args(["run", "-n", "2", "--storage"])
            .arg(storage.path().join("cli"))
            .arg("--")
            .arg(&python)
            .arg(&script);
        // Each contender goes first in turn, so that none has the caches warmed by the others.
        let mut contenders: [(&mut Vec<Duration>, Command); 5] = [
            (&mut ours, fit("trainyard")),
            (&mut ray, fit("ray")),
            (&mut cli, through_cli),
            (&mut lightning_ours, fit_of(&lightning, "trainyard")),
            (&mut lightning_ray, fit_of(&lightning, "ray")),
        ];
        contenders.rotate_left(round % 5);
        for (times, command) in &mut contenders {
            times.push(timed(command)?);
        }
        eprintln!(
            "round {}: fit() {:.2}s, Ray Train {:.2}s, trainyard run {:.2}s; Lightning: fit() {:.2}s, Ray Train {:.2}s",
            round + 1,
            ours[round].as_secs_f64(),
            ray[round].as_secs_f64(),
            cli[round].as_secs_f64(),
            lightning_ours[round].as_secs_f64(),
            lightning_ray[round].as_secs_f64()
        );
    }
    let figures = Figures {
        fit: median(ours),
        ray: median(ray),
        cli: median(cli),
        lightning_fit: median(lightning_ours),
        lightning_ray: median(lightning_ray),
        stamp: stamp(&root),
    };
    println!(
        "TorchTrainer, 2 workers, whole process: trainyard fit() {:.2} s, Ray Train 2.60 {:.2} s: {:.2} × (target <= 0.3) ({})",
        figures.fit.as_secs_f64(),
        figures.ray.as_secs_f64(),
        figures.fit.as_secs_f64() / figures.ray.as_secs_f64(),
        figures.stamp
    );
    println!(
        "the same work through trainyard run -n 2: {:.2} s; fit() / run = {:.2} (target <= 1.1)",
        figures.cli.as_secs_f64(),
        figures.fit.as_secs_f64() / figures.cli.as_secs_f64()
    );
    println!(
        "Lightning, 2 workers, whole process: trainyard fit() {:.2} s, Ray Train 2.60 {:.2} s: {:.2} × (target <= 0.3)",
        figures.lightning_fit.as_secs_f64(),
        figures.lightning_ray.as_secs_f64(),
        figures.lightning_fit.as_secs_f64() / figures.lightning_ray.as_secs_f64()
    );
    if readme {
        replace_block(
            &root.join("README.md"),
            README_START,
            README_END,
            &figures.table(),
        )?;
        eprintln!("README.md: the bench-python table is rewritten");
    }
    Ok(())
}

/// The wheel built from this checkout, installed into a fresh venv under the target folder's
/// `scratch` (cleared first), beside Ray and torch of the project's venv.
pub(crate) struct Installed {
    /// The repository.
    pub(crate) root: PathBuf,
    /// The project venv's Python (Ray 2.60, torch, torchrun).
    pub(crate) ray_python: PathBuf,
    /// The fresh venv's Python, with the wheel installed.
    pub(crate) python: PathBuf,
}

impl Installed {
    pub(crate) fn fresh(scratch: &str) -> Result<Self, String> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let root = root
            .canonicalize()
            .map_err(|e| format!("cannot find the workspace at {}: {e}", root.display()))?;
        let ray_python = crate::bench_e2e::script_python(&root, "scripts/ray-env.sh")?;
        let scratch = crate::target_dir().join(scratch);
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch)
                .map_err(|e| format!("cannot clear {}: {e}", scratch.display()))?;
        }
        let wheel = crate::python::build_wheel(&ray_python, &root, &scratch.join("dist"))?;
        let python = crate::python::fresh_venv(&ray_python, &scratch.join("venv"), &wheel)?;
        Ok(Self {
            root,
            ray_python,
            python,
        })
    }
}

/// `program` as a user's shell would start it in `dir`: no variable of ours, no Ray address.
pub(crate) fn plain(program: &Path, dir: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .current_dir(dir)
        .env_remove("RAY_ADDRESS")
        .env("RAY_USAGE_STATS_ENABLED", "0");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TRAINYARD_") {
            command.env_remove(name);
        }
    }
    command
}

/// Rounds of the stall figure; each runs three whole programs.
const STALL_ROUNDS: usize = 2;

/// Reports per rank in one run of `benches/python/stall.py` (its `REPORTS`).
const STALL_REPORTS: usize = 20;

const STALL_START: &str =
    "<!-- bench-stall: written by `cargo xtask bench-python --stall --readme` -->";
const STALL_END: &str = "<!-- /bench-stall -->";

/// What one run of `benches/python/stall.py` printed.
#[derive(serde::Deserialize)]
struct Stalled {
    stalls: Vec<f64>,
    commit: f64,
}

/// The stall figure: `benches/python/stall.py` as `SYNC` and `ASYNC` on trainyard and as
/// `ASYNC` on Ray Train, interleaved; the median and the 95th percentile of every report's
/// stall, the longest first report, and the median time to commit.
fn stalls(root: &Path, python: &Path, readme: bool) -> Result<(), String> {
    let program = root.join("benches/python/stall.py");
    let contenders = [
        ("trainyard", "SYNC"),
        ("trainyard", "ASYNC"),
        ("ray", "ASYNC"),
    ];
    let mut seen: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); contenders.len()];
    for round in 0..STALL_ROUNDS {
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            let (which, mode) = contenders[i];
            let storage = tempfile::tempdir().map_err(|e| e.to_string())?;
            let output = plain(python, storage.path())
                .arg(&program)
                .args([which, mode])
                .arg(storage.path().join("runs"))
                .stderr(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
            if !output.status.success() {
                return Err(format!(
                    "{which} {mode}: stall.py failed ({})",
                    output.status
                ));
            }
            let stdout = String::from_utf8_lossy(&output.stdout);
            let line = stdout
                .lines()
                .rev()
                .find(|l| l.starts_with('{'))
                .unwrap_or("");
            let stalled: Stalled = serde_json::from_str(line)
                .map_err(|e| format!("{which} {mode}: not the figures ({e}): {stdout}"))?;
            eprintln!(
                "round {}: {which} {mode}: stalls {:?} s, commit {:.2} s",
                round + 1,
                stalled
                    .stalls
                    .iter()
                    .map(|s| (s * 1000.0).round() / 1000.0)
                    .collect::<Vec<_>>(),
                stalled.commit
            );
            seen[i].0.extend(stalled.stalls);
            seen[i].1.push(stalled.commit);
        }
    }
    let figures: Vec<StallFigures> = seen
        .into_iter()
        .map(|(stalls, commits)| StallFigures::of(&stalls, commits))
        .collect();
    let rows = [
        "trainyard, `SYNC`",
        "trainyard, `ASYNC`",
        "Ray Train 2.60, `ASYNC`",
    ];
    let mut table = format!(
        "{STALL_START}\nMeasured with `cargo xtask bench-python --stall` ({}; {STALL_ROUNDS} interleaved rounds of {STALL_REPORTS} reports per rank, 2 cores, local disk):\n\n\
         | 2 ranks, 256 MiB per rank per report | stall per `report()`, median | 95th percentile | first report (the longer rank's) | last report → `fit()` returned |\n\
         |---|---|---|---|---|\n",
        stamp(root)
    );
    for (row, f) in rows.iter().zip(&figures) {
        println!(
            "{row}: stall per report {:.1} ms (p95 {:.1} ms, first report {:.1} ms), last report to fit() returned {:.2} s",
            f.median * 1000.0,
            f.p95 * 1000.0,
            f.first * 1000.0,
            f.commit
        );
        table.push_str(&format!(
            "| {row} | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} s |\n",
            f.median * 1000.0,
            f.p95 * 1000.0,
            f.first * 1000.0,
            f.commit
        ));
    }
    table.push_str(STALL_END);
    if readme {
        replace_block(&root.join("README.md"), STALL_START, STALL_END, &table)?;
        eprintln!("README.md: the bench-stall table is rewritten");
    }
    Ok(())
}

/// One contender's stall figures, in seconds.
struct StallFigures {
    median: f64,
    /// The 95th percentile (nearest rank) of every report's stall, first reports included.
    p95: f64,
    /// The longest stall of a rank's first report, over every rank and round.
    first: f64,
    /// The median time from the last report's call to `fit()` returning.
    commit: f64,
}

impl StallFigures {
    /// `stalls`: each run's stalls as `stall.py` prints them (each rank's
    /// [`STALL_REPORTS`] in a row), run after run.
    fn of(stalls: &[f64], commits: Vec<f64>) -> Self {
        let first = stalls
            .iter()
            .step_by(STALL_REPORTS)
            .copied()
            .fold(f64::NAN, f64::max);
        Self {
            median: percentile(stalls.to_vec(), 0.5),
            p95: percentile(stalls.to_vec(), 0.95),
            first,
            commit: percentile(commits, 0.5),
        }
    }
}

/// The `q` quantile of `samples` by nearest rank; NaN when there are none.
fn percentile(mut samples: Vec<f64>, q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

/// Rounds of the restart figure; each runs two whole programs.
const RESTART_ROUNDS: usize = 5;

const RESTART_START: &str =
    "<!-- bench-restart: written by `cargo xtask bench-python --restart --readme` -->";
const RESTART_END: &str = "<!-- /bench-restart -->";

/// The restart figure: `benches/python/restart.py` on trainyard (loop functions start from
/// a warm Python by default, and a surviving rank restarts in place), on trainyard with
/// `TRAINYARD_RESTART_IN_PLACE=0` (every rank a new fork) and on Ray Train, interleaved; the
/// median time from a rank's death to every rank's first `all_reduce` after the restart.
fn restarts(root: &Path, python: &Path, readme: bool) -> Result<(), String> {
    let program = root.join("benches/python/restart.py");
    // (label, the program's argument, TRAINYARD_RESTART_IN_PLACE, rank 0 restarts in place)
    let contenders = [
        ("trainyard", "trainyard", None, true),
        ("trainyard, forked", "trainyard", Some("0"), false),
        ("Ray Train", "ray", None, false),
    ];
    let mut seen: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    for round in 0..RESTART_ROUNDS {
        for k in 0..contenders.len() {
            let i = (k + round) % contenders.len();
            let (label, which, in_place, kept) = contenders[i];
            let storage = tempfile::tempdir().map_err(|e| e.to_string())?;
            let mut command = plain(python, storage.path());
            if let Some(value) = in_place {
                command.env("TRAINYARD_RESTART_IN_PLACE", value);
            }
            let output = command
                .arg(&program)
                .arg(which)
                .arg(storage.path().join("runs"))
                .stderr(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
            let stdout = String::from_utf8_lossy(&output.stdout);
            let said = stdout
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|_| output.status.success())
                .ok_or_else(|| {
                    format!("{label}: restart.py failed ({}): {stdout}", output.status)
                })?;
            let figure = said["restart"]
                .as_f64()
                .ok_or_else(|| format!("{label}: restart.py said no figure: {stdout}"))?;
            if said["in_place"].as_bool() != Some(kept) {
                return Err(format!(
                    "{label}: rank 0 {} in place, expected otherwise: {stdout}",
                    if kept { "did not restart" } else { "restarted" }
                ));
            }
            eprintln!("round {}: {label}: {figure:.3} s", round + 1);
            seen[i].push(figure);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let [ours, forked, ray] = [0, 1, 2].map(|i| median(seen[i].clone()) * 1000.0);
    let stamp = stamp(root);
    println!(
        "TorchTrainer, 2 workers, rank 1 SIGKILLed → both ranks' first all_reduce after the restart: trainyard in place {ours:.0} ms (target <= 200 ms), forked {forked:.0} ms, Ray Train 2.60 {ray:.0} ms ({stamp})"
    );
    let table = format!(
        "{RESTART_START}\nMeasured with `cargo xtask bench-python --restart` ({stamp}; {RESTART_ROUNDS} interleaved rounds, medians, 2 cores):\n\n\
         | `TorchTrainer` loop function, 2 gloo ranks, rank 1 SIGKILLed, `FailureConfig(max_failures=1)` | kill → both ranks' first `all_reduce` again |\n\
         |---|---|\n\
         | trainyard (`from trainyard import train`, default flags: rank 0 restarts in place, rank 1 forks from a Python that imported torch) | {ours:.0} ms |\n\
         | trainyard, `TRAINYARD_RESTART_IN_PLACE=0` (both ranks fork anew) | {forked:.0} ms |\n\
         | Ray Train 2.60 (`from ray import train`) | {ray:.0} ms |\n\
         {RESTART_END}"
    );
    if readme {
        replace_block(&root.join("README.md"), RESTART_START, RESTART_END, &table)?;
        eprintln!("README.md: the bench-restart table is rewritten");
    }
    Ok(())
}

/// The medians of one run of the bench.
struct Figures {
    fit: Duration,
    ray: Duration,
    cli: Duration,
    lightning_fit: Duration,
    lightning_ray: Duration,
    stamp: String,
}

impl Figures {
    /// The README's table, markers included.
    fn table(&self) -> String {
        let s = |d: Duration| d.as_secs_f64();
        format!(
            "{README_START}\nMeasured with `cargo xtask bench-python` ({}; {ROUNDS} interleaved rounds, medians, 2 cores):\n\n\
             | the same 2-worker `TorchTrainer` program, whole process | time | ratio |\n\
             |---|---|---|\n\
             | trainyard (`from trainyard import train`) | {:.2} s | {:.2} × Ray Train |\n\
             | Ray Train 2.60 (`from ray import train`, starting its own Ray) | {:.2} s | |\n\
             | the same work as a script, `trainyard run -n 2` | {:.2} s | `fit()` is {:.2} × this |\n\
             | the same 2-worker Lightning program (`benches/python/lightning_classifier.py`), trainyard (`trainyard.train.lightning`) | {:.2} s | {:.2} × Ray Train |\n\
             | the same Lightning program, Ray Train 2.60 (`ray.train.lightning`, starting its own Ray) | {:.2} s | |\n\
             {README_END}",
            self.stamp,
            s(self.fit),
            s(self.fit) / s(self.ray),
            s(self.ray),
            s(self.cli),
            s(self.fit) / s(self.cli),
            s(self.lightning_fit),
            s(self.lightning_fit) / s(self.lightning_ray),
            s(self.lightning_ray),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_95th_percentile_is_by_nearest_rank_and_the_first_reports_are_each_rank_s() {
        let one_to_twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(one_to_twenty.clone(), 0.95), 19.0);
        assert_eq!(percentile(one_to_twenty, 0.5), 10.0);
        assert!(percentile(Vec::new(), 0.5).is_nan());
        // Two ranks of one run: rank 0's first report took 7, rank 1's 30.
        let mut stalls = vec![1.0; 2 * STALL_REPORTS];
        stalls[0] = 7.0;
        stalls[STALL_REPORTS] = 30.0;
        stalls[3] = 50.0;
        let figures = StallFigures::of(&stalls, vec![2.0, 1.0, 3.0]);
        assert_eq!(figures.first, 30.0);
        assert_eq!(figures.p95, 7.0, "the 38th of 40");
        assert_eq!(figures.median, 1.0);
        assert_eq!(figures.commit, 2.0);
    }
}
