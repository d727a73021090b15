//! `cargo xtask bench-e2e`: whole runs timed side by side, interleaved round by round so that
//! a busy machine slows every contender alike.
//!
//! 1. `examples/torch_ddp.py` on 2 workers: `trainyard run -n 2` vs `torchrun
//!    --nproc-per-node 2` vs two processes started by hand with the environment set.
//! 2. From one rank's crash to every rank stopped (`trainyard run` exits).
//! 3. Start and stop of 64 workers of `true`, against 64 `true` processes spawned by hand.
//! 4. An elastic run (`-n 1:4`) growing from 2 to 4 workers: from the exit of the run that
//!    held the other two CPUs to all 4 ranks running again from the checkpoint.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ROUNDS: usize = 7;

pub(crate) fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Runs `command` to its end, quietly; its wall time, or why it failed.
pub(crate) fn timed(command: &mut Command) -> Result<Duration, String> {
    let started = Instant::now();
    let out = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(started.elapsed())
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Two ranks of the example started by hand with torchrun's environment.
fn by_hand(python: &Path, root: &Path) -> Result<Duration, String> {
    let port = free_port()?.to_string();
    let started = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(python)
                .arg("examples/torch_ddp.py")
                .current_dir(root)
                .envs([
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", port.as_str()),
                    ("RANK", &rank.to_string()),
                    ("LOCAL_RANK", &rank.to_string()),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_WORLD_SIZE", "2"),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", python.display()))
        })
        .collect::<Result<_, _>>()?;
    for mut child in children {
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("a hand-started rank failed: {status}"));
        }
    }
    Ok(started.elapsed())
}

fn python_env(root: &Path) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(root.join("scripts/python-env.sh"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run scripts/python-env.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("scripts/python-env.sh failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| "scripts/python-env.sh printed no interpreter".to_owned())
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// One rank crashes; the time from its crash to `trainyard run` having stopped every rank.
fn crash_to_stop(trainyard: &Path) -> Result<Duration, String> {
    let out = Command::new(trainyard)
        .args(["run", "-n", "2", "-r", "CPU=0.5", "--backend", "none", "--"])
        .args([
            "sh",
            "-c",
            "if [ $TRAINYARD_WORLD_RANK = 0 ]; then sleep 1; date +%s.%N; kill -9 $$; fi; exec sleep 60",
        ])
        .env("CI", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let ended = now_secs();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let crashed: f64 = stdout
        .lines()
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .ok_or_else(|| format!("no crash time in {stdout}"))?;
    Ok(Duration::from_secs_f64((ended - crashed).max(0.0)))
}

/// Rank 1 sleeps and rank 0 waits in `all_reduce` (`crates/cli/tests/python/hang.py`); with
/// `--hang-timeout 10s --progress output` the deadline passes 10 s after the first rank's
/// `ready` line (10 s: importing torch and joining the group, silent, must fit in it on a
/// slow machine). The time from then to `trainyard run` having printed every rank's stacks
/// and stopped every rank.
fn hang_to_stop(trainyard: &Path, python: &Path, root: &Path) -> Result<Duration, String> {
    let timeout = 10.0;
    let out = Command::new(trainyard)
        .current_dir(root)
        .args(["run", "-n", "2", "-r", "CPU=0.5", "--progress", "output"])
        .args(["--hang-timeout", &format!("{timeout}s"), "--"])
        .arg(python)
        .arg("crates/cli/tests/python/hang.py")
        .env("CI", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let ended = now_secs();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.contains("every rank's stacks") {
        return Err(format!("no stacks were printed:\n{stderr}"));
    }
    let ready = stdout
        .lines()
        .filter(|l| l.contains(" ready "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::min)
        .ok_or_else(|| format!("no ready line in {stdout}"))?;
    Ok(Duration::from_secs_f64((ended - ready - timeout).max(0.0)))
}

/// `--resize-interval` of the elastic run.
const RESIZE_INTERVAL: &str = "2s";

/// A run holds 2 of 4 CPUs (through a ledger of its own) while an elastic `-n 1:4` run starts
/// with the other 2 and checkpoints every step; the time from the holder's exit to the 4th
/// rank's task started in the elastic run's next attempt.
fn elastic_grow(trainyard: &Path, root: &Path) -> Result<Duration, String> {
    use std::io::{BufRead as _, BufReader};
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let release = dir.path().join("release");
    let run = |args: &[&str]| {
        let mut command = Command::new(trainyard);
        command
            .current_dir(root)
            .args(["run", "--num-cpus", "4", "--backend", "none", "-r", "CPU=1"])
            .args(["--log-format", "json"])
            .args(args)
            .env("TRAINYARD_LEDGER", dir.path().join("ledger"))
            .env("TRAINYARD_STORAGE", dir.path().join("results"))
            .env("CI", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        command.spawn().map_err(|e| e.to_string())
    };
    let wait = format!("while [ ! -e {} ]; do sleep 0.02; done", release.display());
    let mut holder = run(&["-n", "2", "--", "sh", "-c", &wait])?;
    let holder_out = holder.stdout.take().ok_or("no stdout")?;
    BufReader::new(holder_out)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains(r#""event":"attempt_started""#))
        .ok_or("the holder did not start")?;
    let mut elastic = run(&[
        "-n",
        "1:4",
        "--resize-interval",
        RESIZE_INTERVAL,
        "--env",
        "ELASTIC_STEPS=30",
        "--",
        "python3",
        "crates/cli/tests/python/elastic.py",
    ])?;
    let mut lines = BufReader::new(elastic.stdout.take().ok_or("no stdout")?)
        .lines()
        .map_while(Result::ok);
    lines
        .find(|l| l.contains(r#""event":"checkpoint_committed""#))
        .ok_or("the elastic run committed no checkpoint")?;
    std::fs::write(&release, "").map_err(|e| e.to_string())?;
    holder.wait().map_err(|e| e.to_string())?;
    let room = Instant::now();
    lines
        .find(|l| l.contains(r#""event":"attempt_started""#) && l.contains(r#""world_size":4"#))
        .ok_or("the elastic run did not grow")?;
    let mut started = 0;
    for line in lines.by_ref() {
        started += usize::from(line.contains(r#""event":"task_started""#));
        if started == 4 {
            break;
        }
    }
    let grown = room.elapsed();
    let rest: Vec<String> = lines.collect();
    let status = elastic.wait().map_err(|e| e.to_string())?;
    if started < 4 || !status.success() {
        return Err(format!(
            "the elastic run did not end well ({status}): {rest:?}"
        ));
    }
    Ok(grown)
}

fn many_true(trainyard: &Path) -> Result<Duration, String> {
    timed(
        Command::new(trainyard)
            .args([
                "run",
                "-n",
                "64",
                "-r",
                "CPU=0.01",
                "--backend",
                "none",
                "--",
                "true",
            ])
            .env("CI", "1"),
    )
}

fn many_true_by_hand() -> Result<Duration, String> {
    let started = Instant::now();
    let children: Vec<_> = (0..64)
        .map(|_| Command::new("true").spawn().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for mut child in children {
        child.wait().map_err(|e| e.to_string())?;
    }
    Ok(started.elapsed())
}

pub(crate) fn run() -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let python = python_env(&root)?;
    let torchrun = python.with_file_name("torchrun");

    let (mut ours, mut theirs, mut hand) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        ours.push(timed(
            Command::new(&trainyard)
                .current_dir(&root)
                .args(["run", "-n", "2", "-r", "CPU=0.5", "--"])
                .arg(&python)
                .arg("examples/torch_ddp.py")
                .env("CI", "1"),
        )?);
        theirs.push(timed(Command::new(&torchrun).current_dir(&root).args([
            "--nproc-per-node",
            "2",
            "examples/torch_ddp.py",
        ]))?);
        hand.push(by_hand(&python, &root)?);
        eprintln!(
            "round {round}: trainyard {:.2}s  torchrun {:.2}s  by hand {:.2}s",
            secs(ours[round - 1]),
            secs(theirs[round - 1]),
            secs(hand[round - 1])
        );
    }
    let (ours, theirs, hand) = (median(ours), median(theirs), median(hand));
    println!("torch_ddp.py, 2 workers, median of {ROUNDS} interleaved rounds:");
    println!("  trainyard run -n 2          {:.2}s", secs(ours));
    println!("  torchrun --nproc-per-node 2 {:.2}s", secs(theirs));
    println!("  two processes by hand       {:.2}s", secs(hand));
    println!(
        "  trainyard / by hand = {:.2} (target <= 1.05); trainyard / torchrun = {:.2} (target <= 0.65)",
        secs(ours) / secs(hand),
        secs(ours) / secs(theirs)
    );

    let crashes: Vec<Duration> = (0..ROUNDS)
        .map(|_| crash_to_stop(&trainyard))
        .collect::<Result<_, _>>()?;
    println!(
        "crash of one rank to every rank stopped and the driver exited: median {:.0} ms (target < 100 ms plus the SIGTERM patience, which `exec sleep` does not use)",
        median(crashes).as_secs_f64() * 1000.0
    );

    let hangs: Vec<Duration> = (0..ROUNDS)
        .map(|_| hang_to_stop(&trainyard, &python, &root))
        .collect::<Result<_, _>>()?;
    println!(
        "hang of one rank (torch, 2 ranks): deadline passing to every rank's stacks printed and every rank stopped: median {:.0} ms (target < 2000 ms)",
        median(hangs).as_secs_f64() * 1000.0
    );

    let grows: Vec<Duration> = (0..ROUNDS)
        .map(|_| elastic_grow(&trainyard, &root))
        .collect::<Result<_, _>>()?;
    println!(
        "elastic run -n 1:4 growing from 2 to 4 workers: the other run's exit to 4 ranks running from the checkpoint: median {:.0} ms (target <= --resize-interval {RESIZE_INTERVAL} + 1 s)",
        median(grows).as_secs_f64() * 1000.0
    );

    let (mut runs, mut spawns) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        runs.push(many_true(&trainyard)?);
        spawns.push(many_true_by_hand()?);
    }
    let (run, spawn) = (median(runs), median(spawns));
    println!(
        "64 workers of `true`: trainyard {:.0} ms, 64 spawns by hand {:.0} ms: {:.2} ms per worker beyond process spawn (target < 5 ms)",
        run.as_secs_f64() * 1000.0,
        spawn.as_secs_f64() * 1000.0,
        (run.saturating_sub(spawn)).as_secs_f64() * 1000.0 / 64.0
    );
    Ok(())
}
