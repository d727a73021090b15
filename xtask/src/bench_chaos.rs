//! `cargo xtask bench-chaos [--readme] [--only NAMES] [--seconds S] [--every S]`: goodput
//! under chaos. The same 2-rank gloo program (`benches/python/chaos.py`: a step ≈ 50 ms, a
//! checkpoint handed in with every step) runs on trainyard's local, Ray and Slurm runtimes,
//! on Ray Train 2.60 and under `torchrun --max-restarts`, one after another; while it trains,
//! one rank is SIGKILLed every 10 s (rank 1, then rank 0, ...) for 2 minutes, then the
//! program is told to stop.
//!
//! Goodput is the time spent in steps that survive (the last run of each step: a step run
//! again after a restart was lost the first time) over the wall time from the first step to
//! the stop; steps lost per failure are the step runs that were run again, over the kills.
//! A kill lands only on a live rank whose pid is new since the last kill (a rank still
//! restarting is waited for), so a slow restart also means fewer kills: the table says how
//! many landed.
//!
//! The wheel is built and installed into a fresh venv as `cargo xtask python` does; Ray,
//! torch and torchrun come from the project's venv (`scripts/ray-env.sh`). The Slurm row
//! needs the Slurm test cluster (`scripts/slurm-env.sh up`); without it the row says so.
//!
//! A program that is still there when its row ends (past a limit, or failed) is first asked
//! to stop as Ctrl-C asks (SIGINT, then up to [`SIGNAL_GRACE`]): trainyard's driver then
//! stops its ranks and gives back what it holds, a Slurm allocation included. What is left
//! after that is SIGKILLed, and a Slurm job of the run's name that is still there is
//! cancelled before the next row starts.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench_e2e::{kill_tree, replace_block, stamp};

const README_START: &str = "<!-- bench-chaos: written by `cargo xtask bench-chaos --readme` -->";
const README_END: &str = "<!-- /bench-chaos -->";

/// How long a program may take to start training (Ray Train starts a cluster first).
const FIRST_STEP_LIMIT: Duration = Duration::from_secs(240);

/// How long a program may take to end once told to stop.
const STOP_LIMIT: Duration = Duration::from_secs(120);

/// How long a program still there at the end of its row gets to end after a SIGINT before it
/// is killed (trainyard's driver stops its ranks within its 5 s shutdown patience and a Slurm
/// allocation's `salloc` exits within 12 s of its release).
const SIGNAL_GRACE: Duration = Duration::from_secs(30);

/// The run's name in `benches/python/chaos.py` (its `RunConfig`): on Slurm, the job name of
/// the run's allocation.
const RUN_NAME: &str = "chaos";

/// The contenders, in the order they run and appear.
const CONTENDERS: [(&str, &str); 5] = [
    (
        "local",
        "trainyard, local runtime (`TorchTrainer`, default flags)",
    ),
    (
        "ray-runtime",
        "trainyard, Ray runtime (`runtime=\"ray\"`, a throwaway Ray head)",
    ),
    (
        "slurm",
        "trainyard, Slurm runtime (`runtime=\"slurm\"`, the Slurm test cluster)",
    ),
    ("ray", "Ray Train 2.60 (`from ray import train`)"),
    (
        "torchrun",
        "`torchrun --standalone --nproc-per-node 2 --max-restarts 1000` (a script; rank 0 saves a checkpoint every step)",
    ),
];

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut readme = false;
    let mut only: Option<Vec<String>> = None;
    let mut seconds = 120.0;
    let mut every = 10.0;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let given = args.get(i + 1).cloned();
        i += 1;
        if matches!(arg.as_str(), "--only" | "--seconds" | "--every") {
            i += 1;
        }
        let value = |flag: &str| given.clone().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--readme" => readme = true,
            "--only" => {
                let names: Vec<String> = value("--only")?.split(',').map(str::to_owned).collect();
                if let Some(bad) = names
                    .iter()
                    .find(|n| !CONTENDERS.iter().any(|(c, _)| c == n))
                {
                    return Err(format!(
                        "--only: unknown contender `{bad}`: expected some of {}",
                        CONTENDERS.map(|(c, _)| c).join(",")
                    ));
                }
                only = Some(names);
            }
            "--seconds" => seconds = positive("--seconds", &value("--seconds")?)?,
            "--every" => every = positive("--every", &value("--every")?)?,
            other => {
                return Err(format!(
                    "unknown argument `{other}`: expected --readme, --only, --seconds or --every"
                ));
            }
        }
    }
    if readme && (only.is_some() || seconds != 120.0 || every != 10.0) {
        return Err(
            "--readme writes the whole table: use it without --only, --seconds and --every"
                .to_owned(),
        );
    }
    let crate::bench_python::Installed {
        root,
        ray_python,
        python,
    } = crate::bench_python::Installed::fresh("bench-chaos")?;
    let program = root.join("benches/python/chaos.py");
    let chaos = Chaos {
        seconds: Duration::from_secs_f64(seconds),
        every: Duration::from_secs_f64(every),
    };
    let mut rows = Vec::new();
    for (name, row) in CONTENDERS {
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
            continue;
        }
        let out = tempfile::Builder::new()
            .prefix("chaos_")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let outcome = match contender(name, &python, &ray_python, &program, out.path()) {
            Ok(command) => {
                let slurm_job = (name == "slurm").then_some(RUN_NAME);
                chaos.run(command, out.path(), slurm_job)
            }
            Err(why) => Err(why),
        };
        match &outcome {
            Ok(o) => eprintln!(
                "{name}: goodput {:.1} %, {} kills, {:.1} steps lost per failure, {} steps",
                o.goodput * 100.0,
                o.kills,
                o.lost_per_failure(),
                o.steps
            ),
            Err(why) => eprintln!("{name}: no figure: {why}"),
        }
        rows.push((row, outcome));
    }
    let table = table(&root, &chaos, &rows);
    println!("{table}");
    if readme {
        replace_block(&root.join("README.md"), README_START, README_END, &table)?;
        eprintln!("README.md: the bench-chaos table is rewritten");
    }
    Ok(())
}

fn positive(flag: &str, value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!(
            "{flag}: `{value}` is not a number of seconds above 0"
        )),
    }
}

/// The command that runs `name`'s program, writing into `out`; why not, when it cannot run
/// here.
fn contender(
    name: &str,
    python: &Path,
    ray_python: &Path,
    program: &Path,
    out: &Path,
) -> Result<Command, String> {
    let mut command = crate::bench_python::plain(python, out);
    match name {
        "local" | "ray-runtime" | "slurm" => {
            let runtime = match name {
                "local" => "local",
                "ray-runtime" => "ray",
                _ => {
                    slurm_is_up()?;
                    "slurm"
                }
            };
            command
                .env("TRAINYARD_RUNTIME", runtime)
                .env("TRAINYARD_RAY_PYTHON", ray_python)
                .arg(program)
                .arg("trainyard");
        }
        "ray" => {
            command.arg(program).arg("ray");
        }
        _ => {
            command
                .args(["-m", "torch.distributed.run", "--standalone"])
                .args(["--nproc-per-node", "2", "--max-restarts", "1000"])
                .arg(program)
                .arg("script");
        }
    }
    command.arg(out);
    Ok(command)
}

fn slurm_is_up() -> Result<(), String> {
    let nodes = Command::new("sinfo")
        .args(["-h", "-r", "-o", "%D"])
        .output()
        .map_err(|e| {
            format!("the Slurm test cluster is not up (sinfo: {e}): scripts/slurm-env.sh up")
        })?;
    let up = nodes.status.success()
        && String::from_utf8_lossy(&nodes.stdout)
            .split_whitespace()
            .any(|n| n != "0");
    if up {
        Ok(())
    } else {
        Err("the Slurm test cluster has no node up: scripts/slurm-env.sh up".to_owned())
    }
}

/// How the ranks are killed.
struct Chaos {
    /// How long the kills go on, from the first step.
    seconds: Duration,
    /// How often a rank is killed.
    every: Duration,
}

impl Chaos {
    /// Runs `command` (its program writes into `out`) while killing its ranks; its figures.
    /// `slurm_job` names the Slurm job its run holds, if any.
    fn run(
        &self,
        mut command: Command,
        out: &Path,
        slurm_job: Option<&str>,
    ) -> Result<Outcome, String> {
        use std::os::unix::process::CommandExt as _;
        let log = std::fs::File::create(out.join("program.log")).map_err(|e| e.to_string())?;
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {command:?}: {e}"))?;
        let mut child = Reaped { child, slurm_job };
        let tail = || {
            let text = std::fs::read(out.join("program.log")).unwrap_or_default();
            // Its last 3000 bytes, from the first whole line in them; after the reason's line.
            let start = text.len().saturating_sub(3000);
            let whole = if start == 0 {
                start
            } else {
                text[start..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(start, |at| start + at + 1)
            };
            String::from_utf8_lossy(&text[whole..]).into_owned()
        };
        let started = Instant::now();
        let t0 = loop {
            if let Some(first) = read_steps(&out.join("steps_0")).first() {
                break first.start;
            }
            if let Some(status) = child.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("it ended before training ({status})\n{}", tail()));
            }
            if started.elapsed() > FIRST_STEP_LIMIT {
                return Err(format!("no step within {FIRST_STEP_LIMIT:?}\n{}", tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stop_at = t0 + self.seconds.as_secs_f64();
        let mut kills = 0;
        let mut last_killed: Option<u32> = None;
        let mut next_kill = t0 + self.every.as_secs_f64();
        while now() < stop_at {
            if let Some(status) = child.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("it ended under chaos ({status})\n{}", tail()));
            }
            if now() >= next_kill {
                let rank = kills % 2;
                let pid = std::fs::read_to_string(out.join(format!("pid_{}", 1 - rank)))
                    .ok()
                    .and_then(|p| p.trim().parse::<u32>().ok())
                    .filter(|pid| Some(*pid) != last_killed && alive(*pid));
                if let Some(pid) = pid {
                    let _ = Command::new("kill")
                        .args(["-s", "KILL", "--", &pid.to_string()])
                        .status();
                    last_killed = Some(pid);
                    kills += 1;
                    next_kill += self.every.as_secs_f64();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::write(out.join("stop"), b"").map_err(|e| e.to_string())?;
        let deadline = Instant::now() + STOP_LIMIT;
        let status = loop {
            if let Some(status) = child.child.try_wait().map_err(|e| e.to_string())? {
                break status;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "it did not end within {STOP_LIMIT:?} of the stop\n{}",
                    tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            return Err(format!("it failed ({status})\n{}", tail()));
        }
        Ok(Outcome::of(
            &read_steps(&out.join("steps_0")),
            t0,
            stop_at,
            kills,
        ))
    }
}

/// A child that, when dropped, is asked to end if it has not (SIGINT, as Ctrl-C: trainyard's
/// driver then stops its run and releases what it holds), then killed past [`SIGNAL_GRACE`]
/// with its process group and descendants; and whose Slurm job, if one is left, is cancelled.
struct Reaped<'a> {
    child: Child,
    /// The name of the Slurm job its run holds, if any.
    slurm_job: Option<&'a str>,
}

impl Drop for Reaped<'_> {
    fn drop(&mut self) {
        let running = |child: &mut Child| matches!(child.try_wait(), Ok(None));
        if running(&mut self.child) {
            let _ = Command::new("kill")
                .args(["-s", "INT", "--", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + SIGNAL_GRACE;
            while running(&mut self.child) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        kill_tree(self.child.id());
        let _ = self.child.wait();
        if let Some(name) = self.slurm_job {
            cancel_slurm_job(name);
        }
    }
}

/// Cancels this user's Slurm jobs named `name`, and waits up to 30 s for them to leave the
/// queue; says so if one does not.
fn cancel_slurm_job(name: &str) {
    let listed = || {
        Command::new("squeue")
            .args(["--me", "-h", "-o", "%i", "--name", name])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    if listed().is_empty() {
        return;
    }
    let _ = Command::new("scancel")
        .args(["--me", "--name", name])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = listed();
        if left.is_empty() {
            eprintln!("the Slurm job named {name} that the run left is cancelled");
            return;
        }
        if Instant::now() > deadline {
            eprintln!("the Slurm job named {name} is still queued after scancel: {left}");
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether `pid` is a live process (not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One line of a rank's step log.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    step: u64,
    start: f64,
    end: f64,
}

/// The lines of a step log (`<step> <start> <end> <pid>`); a torn last line is left out.
fn read_steps(path: &Path) -> Vec<Step> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let step = words.next()?.parse().ok()?;
            let start = words.next()?.parse().ok()?;
            let end = words.next()?.parse().ok()?;
            words.next()?;
            Some(Step { step, start, end })
        })
        .collect()
}

/// What one contender's chaos came to.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// Surviving step time over the wall time, from the first step to the stop.
    goodput: f64,
    /// Kills that landed.
    kills: usize,
    /// Distinct steps done by the stop.
    steps: usize,
    /// Step runs that were run again later (lost).
    lost: usize,
}

impl Outcome {
    /// From rank 0's steps (in the order they were logged), the first step's start `t0`,
    /// the stop and the kills that landed.
    fn of(steps: &[Step], t0: f64, stop: f64, kills: usize) -> Self {
        let done: Vec<&Step> = steps.iter().filter(|s| s.end <= stop).collect();
        let mut last: std::collections::BTreeMap<u64, &Step> = std::collections::BTreeMap::new();
        for step in &done {
            last.insert(step.step, step);
        }
        let surviving: f64 = last.values().map(|s| s.end - s.start).sum();
        Self {
            goodput: surviving / (stop - t0),
            kills,
            steps: last.len(),
            lost: done.len() - last.len(),
        }
    }

    fn lost_per_failure(&self) -> f64 {
        if self.kills == 0 {
            0.0
        } else {
            self.lost as f64 / self.kills as f64
        }
    }
}

/// The README's table, markers included.
fn table(root: &Path, chaos: &Chaos, rows: &[(&str, Result<Outcome, String>)]) -> String {
    let mut table = format!(
        "{README_START}\nMeasured with `cargo xtask bench-chaos` ({}; one run each, 2 cores): `benches/python/chaos.py`, 2 gloo ranks, a step ≈ 50 ms, a checkpoint handed in every step (`ASYNC` where the API has it), one rank SIGKILLed every {:.0} s for {:.0} s.\n\n\
         | program | kills landed | goodput | steps lost per failure |\n\
         |---|---|---|---|\n",
        stamp(root),
        chaos.every.as_secs_f64(),
        chaos.seconds.as_secs_f64()
    );
    for (row, outcome) in rows {
        match outcome {
            Ok(o) => table.push_str(&format!(
                "| {row} | {} | {:.1} % | {:.1} |\n",
                o.kills,
                o.goodput * 100.0,
                o.lost_per_failure()
            )),
            Err(why) => {
                let why: String = why.lines().next().unwrap_or("").chars().take(160).collect();
                table.push_str(&format!("| {row} | — | not measured: {why} | — |\n"));
            }
        }
    }
    table.push_str(
        "| torchft's published chaos runs (anchor, not run here) | one failure per 60 s | 82 % of steps committed | — |\n",
    );
    table.push_str(README_END);
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, start: f64) -> Step {
        Step {
            step,
            start,
            end: start + 0.05,
        }
    }

    #[test]
    fn a_step_run_again_after_a_restart_is_lost_and_only_its_last_run_counts() {
        // Steps 0..4 from t=0; a kill at 0.22 loses step 4 (never committed); the restart
        // takes 0.3 s and runs steps 3 and 4 again.
        let mut steps: Vec<Step> = (0..5).map(|i| step(i, 0.05 * i as f64)).collect();
        steps.push(step(3, 0.55));
        steps.push(step(4, 0.60));
        // Logged after the stop: not counted.
        steps.push(step(5, 0.98));
        let outcome = Outcome::of(&steps, 0.0, 1.0, 1);
        assert_eq!(outcome.steps, 5);
        assert_eq!(outcome.lost, 2);
        assert!((outcome.goodput - 0.25).abs() < 1e-9, "{outcome:?}");
        assert!((outcome.lost_per_failure() - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_torn_last_line_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps_0");
        std::fs::write(&path, "0 1.0 1.05 42\n1 1.05 1.1 42\n2 1.1").unwrap();
        assert_eq!(read_steps(&path).len(), 2);
    }
}
