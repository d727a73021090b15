//! Project automation: `cargo xtask ci` runs what CI runs; `cargo xtask tidy` checks the
//! workspace's layering; `cargo xtask soak` runs the local runtime back to back.
#![allow(
    clippy::disallowed_methods,
    reason = "a tool of the repository's own: it makes scratch files for benches and checks"
)]

mod bench_chaos;
mod bench_checkpoint;
mod bench_e2e;
mod bench_python;
mod bench_ray;
mod bench_restarts;
mod bench_slurm;
mod cycles;
mod python;
mod ray_tests;
mod semver;
mod soak;
mod tidy;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <ci|python|ray-tests|tidy|cycles|bench-e2e|bench-python|bench-chaos|bench-ray|bench-slurm|bench-restarts|bench-checkpoint|soak>
  ci         fmt check, clippy -D warnings (benches included), tests (nextest when installed), doc tests,
             the API docs with rustdoc's warnings as errors;
             the Ray tests too when TRAINYARD_RAY_PYTHON is set (under CI=true it must be,
             unless TRAINYARD_RAY_SKIP says why not); then the python step
  python     build the wheel, install it into a fresh venv, run python/tests/driver (pytest,
             torch) there with no Rust toolchain on PATH
  ray-tests  --ray-source DIR [--against both|trainyard|ray] [--out FILE] Ray Train v2's own tests
             (Ray's files in DIR, outside the repository) against trainyard through an import
             shim, and against Ray 2.60 for the yardstick; by hand, not in CI
  semver     cargo semver-checks of the facade against the last release in RELEASES (in ci too)
  tidy       fail on a workspace dependency that points up a layer
  cycles     list the circles of files that import each other inside a crate or the Python package (none allowed)
  bench-e2e  [--against BIN] [--readme] time whole runs: trainyard run vs torchrun vs processes by
             hand, crash-to-stop, hangs, elastic growth, 64 workers, and where the launch goes;
             --against times another trainyard build in the same rounds; --readme writes the
             README's table
  bench-python  [--stall] [--readme] one 2-worker TorchTrainer program, whole process: the wheel's
             fit() vs Ray Train 2.60 (the same file importing ray.train), and vs the same work
             through trainyard run; --stall: report()'s stall with a 256 MiB checkpoint per rank,
             SYNC and ASYNC vs Ray Train's ASYNC; --readme writes the README's table
  bench-chaos  [--readme] [--only NAMES] [--seconds S] [--every S] goodput of one 2-rank gloo
             program with a checkpoint every step while a rank is SIGKILLed every 10 s for 2
             minutes: trainyard (local, Ray, Slurm runtimes), Ray Train 2.60, torchrun
  bench-ray  time a trivial 2-worker torch job: trainyard run --runtime ray vs Ray Train's TorchTrainer
  bench-slurm  [--nodes N] time N (4) workers of a trivial task on N Slurm test nodes: trainyard
             run --runtime slurm vs srun -N N -n N of true and of tasks calling home, and
             count the srun processes of a run
  bench-restarts  [--rounds N] [--readme] a rank's SIGKILL to both ranks training again on the
             local, Ray and Slurm runtimes, with --warm-python torch and without
  bench-checkpoint  [--against BIN] persist 1 GiB of checkpoint vs cp -r; a rank's death to every
             rank resumed from a 100 MB checkpoint (interleaved with BIN's when given)
  soak       [--runs N] N (300) back-to-back local runs, a mix of endings; fails on a wrong exit
             code or on processes, descriptors, listening sockets or ledger entries left behind";

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let result = match task.as_deref() {
        Some("ci") => ci(),
        Some("python") => python::run_suite(),
        Some("ray-tests") => ray_tests::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("semver") => semver::run(&repository_root()),
        Some("tidy") => tidy::check_workspace().map_err(|problems| problems.join("\n")),
        Some("cycles") => print_circles(),
        Some("bench-e2e") => bench_e2e::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("bench-chaos") => bench_chaos::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("bench-python") => bench_python::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("bench-ray") => bench_ray::run(),
        Some("bench-slurm") => bench_slurm::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("bench-restarts") => {
            bench_restarts::run(&std::env::args().skip(2).collect::<Vec<_>>())
        }
        Some("bench-checkpoint") => {
            bench_checkpoint::run(&std::env::args().skip(2).collect::<Vec<_>>())
        }
        Some("soak") => soak::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

/// The repository's root (the workspace's).
pub(crate) fn repository_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where cargo builds: `$CARGO_TARGET_DIR` (relative to the workspace root), else `target/`.
pub(crate) fn target_dir() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |dir| root.join(dir))
}

fn has_nextest() -> bool {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The Ray tests (each starts a Ray cluster), as nextest names them; `.config/nextest.toml`
/// runs the same set one at a time.
const RAY_TESTS: &str = "(package(trainyard-runtime-ray) & kind(test)) | (binary_id(trainyard-cli::it) & test(/^ray::/))";

/// What says why the Ray tests may be left out under `CI=true` (`.ci/run` sets it, loudly,
/// when the package registry cannot be reached to install Ray).
const RAY_SKIP: &str = "TRAINYARD_RAY_SKIP";

/// A variable's value, when set and not empty.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// Whether the Ray tests run: they are ignored unless asked for, and asked for when
/// `TRAINYARD_RAY_PYTHON` names their interpreter. Under `CI=true` a missing interpreter is
/// an error, unless `TRAINYARD_RAY_SKIP` says why (CI has said so loudly).
fn ray_tests_wanted() -> Result<bool, String> {
    if var("TRAINYARD_RAY_PYTHON").is_some() {
        return Ok(true);
    }
    if let Some(why) = var(RAY_SKIP) {
        eprintln!("SKIP: the Ray tests: {why}");
        return Ok(false);
    }
    if var("CI").as_deref() == Some("true") {
        return Err(format!(
            "the Ray tests need TRAINYARD_RAY_PYTHON (export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\"), or {RAY_SKIP} saying why they cannot run"
        ));
    }
    eprintln!(
        "the Ray tests are not run (they show as skipped): export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\" to run them"
    );
    Ok(false)
}

fn ci() -> Result<(), String> {
    // Before the long steps: a CI without the Ray tests' environment fails at once.
    let ray = ray_tests_wanted()?;
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    if has_nextest() {
        cargo(&[
            "nextest",
            "run",
            "--workspace",
            "--all-features",
            "--no-fail-fast",
        ])?;
        if ray {
            cargo(&[
                "nextest",
                "run",
                "--workspace",
                "--all-features",
                "--no-fail-fast",
                "--run-ignored",
                "only",
                "-E",
                RAY_TESTS,
            ])?;
        }
    } else {
        eprintln!("cargo-nextest is not installed; running the tests with cargo test");
        cargo(&[
            "test",
            "--workspace",
            "--all-features",
            "--lib",
            "--bins",
            "--tests",
        ])?;
        if ray {
            let runtime = ["test", "-p", "trainyard-runtime-ray", "--tests"];
            let cli = ["test", "-p", "trainyard-cli", "--test", "it"];
            for (tests, only) in [(&runtime[..], None), (&cli[..], Some("ray::"))] {
                let filter: &[&str] = only.as_slice();
                cargo(&[tests, &["--all-features", "--", "--ignored"], filter].concat())?;
            }
        }
    }
    // No `cargo bench --no-run`: that is a release build of every bench, about half of this
    // task's time. The benches are still checked: clippy above runs with `--all-targets
    // --all-features`, which type-checks every bench target (and lints it) in the dev profile.
    cargo(&["test", "--workspace", "--all-features", "--doc"])?;
    // The API docs build without a warning (a broken or private link fails CI).
    docs()?;
    // The API against the last release: a breaking change the version does not say.
    semver::run(&repository_root())?;
    python::run_suite()
}

/// `cargo doc` of the workspace's own crates with rustdoc's warnings as errors.
fn docs() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let args = ["doc", "--workspace", "--all-features", "--no-deps"];
    eprintln!("$ RUSTDOCFLAGS='-D warnings' cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .env("RUSTDOCFLAGS", "-D warnings")
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`cargo {}` failed ({status}): the API docs have warnings",
            args.join(" ")
        ))
    }
}

/// `cargo xtask cycles`: every module circle, one per line; fails above the allowed number.
fn print_circles() -> Result<(), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let circles = cycles::workspace_circles(&root)?;
    for circle in &circles {
        println!("{}: {}", circle.krate, circle.modules.join(" <-> "));
    }
    println!("{} circle(s); none allowed", circles.len());
    if !circles.is_empty() {
        return Err("files import each other in a circle".to_owned());
    }
    Ok(())
}
