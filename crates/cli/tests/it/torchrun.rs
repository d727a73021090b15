//! torchrun habits through the built binary: a script written for torchrun
//! (`tests/python/torchrun_env.py`) runs unchanged under `trainyard run -n 2 python
//! script.py` (no `--`), with torchrun's spellings of the flags, and reads the values
//! torchrun would give it. Every run carries a marker in its workers' environment and
//! reserves through a ledger of its own ([`Sandbox`]); each test checks that no process is
//! left.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{MARKER, Sandbox, left_behind, torch_python, wait_bounded};
use trainyard_test_support::processes as common;

/// How long a run of the script may take (an interpreter start per rank).
const LIMIT: Duration = Duration::from_secs(60);

/// How long a run with torch may take (importing torch on a loaded machine).
const TORCH_LIMIT: Duration = Duration::from_secs(300);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/torchrun_env.py")
}

/// `trainyard run ARGS` exactly as given (after the marker), in `sandbox`, to the end.
fn run(sandbox: &Sandbox, args: &[&str], limit: Duration) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .arg("run")
        .args(["--env", &format!("{MARKER}={}", sandbox.mark())])
        .args(args)
        .envs(sandbox.env())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    wait_bounded(child, limit)
}

/// The run's stdout, once it succeeded.
fn succeeded(out: &Output) -> String {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "stdout: {stdout} stderr: {stderr}");
    stdout
}

/// The line of `rank` that holds `needle`.
fn line_of<'a>(stdout: &'a str, rank: u32, needle: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("(rank={rank}, pid=")) && l.contains(needle))
        .unwrap_or_else(|| panic!("no line of rank {rank} with `{needle}` in {stdout}"))
}

fn assert_nothing_left(sandbox: &Sandbox) {
    let left = left_behind(sandbox.mark(), Duration::from_secs(5));
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn a_torchrun_script_runs_without_a_double_dash_and_reads_torchruns_values() {
    let sandbox = Sandbox::new("torchrun-env");
    let script = script();
    let script = script.to_str().expect("a UTF-8 path");
    let out = run(
        &sandbox,
        &[
            "-n",
            "2",
            "-r",
            "CPU=0.5,memory=64MiB",
            "--name",
            "resnet-a",
            "python3",
            script,
            // The script's own `--name`, which `trainyard run` also has: after the
            // program, it is the program's.
            "--name",
            "y",
        ],
        LIMIT,
    );
    let stdout = succeeded(&out);
    for rank in 0..2 {
        let line = line_of(&stdout, rank, "RANK=");
        for want in [
            format!(" RANK={rank} "),
            "WORLD_SIZE=2".to_owned(),
            format!("LOCAL_RANK={rank}"),
            "LOCAL_WORLD_SIZE=2".to_owned(),
            "GROUP_RANK=0".to_owned(),
            "GROUP_WORLD_SIZE=1".to_owned(),
            format!("ROLE_RANK={rank}"),
            "ROLE_WORLD_SIZE=2".to_owned(),
            "TORCHELASTIC_RUN_ID=resnet-a".to_owned(),
            "TORCHELASTIC_MAX_RESTARTS=0".to_owned(),
            "name=y".to_owned(),
        ] {
            assert!(line.contains(&want), "`{want}` missing in {line}");
        }
    }
    assert!(
        sandbox.storage().join("resnet-a").is_dir(),
        "trainyard's own --name names the run folder"
    );
    assert_nothing_left(&sandbox);
}

#[test]
fn torchruns_spellings_of_the_flags_set_the_same_things() {
    let sandbox = Sandbox::new("torchrun-flags");
    let script = script();
    let script = script.to_str().expect("a UTF-8 path");
    let out = run(
        &sandbox,
        &[
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "-r",
            "CPU=0.5,memory=64MiB",
            "--",
            "python3",
            script,
            "--name",
            "z",
        ],
        LIMIT,
    );
    let stdout = succeeded(&out);
    for rank in 0..2 {
        let line = line_of(&stdout, rank, "RANK=");
        for want in [
            "WORLD_SIZE=2",
            "LOCAL_WORLD_SIZE=2",
            "TORCHELASTIC_MAX_RESTARTS=1",
            "name=z",
        ] {
            assert!(line.contains(want), "`{want}` missing in {line}");
        }
    }
    assert_nothing_left(&sandbox);
}

#[test]
fn a_torchrun_script_joins_a_real_process_group_without_a_double_dash() {
    let Some(python) = torch_python() else {
        return;
    };
    let sandbox = Sandbox::new("torchrun-pg");
    let python = python.to_str().expect("a UTF-8 path");
    let script = script();
    let script = script.to_str().expect("a UTF-8 path");
    let out = run(
        &sandbox,
        &[
            "--nproc_per_node=2",
            "-r",
            "CPU=0.5",
            python,
            script,
            "--all-reduce",
        ],
        TORCH_LIMIT,
    );
    let stdout = succeeded(&out);
    for rank in 0..2 {
        line_of(&stdout, rank, "all_reduce sum=3");
    }
    assert_nothing_left(&sandbox);
}

#[test]
fn torch_timeout_reaches_every_worker() {
    let sandbox = Sandbox::new("torch-timeout");
    let out = run(
        &sandbox,
        &[
            "-n",
            "2",
            "-r",
            "CPU=0.5",
            "--torch-timeout",
            "60",
            "sh",
            "-c",
            "echo timeout=$TRAINYARD_TORCH_TIMEOUT_S",
        ],
        LIMIT,
    );
    let stdout = succeeded(&out);
    assert_eq!(stdout.matches(") timeout=60").count(), 2, "{stdout}");
    assert_nothing_left(&sandbox);
}
