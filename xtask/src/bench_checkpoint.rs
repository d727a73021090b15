//! `cargo xtask bench-checkpoint`: two figures, each measured side by side in one run.
//!
//! 1. Persisting a 1 GiB checkpoint (two ranks, two 256 MiB files each) into local storage
//!    through `CheckpointWriter`, as two agents do at once, against `cp -r` of the same files
//!    on the same disk; rounds interleaved, each side first in turn, from the same start
//!    (writes synced, page cache dropped, source read back in), medians.
//! 2. The time from a rank's death to every rank running again from a 100 MB checkpoint,
//!    restart back-off excluded, for 2 workers of a real `trainyard run`: rank 1 prints the
//!    time it SIGKILLs itself, each rank of the next attempt prints the time it has read the
//!    checkpoint it resumes from. `--against BIN` runs the same rounds with another build
//!    of `trainyard`, interleaved, each first in turn.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trainyard_checkpoint::{CheckpointWriter, Storage, StorageLocation};

const ROUNDS: usize = 5;
const RESTART_ROUNDS: usize = 5;
const FILE_MIB: usize = 256;

/// The training script of the restart figure.
const RESTART_SCRIPT: &str = r#"
import os, sys, tempfile, time
from trainyard import train

rank = train.get_context().get_world_rank()
checkpoint = train.get_checkpoint()
if checkpoint is not None:
    with checkpoint.as_directory() as d:
        size = sum(len(open(os.path.join(d, f), "rb").read()) for f in os.listdir(d))
    print(f"resumed_at {time.time():.6f} bytes {size}", flush=True)
    sys.exit(0)
flag = os.environ["BENCH_FLAG"]
with tempfile.TemporaryDirectory() as d:
    if rank == 0:
        with open(os.path.join(d, "model.bin"), "wb") as f:
            f.write(os.urandom(100 * 1000 * 1000))
    train.report({"epoch": 1}, checkpoint=train.Checkpoint.from_directory(d) if rank == 0 else None)
if rank == 0:
    open(flag, "w").close()
    time.sleep(120)
else:
    while not os.path.exists(flag):
        time.sleep(0.001)
    print(f"died_at {time.time():.6f}", flush=True)
    os.kill(os.getpid(), 9)
"#;

fn sh(command: &mut Command) -> Result<(), String> {
    let status = command
        .status()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed ({status})"))
    }
}

fn io<T>(what: &str, result: std::io::Result<T>) -> Result<T, String> {
    result.map_err(|e| format!("{what}: {e}"))
}

/// Two ranks' folders of two `FILE_MIB` files each, of incompressible bytes.
fn make_source(dir: &Path) -> Result<u64, String> {
    let mut block = vec![0u8; 1 << 20];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for byte in &mut block {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state.to_le_bytes()[0];
    }
    let mut total = 0;
    for rank in 0..2 {
        let rank_dir = dir.join(format!("rank{rank}"));
        io("make the source", std::fs::create_dir_all(&rank_dir))?;
        for part in ["a", "b"] {
            let path = rank_dir.join(format!("shard_{rank}_{part}.bin"));
            let mut file = io("create a source file", std::fs::File::create(&path))?;
            for i in 0..FILE_MIB {
                block[0] = u8::try_from(i % 256).unwrap_or(0);
                io(
                    "write a source file",
                    std::io::Write::write_all(&mut file, &block),
                )?;
            }
            total += (FILE_MIB as u64) << 20;
        }
    }
    Ok(total)
}

/// Reads every file under `dir`, so that both sides copy from the page cache.
fn warm(dir: &Path) -> Result<(), String> {
    for entry in io("list the source", std::fs::read_dir(dir))? {
        let path = io("list the source", entry)?.path();
        if path.is_dir() {
            warm(&path)?;
        } else {
            let mut file = io("open a source file", std::fs::File::open(&path))?;
            io(
                "read a source file",
                std::io::copy(&mut file, &mut std::io::sink()),
            )?;
        }
    }
    Ok(())
}

fn persist_round(source: &Path, storage: &Path, round: u64) -> Result<Duration, String> {
    let runtime = io(
        "start a runtime",
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    )?;
    let location = StorageLocation::Local(storage.to_path_buf());
    let storage = Storage::open(location, &Default::default()).map_err(|e| e.to_string())?;
    let writer = CheckpointWriter::new(storage.run("bench"));
    let (rank0, rank1) = (source.join("rank0"), source.join("rank1"));
    runtime.block_on(async {
        let started = Instant::now();
        let (a, b) = tokio::join!(writer.persist(round, &rank0), writer.persist(round, &rank1));
        a.map_err(|e| e.to_string())?;
        b.map_err(|e| e.to_string())?;
        Ok(started.elapsed())
    })
}

fn throughput(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / f64::from(1u32 << 20) / time.as_secs_f64()
}

fn persist_figure(work: &Path) -> Result<f64, String> {
    let source = work.join("source");
    let bytes = make_source(&source)?;
    let (mut ours, mut cp, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        let storage = work.join("storage");
        let copy = work.join("copy");
        // Each side goes first in turn, from the same start: the other's writes on disk, the
        // page cache dropped where that is allowed, the source read back in, a second's pause.
        let settle = || -> Result<(), String> {
            sh(&mut Command::new("sync"))?;
            let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
            warm(&source)?;
            std::thread::sleep(Duration::from_secs(1));
            Ok(())
        };
        let cp_run = || -> Result<Duration, String> {
            let started = Instant::now();
            sh(Command::new("cp").arg("-r").arg(&source).arg(&copy))?;
            Ok(started.elapsed())
        };
        if round % 2 == 1 {
            settle()?;
            ours.push(persist_round(&source, &storage, round as u64)?);
            settle()?;
            cp.push(cp_run()?);
        } else {
            settle()?;
            cp.push(cp_run()?);
            settle()?;
            ours.push(persist_round(&source, &storage, round as u64)?);
        }
        let (a, b) = (ours[round - 1], cp[round - 1]);
        ratios.push(b.as_secs_f64() / a.as_secs_f64());
        eprintln!(
            "round {round}: CheckpointWriter {:.0} MiB/s, cp -r {:.0} MiB/s, ratio {:.2}",
            throughput(bytes, a),
            throughput(bytes, b),
            ratios[round - 1]
        );
        let _ = std::fs::remove_dir_all(&storage);
        let _ = std::fs::remove_dir_all(&copy);
    }
    let ours = throughput(bytes, crate::bench_e2e::median(ours));
    let cp = throughput(bytes, crate::bench_e2e::median(cp));
    println!(
        "persisting 1 GiB (2 ranks x 2 x {FILE_MIB} MiB) to local storage, median of {ROUNDS} interleaved rounds:"
    );
    println!("  CheckpointWriter (2 ranks at once)  {ours:.0} MiB/s");
    println!("  cp -r                               {cp:.0} MiB/s");
    println!(
        "  CheckpointWriter / cp -r = {:.2} (target >= 0.8)",
        ours / cp
    );
    Ok(ours / cp)
}

/// One restart: the seconds from rank 1's death to the last rank running again, less the
/// back-off.
fn restart_round(trainyard: &Path, root: &Path, work: &Path, round: usize) -> Result<f64, String> {
    let script = work.join("restart.py");
    io("write the script", std::fs::write(&script, RESTART_SCRIPT))?;
    // A fresh flag for every run, whichever build it is.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let flag = work.join(format!("flag-{round}-{run}"));
    let out = io(
        "run trainyard",
        Command::new(trainyard)
            .current_dir(root)
            .args(["run", "-n", "2", "-r", "CPU=0.5", "--max-failures", "1"])
            .args(["--log-format", "json", "--storage"])
            .arg(work.join("runs"))
            .arg("--")
            .arg("python3")
            .arg(&script)
            .env("BENCH_FLAG", &flag)
            .env("CI", "1")
            .stdin(Stdio::null())
            .output(),
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the restart run failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (mut died, mut resumed, mut backoff) = (None, Vec::new(), 0.0);
    for line in stdout.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["event"] == "restarting" {
            backoff = event["backoff_ms"].as_f64().unwrap_or(0.0) / 1000.0;
        }
        let text = event["line"].as_str().unwrap_or("");
        let time = |prefix: &str| -> Option<f64> {
            text.strip_prefix(prefix)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        if let Some(t) = time("died_at ") {
            died = Some(t);
        }
        if let Some(t) = time("resumed_at ") {
            if !text.ends_with("bytes 100000000") {
                return Err(format!(
                    "a rank resumed from a checkpoint of another size: {text}"
                ));
            }
            resumed.push(t);
        }
    }
    let died = died.ok_or_else(|| format!("rank 1 did not say when it died: {stdout}"))?;
    if resumed.len() != 2 {
        return Err(format!("not every rank resumed: {stdout}"));
    }
    let last = resumed.iter().copied().fold(f64::MIN, f64::max);
    Ok(last - died - backoff)
}

fn restart_figure(root: &Path, work: &Path, against: Option<&Path>) -> Result<f64, String> {
    crate::cargo(&["build", "--release", "-p", "trainyard-cli"])?;
    let trainyard = crate::target_dir().join("release/trainyard");
    let mut times = Vec::new();
    let mut theirs = Vec::new();
    for round in 1..=RESTART_ROUNDS {
        // Each build goes first in turn.
        let mut builds: Vec<(&Path, &mut Vec<Duration>)> = vec![(&trainyard, &mut times)];
        if let Some(other) = against {
            builds.push((other, &mut theirs));
            if round % 2 == 0 {
                builds.reverse();
            }
        }
        for (build, seen) in builds {
            let seconds = restart_round(build, root, work, round)?;
            eprintln!(
                "round {round}, {}: {seconds:.3}s from the death to every rank running again",
                build.display()
            );
            seen.push(Duration::from_secs_f64(seconds.max(0.0)));
        }
    }
    let median = crate::bench_e2e::median(times).as_secs_f64();
    println!(
        "restart of 2 workers from a 100 MB checkpoint, back-off excluded, median of {RESTART_ROUNDS}:"
    );
    println!("  from a rank's death to every rank running again: {median:.3}s (target < 1 s)");
    if let Some(other) = against {
        let theirs = crate::bench_e2e::median(theirs).as_secs_f64();
        println!(
            "  the same with {}: {theirs:.3}s; this build is {:.2} × it",
            other.display(),
            median / theirs
        );
    }
    Ok(median)
}

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let against = match args {
        [] => None,
        [flag, bin] if flag == "--against" => Some(PathBuf::from(bin)),
        other => {
            return Err(format!(
                "unknown arguments {other:?}: expected --against BIN"
            ));
        }
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let work = crate::target_dir().join("bench-checkpoint");
    let _ = std::fs::remove_dir_all(&work);
    io("make the work folder", std::fs::create_dir_all(&work))?;
    let ratio = persist_figure(&work);
    let restart = restart_figure(&root, &work, against.as_deref());
    let _ = std::fs::remove_dir_all(&work);
    let (ratio, restart) = (ratio?, restart?);
    if ratio < 0.8 || restart >= 1.0 {
        return Err(format!(
            "a target is missed: persist ratio {ratio:.2} (>= 0.8), restart {restart:.3}s (< 1 s)"
        ));
    }
    Ok(())
}
