//! `cargo xtask bench-python [--readme]`: one 2-worker `TorchTrainer` program
//! (`benches/python/linear.py`) run whole, interpreter start to exit, on trainyard (the
//! installed wheel's `fit()`) and on Ray Train 2.60 (the same file, `ray.train` imported
//! instead, which starts its own Ray), and the same work as a script through the wheel's
//! `trainyard run -n 2` (`benches/python/linear_script.py`), interleaved round by round.
//!
//! The wheel is built and installed into a fresh venv as `cargo xtask python` does; Ray and
//! torch come from the project's venv (`scripts/ray-env.sh`). `--readme` writes the README's
//! table between its markers.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::bench_e2e::{median, replace_block, stamp, timed};

/// Ray Train takes tens of seconds a round: fewer rounds than bench-e2e's.
const ROUNDS: usize = 3;

const README_START: &str = "<!-- bench-python: written by `cargo xtask bench-python --readme` -->";
const README_END: &str = "<!-- /bench-python -->";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let readme = match args {
        [] => false,
        [flag] if flag == "--readme" => true,
        other => return Err(format!("unknown arguments {other:?}: expected --readme")),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root
        .canonicalize()
        .map_err(|e| format!("cannot find the workspace at {}: {e}", root.display()))?;
    let ray_python = crate::bench_e2e::script_python(&root, "scripts/ray-env.sh")?;
    let scratch = crate::target_dir().join("bench-python");
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .map_err(|e| format!("cannot clear {}: {e}", scratch.display()))?;
    }
    let wheel = crate::python::build_wheel(&ray_python, &root, &scratch.join("dist"))?;
    let python = crate::python::fresh_venv(&ray_python, &scratch.join("venv"), &wheel)?;
    let trainyard = python.with_file_name("trainyard");
    let program = root.join("benches/python/linear.py");
    let script = root.join("benches/python/linear_script.py");

    let (mut ours, mut ray, mut cli) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let storage = tempfile::tempdir().map_err(|e| e.to_string())?;
        // As a user's shell would start them: no variable of ours, no Ray address.
        let plain = |program: &std::path::Path| {
            let mut command = Command::new(program);
            command
                .current_dir(storage.path())
                .env_remove("RAY_ADDRESS")
                .env("RAY_USAGE_STATS_ENABLED", "0");
            for (name, _) in std::env::vars_os() {
                if name.to_string_lossy().starts_with("TRAINYARD_") {
                    command.env_remove(name);
                }
            }
            command
        };
        let fit = |which: &str| {
            let mut command = plain(&python);
            command
                .arg(&program)
                .arg(which)
                .arg(storage.path().join(which));
            command
        };
        let mut through_cli = plain(&trainyard);
        through_cli
            .args(["run", "-n", "2", "--storage"])
            .arg(storage.path().join("cli"))
            .arg("--")
            .arg(&python)
            .arg(&script);
        // Each contender goes first in turn, so that none has the caches warmed by the others.
        let mut contenders: [(&mut Vec<Duration>, Command); 3] = [
            (&mut ours, fit("trainyard")),
            (&mut ray, fit("ray")),
            (&mut cli, through_cli),
        ];
        contenders.rotate_left(round % 3);
        for (times, command) in &mut contenders {
            times.push(timed(command)?);
        }
        eprintln!(
            "round {}: fit() {:.2}s, Ray Train {:.2}s, trainyard run {:.2}s",
            round + 1,
            ours[round].as_secs_f64(),
            ray[round].as_secs_f64(),
            cli[round].as_secs_f64()
        );
    }
    let figures = Figures {
        fit: median(ours),
        ray: median(ray),
        cli: median(cli),
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

/// The medians of one run of the bench.
struct Figures {
    fit: Duration,
    ray: Duration,
    cli: Duration,
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
             {README_END}",
            self.stamp,
            s(self.fit),
            s(self.fit) / s(self.ray),
            s(self.ray),
            s(self.cli),
            s(self.fit) / s(self.cli),
        )
    }
}
