//! `cargo xtask bench-e2e`: whole runs timed side by side, interleaved round by round so that
//! a busy machine slows every contender alike.
//!
//! 1. `examples/torch_ddp.py` on 2 workers: `trainyard run -n 2` vs `torchrun
//!    --nproc-per-node 2` vs two processes started by hand with the environment set.
//! 2. From one rank's crash to every rank stopped (`trainyard run` exits).
//! 3. From a rank's hang deadline to every rank's stacks printed and every rank stopped.
//! 4. From one of 2 torch ranks SIGKILLed to both ranks' first `all_reduce` after the
//!    restart, against `torchrun --max-restarts 1`.
//! 5. Start and stop of 64 workers of `true`, against 64 `true` processes spawned by hand.
//! 6. An elastic run (`-n 1:4`) growing from 2 to 4 workers: from the exit of the run that
//!    held the other two CPUs to all 4 ranks running again from the checkpoint.
//!
//! Then where the launch goes, phase by phase (`trainyard run --timings`), for the torch job
//! and the 64 workers. Every figure is printed with the date and the commit it was measured
//! at. `--against BIN` times another build of `trainyard` (the parent commit's, say) in the
//! same rounds as this one, row by row; `--readme` writes the figures into the README's table.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ROUNDS: usize = 7;

/// How many `--timings` runs each phase figure is the median of.
const TIMINGS_ROUNDS: usize = 5;

/// The README's table of these figures lies between these lines.
const README_START: &str = "<!-- bench-e2e: written by `cargo xtask bench-e2e --readme` -->";
const README_END: &str = "<!-- /bench-e2e -->";

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

pub(crate) fn python_env(root: &Path) -> Result<PathBuf, String> {
    script_python(root, "scripts/python-env.sh")
}

/// The interpreter that `script` (one of the project's environment scripts, which installs
/// what is missing) prints on its last line.
pub(crate) fn script_python(root: &Path, script: &str) -> Result<PathBuf, String> {
    let out = Command::new("bash")
        .arg(root.join(script))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{script} failed ({})", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| format!("{script} printed no interpreter"))
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

/// Rank 1 SIGKILLs itself after some `all_reduce`s (`crates/cli/tests/python/restart.py`);
/// `command` restarts the ranks once. The time from the kill to both ranks' first
/// `all_reduce` of the next attempt.
pub(crate) fn kill_to_training(command: &mut Command) -> Result<Duration, String> {
    let out = output_within(command.env("CI", "1"), RESTART_LIMIT)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last_word = |line: &str| line.rsplit(' ').next()?.parse::<f64>().ok();
    let killed = stdout
        .lines()
        .filter(|l| l.contains("killed "))
        .find_map(last_word)
        .ok_or_else(|| format!("no kill time in {stdout}\n{stderr}"))?;
    let again: Vec<f64> = stdout
        .lines()
        .filter(|l| l.contains("first all_reduce 1 "))
        .filter_map(last_word)
        .collect();
    if again.len() != 2 || !out.status.success() {
        return Err(format!(
            "the ranks did not both train again ({}): {stdout}\n{stderr}",
            out.status
        ));
    }
    let last = again.into_iter().fold(f64::MIN, f64::max);
    Ok(Duration::from_secs_f64((last - killed).max(0.0)))
}

/// How long one run of the restart script may take: torchrun's restarted ranks were seen
/// to hang in their rendezvous for good.
const RESTART_LIMIT: Duration = Duration::from_secs(90);

/// Runs `command` in a process group of its own, with its output; the whole group is killed
/// (torchrun and its workers) when it runs past `limit`, and that is an error.
fn output_within(command: &mut Command, limit: Duration) -> Result<std::process::Output, String> {
    use std::os::unix::process::CommandExt as _;
    let mut child = command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            kill_tree(child.id());
            let _ = child.wait();
            return Err(format!("{command:?} ran past {limit:?} and was killed"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// SIGKILLs `pid`'s process group and every descendant of `pid`: torchrun starts each worker
/// in a session of its own, and trainyard's Python driver its binary.
pub(crate) fn kill_tree(pid: u32) {
    // `kill -KILL -PGID` without `--` kills nothing: procps reads `-PGID` as an option.
    let mut pids: Vec<String> = descendants(pid)
        .into_iter()
        .map(|pid| pid.to_string())
        .collect();
    pids.push(format!("-{pid}"));
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--"])
        .args(&pids)
        .stderr(Stdio::null())
        .status();
}

/// The processes descended from `pid`, found through each process's parent in `/proc`.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let parent = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((child, parent))
        })
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let of = found[i];
        found.extend(parents.iter().filter(|(_, p)| *p == of).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// `trainyard run` of the restart script on the local runtime, restarting once, its run
/// folder under `storage`; its ranks forked from a warm Python that imported torch
/// (`--warm-python torch`) when `warm`.
fn restart_command(
    trainyard: &Path,
    python: &Path,
    root: &Path,
    storage: &Path,
    warm: bool,
) -> Command {
    restart_on("local", trainyard, python, root, storage, warm)
}

/// [`restart_command`] on `runtime` (`local`, `ray` or `slurm`); on Ray and Slurm each rank
/// has 1 GiB and the two are spread over two nodes where the cluster has them.
pub(crate) fn restart_on(
    runtime: &str,
    trainyard: &Path,
    python: &Path,
    root: &Path,
    storage: &Path,
    warm: bool,
) -> Command {
    let mut command = Command::new(trainyard);
    command
        .current_dir(root)
        .args([
            "run",
            "--runtime",
            runtime,
            "-n",
            "2",
            "--max-failures",
            "1",
        ])
        .arg("--storage")
        .arg(storage);
    if runtime == "local" {
        command.args(["-r", "CPU=0.5"]);
    } else {
        // A Slurm step without memory gets the partition's default (256 MiB on the test
        // cluster): too little for torch, let alone a warm Python that imported it.
        command.args(["-r", "CPU=0.5,memory=1GiB", "-s", "SPREAD"]);
    }
    if warm {
        command.args(["--warm-python", "torch"]);
    }
    command
        .arg("--")
        .arg(python)
        .arg("crates/cli/tests/python/restart.py");
    command
}

/// How many times one round runs torchrun's restart before it gives up on it.
const TORCHRUN_TRIES: usize = 3;

/// torchrun's restarts of the restart row: how many tries worked, and their median.
struct TorchrunRestarts {
    worked: usize,
    tries: usize,
    median: Option<Duration>,
}

impl TorchrunRestarts {
    /// `2104 ms, 7 of 15 restarts worked`.
    fn said(&self) -> String {
        let worked = if self.worked == self.tries {
            format!("{} of {} restarts worked", self.worked, self.tries)
        } else {
            format!(
                "{} of {} restarts worked (the others: gloo could not connect the restarted ranks)",
                self.worked, self.tries
            )
        };
        match self.median {
            Some(median) => format!("{:.0} ms, {worked}", ms(median)),
            None => worked,
        }
    }
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

fn many_true(trainyard: &Path) -> Command {
    let mut command = Command::new(trainyard);
    command
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
        .env("CI", "1");
    command
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

/// The medians of one run of the bench.
struct Figures {
    /// When and at what commit they were measured.
    stamp: String,
    ddp: Duration,
    torchrun: Duration,
    by_hand: Duration,
    crash: Duration,
    hang: Duration,
    restart: Duration,
    /// The same restart with `--warm-python torch`.
    warm_restart: Duration,
    torchrun_restart: TorchrunRestarts,
    grow: Duration,
    many: Duration,
    spawns: Duration,
    /// Phase medians of the 2-worker torch job and of the 64 workers of `true`.
    ddp_phases: Vec<PhaseFigure>,
    many_phases: Vec<PhaseFigure>,
}

/// `DATE, commit SHA` (with `+ changes` when the work tree has uncommitted ones).
pub(crate) fn stamp(root: &Path) -> String {
    let out = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let date = out("date", &["-u", "+%Y-%m-%d"]);
    let commit = out("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !out("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    format!(
        "{date}, commit {commit}{}",
        if dirty { " + uncommitted changes" } else { "" }
    )
}

/// The torch example's run through `trainyard`.
fn ddp_command(trainyard: &Path, python: &Path, root: &Path) -> Command {
    let mut command = Command::new(trainyard);
    command
        .current_dir(root)
        .args(["run", "-n", "2", "-r", "CPU=0.5", "--"])
        .arg(python)
        .arg("examples/torch_ddp.py")
        .env("CI", "1");
    command
}

/// One phase's medians over [`TIMINGS_ROUNDS`] runs.
struct PhaseFigure {
    label: String,
    wall_ms: f64,
    /// The slowest worker's, for a phase done once per worker.
    slowest_ms: Option<f64>,
}

impl PhaseFigure {
    fn shown(&self) -> String {
        match self.slowest_ms {
            Some(slowest) => format!("{:.1} ms (slowest worker {slowest:.1} ms)", self.wall_ms),
            None => format!("{:.1} ms", self.wall_ms),
        }
    }
}

fn median_f64(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(0.0)
}

/// Each launch phase of `make()`'s run, with `--timings --log-format json` added after `run`,
/// the median over [`TIMINGS_ROUNDS`] runs; the launch as a whole first.
fn phases(mut make: impl FnMut() -> Command) -> Result<Vec<PhaseFigure>, String> {
    // Per phase: its label, wall times and slowest workers' times.
    let mut seen: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for _ in 0..TIMINGS_ROUNDS {
        let mut command = make();
        let mut args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
        args.splice(
            1..1,
            ["--timings".into(), "--log-format".into(), "json".into()],
        );
        let mut timed = Command::new(command.get_program());
        timed.args(args).envs(
            command
                .get_envs()
                .filter_map(|(key, value)| Some((key.to_owned(), value?.to_owned()))),
        );
        if let Some(dir) = command.get_current_dir() {
            timed.current_dir(dir);
        }
        command = timed;
        let out = command
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {command:?}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{command:?} failed ({})", out.status));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let timings = trainyard_test_support::processes::json_events(&stdout)
            .into_iter()
            .find(|event| event["event"] == "timings")
            .ok_or_else(|| format!("{command:?} printed no timings event"))?;
        let attempt = &timings["attempts"][0];
        let launch = ("launch".to_owned(), attempt["launch_ms"].as_f64(), None);
        let rows = attempt["phases"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|phase| {
                let label = phase["label"].as_str().unwrap_or("?");
                let label = match phase["part_of"].as_str() {
                    Some(_) => format!("… {label}"),
                    None => label.to_owned(),
                };
                (
                    label,
                    phase["wall_ms"].as_f64(),
                    phase["workers"]["max_ms"].as_f64(),
                )
            });
        for (i, (label, wall, slowest)) in std::iter::once(launch).chain(rows).enumerate() {
            if seen.len() == i {
                seen.push((label, Vec::new(), Vec::new()));
            }
            seen[i].1.extend(wall);
            seen[i].2.extend(slowest);
        }
    }
    Ok(seen
        .into_iter()
        .map(|(label, walls, slowest)| PhaseFigure {
            label,
            wall_ms: median_f64(walls),
            slowest_ms: (!slowest.is_empty()).then(|| median_f64(slowest)),
        })
        .collect())
}

/// `--against BIN`: the same rounds with another build, for a side-by-side comparison.
struct Against {
    trainyard: PathBuf,
    ddp: Vec<Duration>,
    restart: Vec<Duration>,
    many: Vec<Duration>,
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut against: Option<Against> = None;
    let mut readme = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--readme" => readme = true,
            "--against" => {
                let bin = args
                    .next()
                    .ok_or("--against needs the path of another trainyard binary")?;
                let trainyard =
                    std::fs::canonicalize(bin).map_err(|e| format!("--against {bin}: {e}"))?;
                against = Some(Against {
                    trainyard,
                    ddp: Vec::new(),
                    restart: Vec::new(),
                    many: Vec::new(),
                });
            }
            other => {
                return Err(format!(
                    "unknown argument {other}: expected --against BIN or --readme"
                ));
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let python = python_env(&root)?;
    let torchrun = python.with_file_name("torchrun");
    let stamp = stamp(&root);
    println!("measured {stamp}");

    let (mut ours, mut theirs, mut hand) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        ours.push(timed(&mut ddp_command(&trainyard, &python, &root))?);
        theirs.push(timed(Command::new(&torchrun).current_dir(&root).args([
            "--nproc-per-node",
            "2",
            "examples/torch_ddp.py",
        ]))?);
        hand.push(by_hand(&python, &root)?);
        if let Some(against) = &mut against {
            against
                .ddp
                .push(timed(&mut ddp_command(&against.trainyard, &python, &root))?);
        }
        eprintln!(
            "round {round}: trainyard {:.2}s  torchrun {:.2}s  by hand {:.2}s{}",
            secs(ours[round - 1]),
            secs(theirs[round - 1]),
            secs(hand[round - 1]),
            against.as_ref().map_or_else(String::new, |a| format!(
                "  --against {:.2}s",
                secs(a.ddp[round - 1])
            ))
        );
    }
    let (ddp, torchrun_median, by_hand_median) = (median(ours), median(theirs), median(hand));
    println!("torch_ddp.py, 2 workers, median of {ROUNDS} interleaved rounds ({stamp}):");
    println!("  trainyard run -n 2          {:.2}s", secs(ddp));
    println!(
        "  torchrun --nproc-per-node 2 {:.2}s",
        secs(torchrun_median)
    );
    println!("  two processes by hand       {:.2}s", secs(by_hand_median));
    println!(
        "  trainyard / by hand = {:.2} (target <= 1.05); trainyard / torchrun = {:.2} (target <= 0.65)",
        secs(ddp) / secs(by_hand_median),
        secs(ddp) / secs(torchrun_median)
    );
    if let Some(against) = &against {
        let theirs = median(against.ddp.clone());
        println!(
            "  {} {:.2}s: this build / that one = {:.3}",
            against.trainyard.display(),
            secs(theirs),
            secs(ddp) / secs(theirs)
        );
    }

    let crashes: Vec<Duration> = (0..ROUNDS)
        .map(|_| crash_to_stop(&trainyard))
        .collect::<Result<_, _>>()?;
    let crash = median(crashes);
    println!(
        "crash of one rank to every rank stopped and the driver exited: median {:.0} ms (target < 100 ms plus the SIGTERM patience, which `exec sleep` does not use) ({stamp})",
        crash.as_secs_f64() * 1000.0
    );

    let hangs: Vec<Duration> = (0..ROUNDS)
        .map(|_| hang_to_stop(&trainyard, &python, &root))
        .collect::<Result<_, _>>()?;
    let hang = median(hangs);
    println!(
        "hang of one rank (torch, 2 ranks): deadline passing to every rank's stacks printed and every rank stopped: median {:.0} ms (target < 2000 ms) ({stamp})",
        hang.as_secs_f64() * 1000.0
    );

    let storage = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (mut ours, mut warm, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    let mut torchrun_tries = 0;
    for _ in 0..ROUNDS {
        ours.push(kill_to_training(&mut restart_command(
            &trainyard,
            &python,
            &root,
            storage.path(),
            false,
        ))?);
        warm.push(kill_to_training(&mut restart_command(
            &trainyard,
            &python,
            &root,
            storage.path(),
            true,
        ))?);
        // torchrun's restarted gloo ranks often cannot connect to each other (its store
        // keeps the peers' addresses of the attempt before): a round tries it up to
        // TORCHRUN_TRIES times, and the failures are counted.
        for _ in 0..TORCHRUN_TRIES {
            torchrun_tries += 1;
            let tried = kill_to_training(Command::new(&torchrun).current_dir(&root).args([
                "--standalone",
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "1",
                "crates/cli/tests/python/restart.py",
            ]));
            if let Ok(time) = tried {
                theirs.push(time);
                break;
            }
        }
        if let Some(against) = &mut against {
            against.restart.push(kill_to_training(&mut restart_command(
                &against.trainyard,
                &python,
                &root,
                storage.path(),
                false,
            ))?);
        }
    }
    let restart = median(ours);
    let warm_restart = median(warm);
    let torchrun_restart = TorchrunRestarts {
        worked: theirs.len(),
        tries: torchrun_tries,
        median: (!theirs.is_empty()).then(|| median(theirs)),
    };
    println!(
        "rank 1 of 2 SIGKILLed → both ranks' first all_reduce after the restart: trainyard --warm-python torch {:.0} ms (target <= 500 ms), cold {:.0} ms; torchrun --standalone --max-restarts 1: {} ({stamp})",
        ms(warm_restart),
        ms(restart),
        torchrun_restart.said()
    );
    if let Some(against) = &against {
        let theirs = median(against.restart.clone());
        println!(
            "  {} {:.0} ms: this build / that one = {:.3}",
            against.trainyard.display(),
            ms(theirs),
            secs(restart) / secs(theirs)
        );
    }

    let grows: Vec<Duration> = (0..ROUNDS)
        .map(|_| elastic_grow(&trainyard, &root))
        .collect::<Result<_, _>>()?;
    let grow = median(grows);
    println!(
        "elastic run -n 1:4 growing from 2 to 4 workers: the other run's exit to 4 ranks running from the checkpoint: median {:.0} ms (target <= --resize-interval {RESIZE_INTERVAL} + 1 s) ({stamp})",
        grow.as_secs_f64() * 1000.0
    );

    let (mut runs, mut spawns) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        runs.push(timed(&mut many_true(&trainyard))?);
        spawns.push(many_true_by_hand()?);
        if let Some(against) = &mut against {
            against
                .many
                .push(timed(&mut many_true(&against.trainyard))?);
        }
    }
    let (many, spawn) = (median(runs), median(spawns));
    println!(
        "64 workers of `true`: trainyard {:.0} ms, 64 spawns by hand {:.0} ms: {:.2} ms per worker beyond process spawn (target < 5 ms) ({stamp})",
        ms(many),
        ms(spawn),
        per_worker(many, spawn)
    );
    if let Some(against) = &against {
        let theirs = median(against.many.clone());
        println!(
            "  {} {:.0} ms ({:.2} ms per worker): this build / that one = {:.3}",
            against.trainyard.display(),
            ms(theirs),
            per_worker(theirs, spawn),
            secs(many) / secs(theirs)
        );
    }

    let ddp_phases = phases(|| ddp_command(&trainyard, &python, &root))?;
    let many_phases = phases(|| many_true(&trainyard))?;
    for (what, phases) in [
        ("torch_ddp.py, 2 workers", &ddp_phases),
        ("64 workers of `true`", &many_phases),
    ] {
        println!("where the launch goes, {what} (median of {TIMINGS_ROUNDS} runs with --timings):");
        for phase in phases {
            println!("  {:<40} {}", phase.label, phase.shown());
        }
    }

    let figures = Figures {
        stamp,
        ddp,
        torchrun: torchrun_median,
        by_hand: by_hand_median,
        crash,
        hang,
        restart,
        warm_restart,
        torchrun_restart,
        grow,
        many,
        spawns: spawn,
        ddp_phases,
        many_phases,
    };
    if readme {
        write_readme(&root.join("README.md"), &figures.table())?;
        println!("README.md: the table between `{README_START}` and `{README_END}` is rewritten");
    }
    Ok(())
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Milliseconds per worker that `run` of 64 workers took beyond spawning 64 processes.
fn per_worker(run: Duration, spawn: Duration) -> f64 {
    ms(run.saturating_sub(spawn)) / 64.0
}

impl Figures {
    /// The README's table, between its markers.
    fn table(&self) -> String {
        let mut t = format!(
            "{README_START}\nMeasured with `cargo xtask bench-e2e` ({}; {ROUNDS} interleaved rounds, medians, 2 cores):\n\n",
            self.stamp
        );
        t.push_str("| job | time | ratio |\n|---|---|---|\n");
        t.push_str(&format!(
            "| `examples/torch_ddp.py`, `trainyard run -n 2` | {:.2} s | {:.2} × two processes started by hand ({:.2} s) |\n",
            secs(self.ddp),
            secs(self.ddp) / secs(self.by_hand),
            secs(self.by_hand)
        ));
        t.push_str(&format!(
            "| the same, `torchrun --nproc-per-node 2` | {:.2} s | trainyard is {:.2} × torchrun |\n",
            secs(self.torchrun),
            secs(self.ddp) / secs(self.torchrun)
        ));
        t.push_str(&format!(
            "| one rank crashes → every rank stopped, driver exited | {:.0} ms | of which up to 20 ms wait for the other ranks' last lines |\n",
            ms(self.crash)
        ));
        t.push_str(&format!(
            "| one rank hangs (`--hang-timeout`) → every rank's stacks printed, every rank stopped | {:.0} ms | after the deadline; 2 torch ranks, one in `time.sleep`, one in `all_reduce` |\n",
            ms(self.hang)
        ));
        let versus = |ours: Duration| match self.torchrun_restart.median {
            Some(theirs) => format!(
                "{:.2} × `torchrun --standalone --max-restarts 1` ({})",
                secs(ours) / secs(theirs),
                self.torchrun_restart.said()
            ),
            None => format!(
                "`torchrun --standalone --max-restarts 1`: {}",
                self.torchrun_restart.said()
            ),
        };
        t.push_str(&format!(
            "| rank 1 of 2 SIGKILLed → both ranks' first `all_reduce` after the restart (`--max-failures 1 --warm-python torch`) | {:.0} ms | {}; 2 gloo ranks forked from a Python that imported torch (opt-in for scripts) |\n",
            ms(self.warm_restart),
            versus(self.warm_restart),
        ));
        t.push_str(&format!(
            "| the same restart without `--warm-python` (default flags) | {:.0} ms | {}; a script that starts Python and imports torch again |\n",
            ms(self.restart),
            versus(self.restart),
        ));
        t.push_str(&format!(
            "| elastic `-n 1:4` grows from 2 to 4 workers | {:.0} ms | from the other run's exit to 4 ranks running from the checkpoint (`--resize-interval {RESIZE_INTERVAL}`) |\n",
            ms(self.grow)
        ));
        t.push_str(&format!(
            "| start and stop 64 workers of `true` | {:.0} ms | {:.2} ms per worker beyond spawning 64 processes ({:.0} ms) |\n",
            ms(self.many),
            per_worker(self.many, self.spawns),
            ms(self.spawns)
        ));
        t.push_str(&format!(
            "\nWhere the launch goes (`trainyard run --timings`, median of {TIMINGS_ROUNDS} runs each; a phase's wall time, and for a phase done once per worker its slowest worker; the phases marked … are steps of starting the agents):\n\n| phase | `torch_ddp.py`, 2 workers | 64 workers of `true` |\n|---|---|---|\n"
        ));
        for phase in &self.ddp_phases {
            // By name: a job whose ranks print nothing has no first-output phase.
            let many = self
                .many_phases
                .iter()
                .find(|many| many.label == phase.label)
                .map_or_else(|| "—".to_owned(), PhaseFigure::shown);
            t.push_str(&format!(
                "| {} | {} | {many} |\n",
                phase.label,
                phase.shown()
            ));
        }
        t.push_str(README_END);
        t
    }
}

/// Replaces the README's table between [`README_START`] and [`README_END`] with `table`.
fn write_readme(path: &Path, table: &str) -> Result<(), String> {
    replace_block(path, README_START, README_END, table)
}

/// Replaces the block of `path` from the line `start_mark` to `end_mark` (both included) with
/// `block`, which carries the marks again.
pub(crate) fn replace_block(
    path: &Path,
    start_mark: &str,
    end_mark: &str,
    block: &str,
) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (Some(start), Some(end)) = (text.find(start_mark), text.find(end_mark)) else {
        return Err(format!(
            "{} has no `{start_mark}` … `{end_mark}` block to rewrite",
            path.display()
        ));
    };
    let updated = format!("{}{block}{}", &text[..start], &text[end + end_mark.len()..]);
    std::fs::write(path, updated).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_past_its_limit_is_killed_with_the_descendants_in_sessions_of_their_own() {
        let dir = std::env::temp_dir().join(format!("bench-e2e-kill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let pid_file = dir.join("pid");
        // The grandchild leaves the group (setsid), as torchrun's workers do.
        let script = format!(
            "setsid sh -c 'echo $$ > {0}; exec sleep 60' & wait",
            pid_file.display()
        );
        let started = Instant::now();
        let out = output_within(
            Command::new("sh").args(["-c", &script]),
            Duration::from_millis(500),
        );
        assert!(out.is_err(), "it ran past its limit: {out:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .expect("the grandchild's pid")
            .trim()
            .parse()
            .expect("a pid");
        let deadline = Instant::now() + Duration::from_secs(5);
        let alive = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                !stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'))
            })
        };
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(pid), "the grandchild in its own session is gone");
        let _ = std::fs::remove_dir_all(dir);
    }
}
