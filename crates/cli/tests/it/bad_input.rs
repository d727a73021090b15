//! Bad input to `trainyard plan` and `trainyard run` through the built binary: every case
//! exits with its code (2 for bad input, 3 for what cannot be scheduled) within moments,
//! says so on exactly one `error:` line that names the field and the offending value, never
//! panics, and leaves no process behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{MARKER, Sandbox, left_behind, wait_within};
use trainyard_test_support::processes as common;

/// Bad input.
const BAD_INPUT: i32 = 2;

/// Cannot be scheduled.
const UNSCHEDULABLE: i32 = 3;

/// How long a case may take: process start and a refusal (a few milliseconds each when
/// measured; the bound leaves room for a loaded machine).
const FAST: Duration = Duration::from_secs(2);

/// When a case is killed as hung.
const KILL_AFTER: Duration = Duration::from_secs(10);

/// How long a run's processes may take to be gone after it exits.
const CLEANUP: Duration = Duration::from_secs(5);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_trainyard"))
}

/// One bad input: the arguments after the binary's name, what it must exit with, and a
/// piece of its error line that shows the field and the value.
struct Case {
    args: Vec<String>,
    code: i32,
    must_contain: &'static str,
}

/// `plan ARGS`, bad input.
fn plan(args: &[&str], must_contain: &'static str) -> Case {
    Case {
        args: std::iter::once("plan")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect(),
        code: BAD_INPUT,
        must_contain,
    }
}

/// `run ARGS -- true`, bad input.
fn run(args: &[&str], must_contain: &'static str) -> Case {
    run_program(args, &["true"], BAD_INPUT, must_contain)
}

/// `run ARGS -- true` that cannot be scheduled.
fn unschedulable(args: &[&str], must_contain: &'static str) -> Case {
    run_program(args, &["true"], UNSCHEDULABLE, must_contain)
}

/// `run ARGS -- PROGRAM`.
fn run_program(args: &[&str], program: &[&str], code: i32, must_contain: &'static str) -> Case {
    Case {
        args: std::iter::once("run")
            .chain(args.iter().copied())
            .chain(std::iter::once("--"))
            .chain(program.iter().copied())
            .map(str::to_owned)
            .collect(),
        code,
        must_contain,
    }
}

/// `run ARGS` exactly as given (no `--` added).
fn run_raw(args: &[&str], must_contain: &'static str) -> Case {
    Case {
        args: std::iter::once("run")
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect(),
        code: BAD_INPUT,
        must_contain,
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write a config file");
    path.to_str().expect("a UTF-8 temp path").to_owned()
}

#[expect(
    clippy::too_many_lines,
    reason = "the table is the test; one row per bad input"
)]
fn cases(dir: &Path) -> Vec<Case> {
    let unknown_toml = write(dir, "unknown.toml", "num_workers = 2\nnum_workerz = 3\n");
    let unknown_json = write(
        dir,
        "unknown.json",
        r#"{"num_workers": 2, "use_gpus": true}"#,
    );
    let negative_toml = write(dir, "negative.toml", "[resources_per_worker]\nCPU = -1\n");
    let zero_json = write(dir, "zero.json", r#"{"num_workers": 0}"#);
    let broken_toml = write(dir, "broken.toml", "num_workers = \n");
    let missing = dir.join("missing.toml").to_str().expect("UTF-8").to_owned();

    vec![
        // Workers.
        plan(&["-n", "-1"], "got -1"),
        plan(
            &["-n", "0"],
            "`num_workers` must be between 1 and 1000000, got 0",
        ),
        plan(&["-n", "abc"], "abc"),
        plan(&["-n", "99999999999999"], "99999999999999"),
        // Amounts: negative, NaN, infinite, huge, too precise, wrong units, fractional bytes.
        plan(&["-r", "CPU=-1"], "-1"),
        plan(&["-r", "CPU=NaN"], "NaN"),
        plan(&["-r", "GPU=inf"], "inf"),
        plan(&["-r", "CPU=1e40"], "1e40"),
        plan(&["--format", "json", "-r", "CPU=1e30"], "1e30"),
        plan(
            &[
                "--format",
                "json",
                "-r",
                r#"{"CPU": 99999999999999999999999}"#,
            ],
            "too large",
        ),
        plan(&["-r", "CPU=922337203685477.5808"], "922337203685477.5808"),
        plan(&["-r", "memory=1000TB"], "1000TB"),
        plan(&["-r", "memory=1e30"], "1e30"),
        plan(&["-r", "CPU=0.00001"], "0.00001"),
        plan(&["-r", "GPU=0.12345"], "0.12345"),
        plan(&["-r", "memory=10XB"], "10XB"),
        plan(&["-r", "memory=-1GB"], "-1GB"),
        plan(&["-r", "memory=0.5B"], "0.5B"),
        plan(&["-r", r#"{"memory": "0.5B"}"#], "0.5B"),
        plan(&["-r", "CPU=1GB"], "1GB"),
        plan(&["-r", "ssd=2GiB"], "2GiB"),
        plan(&["-r", r#"{"CPU": -1}"#], "-1"),
        plan(&["-r", r#"{"GPU": "NaN"}"#], "NaN"),
        plan(&["-r", r#"{"memory": "ten GB"}"#], "ten GB"),
        plan(&["-r", r#"{"memory": 1e400}"#], "memory"),
        plan(&["-r", r#"{"CPU": 1"#], "CPU"),
        plan(&["-r", "CPU"], "CPU"),
        // Empty bundles.
        plan(&["-r", "{}"], "{}"),
        plan(&["-r", "CPU=0"], "CPU=0"),
        plan(&["-r", ""], "resources_per_worker"),
        plan(&["--trainer-resources", "CPU=-2"], "-2"),
        plan(&["--use-gpu", "-r", "GPU=0"], "`GPU` is 0"),
        // Choices and unknown flags.
        plan(&["-s", "STRICTLY_PACK"], "STRICTLY_PACK"),
        plan(&["--format", "xml"], "xml"),
        plan(&["--num-wrokers", "2"], "--num-wrokers"),
        // Config files: unknown keys, bad values, broken syntax, missing.
        plan(&["-c", &unknown_toml], "num_workerz"),
        plan(&["-c", &unknown_json], "use_gpus"),
        plan(&["-c", &negative_toml], "-1"),
        plan(
            &["-c", &zero_json],
            "`num_workers` must be between 1 and 1000000, got 0",
        ),
        plan(&["-c", &broken_toml], "broken.toml"),
        plan(&["-c", &missing], "missing.toml"),
        // What cannot be scheduled.
        unschedulable(
            &[
                "-n",
                "3",
                "-r",
                "CPU=1",
                "-s",
                "STRICT_PACK",
                "--num-cpus",
                "2",
            ],
            "CPU=3",
        ),
        unschedulable(
            &[
                "-n",
                "3",
                "-r",
                "CPU=0.1",
                "-s",
                "STRICT_SPREAD",
                "--nodes",
                "2",
            ],
            "STRICT_SPREAD",
        ),
        unschedulable(&["-r", "CPU=1000", "--num-cpus", "2"], "CPU"),
        unschedulable(&["-r", "memory=1TB", "--memory", "1GB"], "memory"),
        // The program.
        run_raw(&["-n", "1", "--"], "PROGRAM"),
        run_raw(&["-n", "1"], "PROGRAM"),
        run_raw(&["-n", "1", "--name", "x"], "PROGRAM"),
        // torchrun's spellings: the same as -n on one node only.
        run(
            &["--runtime", "ray", "--nproc-per-node", "2"],
            "`2` for `--nproc-per-node`",
        ),
        run(
            &["--nodes", "2", "--nproc-per-node", "2"],
            "`2` for `--nproc-per-node`",
        ),
        run(&["--nproc-per-node", "2", "-n", "2"], "--nproc-per-node"),
        run(
            &["--nproc_per_node", "0"],
            "`num_workers` must be between 1 and 1000000, got 0",
        ),
        run(&["--max-restarts", "-2"], "got -2"),
        // Variables trainyard sets on every worker, refused with what sets them.
        run(&["--env", "RANK=7"], "`RANK=7` for `--env`"),
        run(
            &["--env", "MASTER_PORT=notaport"],
            "`MASTER_PORT=notaport` for `--env`: expected a port number from 1 to 65535",
        ),
        run(&["--env", "MASTER_PORT=0"], "`MASTER_PORT=0` for `--env`"),
        run(
            &["--env", "TRAINYARD_TORCH_TIMEOUT_S=10"],
            "set it with --torch-timeout",
        ),
        run(&["--env", "TORCHELASTIC_RUN_ID=x"], "set it with --name"),
        run(
            &["--env", "TORCHELASTIC_MAX_RESTARTS=3"],
            "set it with --max-failures",
        ),
        run(&["--env", "GROUP_WORLD_SIZE=2"], "`GROUP_WORLD_SIZE=2`"),
        run(
            &["--env", "TRAINYARD_WORLD_RANK=1"],
            "`TRAINYARD_WORLD_RANK=1`",
        ),
        run(
            &["--env", "TRAINYARD_CHECKPOINT=/tmp"],
            "`TRAINYARD_CHECKPOINT=/tmp`",
        ),
        run(
            &[
                "--use-gpu",
                "--num-gpus",
                "1",
                "--env",
                "CUDA_VISIBLE_DEVICES=1",
            ],
            "`CUDA_VISIBLE_DEVICES=1` for `--env`",
        ),
        run(
            &["--runtime", "ray", "--env-from-driver", "WORLD_SIZE"],
            "`WORLD_SIZE` for `--env-from-driver`",
        ),
        // The process-group timeout.
        run(&["--torch-timeout", "0"], "'0' for '--torch-timeout"),
        run(&["--torch-timeout", "soon"], "'soon' for '--torch-timeout"),
        run(&["--torch-timeout", "1.5"], "'1.5' for '--torch-timeout"),
        run(
            &["--torch-timeout", "31536001"],
            "'31536001' for '--torch-timeout",
        ),
        run(
            &["--backend", "none", "--torch-timeout", "60"],
            "`60` for `--torch-timeout`",
        ),
        // LOCAL flags.
        run(&["--nodes", "0"], "`0` for `--nodes`"),
        run(&["--nodes", "-1"], "-1"),
        run(&["--nodes", "two"], "two"),
        run(&["--num-cpus", "-1"], "-1"),
        run(&["--num-cpus", "NaN"], "NaN"),
        run(&["--num-cpus", "0.00001"], "0.00001"),
        run(&["--num-gpus", "-1"], "-1"),
        run(&["--num-gpus", "1.5"], "'1.5' for '--num-gpus"),
        run(&["--memory", "10XB"], "10XB"),
        run(&["--memory", "-1GB"], "`-1GB` for `--memory`"),
        run(&["--memory", "0.5B"], "0.5B"),
        run(&["--memory=-1GB"], "-1GB"),
        run(&["--resources", "ssd=-1"], "-1"),
        run(&["--resources", r#"{"ssd": "lots"}"#], "lots"),
        // RUN flags.
        run(
            &["--max-failures", "-2"],
            "`max_failures` must be -1 (unlimited) or a number of restarts of at least 0, got -2",
        ),
        run(&["--max-failures", "many"], "many"),
        run(&["--placement-timeout", "-1"], "-1"),
        run(&["--placement-timeout", "NaN"], "NaN"),
        run(&["--placement-timeout", "inf"], "inf"),
        run(&["--placement-timeout", "soon"], "soon"),
        run(&["--env", "NOEQUALS"], "NOEQUALS"),
        run(&["--env", "=value"], "invalid value `=value` for `--env`"),
        run(&["--name", "a/b"], "`a/b` for `--name`"),
        run(&["--name", ".."], ".."),
        run(&["--storage", "gs://bucket/runs"], "gs://bucket/runs"),
        run(&["--storage", "s3://"], "s3://"),
        // Unwritable: a folder below a regular file (even root cannot make it).
        run(&["--storage", "/etc/hostname/runs"], "/etc/hostname/runs"),
        run(&["--resume", "sometimes"], "sometimes"),
        run(&["--hang-timeout", "-1"], "`-1` for `--hang-timeout`"),
        run(&["--hang-timeout", "0s"], "`0s` for `--hang-timeout`"),
        run(&["--hang-timeout", "soon"], "`soon` for `--hang-timeout`"),
        run(&["--progress", "lines"], "`lines` for `--progress`"),
        run(
            &["--warm-python", "torch"],
            "invalid value `torch` for `--warm-python`: starts Python programs only, and the program `true` is not a Python interpreter",
        ),
        run_program(
            &["--warm-python", "to rch"],
            &["python3", "-c", "pass"],
            BAD_INPUT,
            "invalid value `to rch` for `--warm-python`: `to rch` is not a Python module name",
        ),
        run_program(
            &["--warm-python", "no_such_module_here.sub"],
            &["python3", "-c", "pass"],
            BAD_INPUT,
            "invalid value `no_such_module_here.sub` for `--warm-python`: `no_such_module_here` is not installed for",
        ),
        // On Slurm and Ray too, before anything is asked of the cluster.
        run_program(
            &["--runtime", "slurm", "--warm-python", "no_such_module_here"],
            &["python3", "-c", "pass"],
            BAD_INPUT,
            "invalid value `no_such_module_here` for `--warm-python`: `no_such_module_here` is not installed for",
        ),
        run(&["-n", "2", "--ranks", "9"], "`9` for `--ranks`"),
        run(&["-n", "2", "--ranks", "a-b"], "`a-b` for `--ranks`"),
        run(&["-n", "4", "--ranks", "3-1"], "`3-1` for `--ranks`"),
        run(
            &["--checkpoints-to-keep", "0"],
            "`0` for `--checkpoints-to-keep`",
        ),
        run(&["--checkpoints-to-keep", "many"], "many"),
        run(&["--checkpoint-score", "loss:best"], "loss:best"),
        run(
            &["--checkpoint-score", ":min"],
            "`:min` for `--checkpoint-score`",
        ),
        run(&["--runtime", "pbs"], "pbs"),
        run(&["--backend", "jax"], "jax"),
        run(&["--bogus"], "--bogus"),
        run(&["--max-checkpoint-size", "lots"], "--max-checkpoint-size"),
        run(&["--max-checkpoint-size", "0"], "expected a positive size"),
    ]
}

/// What is wrong with how the binary handled `case`, if anything.
fn check(index: usize, case: &Case) -> Option<String> {
    let sandbox = Sandbox::new(&format!("bad-input-{index}"));
    let mut command = Command::new(binary());
    let mut args = case.args.clone();
    if args[0] == "run" {
        // Before any `--`: the marker reaches every process the run starts.
        let marker = format!("{MARKER}={}", sandbox.mark());
        args.splice(1..1, ["--env".to_owned(), marker]);
    }
    command
        .args(&args)
        .envs(sandbox.env())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let child = command.spawn().expect("trainyard starts");
    let output = wait_within(child, KILL_AFTER);
    let took = started.elapsed();
    let mut problems = Vec::new();
    let output = output.unwrap_or_else(|output| {
        problems.push(format!("did not finish within {KILL_AFTER:?}"));
        output
    });
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if output.status.code() != Some(case.code) {
        problems.push(format!(
            "exit {:?}, expected {}",
            output.status.code(),
            case.code
        ));
    }
    if took >= FAST {
        problems.push(format!("took {took:?}"));
    }
    let lines: Vec<&str> = stderr.lines().collect();
    if lines.len() != 1 {
        problems.push(format!("{} lines on stderr", lines.len()));
    }
    if !lines.first().is_some_and(|line| line.starts_with("error:")) {
        problems.push("stderr does not start with `error:`".to_owned());
    }
    if !stderr.contains(case.must_contain) {
        problems.push(format!("stderr lacks `{}`", case.must_contain));
    }
    for panic_text in ["panicked", "backtrace", "RUST_BACKTRACE", "thread 'main'"] {
        if stderr.contains(panic_text) {
            problems.push(format!("stderr shows `{panic_text}`"));
        }
    }
    if args[0] == "run" {
        let left = left_behind(sandbox.mark(), CLEANUP);
        if !left.is_empty() {
            problems.push(format!("processes left behind: {left:?}"));
        }
    }
    (!problems.is_empty()).then(|| {
        format!(
            "case {index} `{}`: {}; stderr: {stderr:?}",
            args.join(" "),
            problems.join(", ")
        )
    })
}

#[test]
fn every_bad_input_is_refused_at_once_on_one_line_that_names_the_field_and_value() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let cases = cases(dir.path());
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let failures: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(index, case)| check(index, case))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases went wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn a_resource_name_that_differs_from_a_well_known_one_by_case_is_planned_with_a_warning() {
    let output = Command::new(binary())
        .args(["plan", "-r", "cpu=1,Memory=2,object_store_MEMORY=3"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("trainyard runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "warning: resource `Memory` is not `memory`; resource names are case-sensitive",
            "warning: resource `cpu` is not `CPU`; resource names are case-sensitive",
            "warning: resource `object_store_MEMORY` is not `object_store_memory`; resource names are case-sensitive",
        ],
        "stderr: {stderr}"
    );
}

#[test]
fn well_known_resource_names_are_planned_without_a_warning() {
    let output = Command::new(binary())
        .args(["plan", "-r", "CPU=1,memory=1GB,ssd=1"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("trainyard runs");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
}

/// `trainyard run ARGS -- true` in a sandbox of its own, with `env` set: its exit code and
/// its `error:` line. It must leave no process and no run folder behind.
fn refusal(name: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let sandbox = Sandbox::new(name);
    let marker = format!("{MARKER}={}", sandbox.mark());
    let child = Command::new(binary())
        .args(["run", "--env", &marker])
        .args(args)
        .args(["--", "true"])
        .envs(sandbox.env())
        .envs(env.iter().copied())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    let output = wait_within(child, Duration::from_secs(60)).expect("trainyard exits");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let left = left_behind(sandbox.mark(), CLEANUP);
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let folders: Vec<_> = std::fs::read_dir(sandbox.storage())
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(folders.is_empty(), "run folders left behind: {folders:?}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    (output.status.code(), errors[0].to_owned())
}

#[test]
fn a_refused_run_says_that_it_cannot_start_and_how_the_workers_would_fit() {
    assert_eq!(
        refusal("refused-cpus", &["--num-cpus", "2", "--nproc-per-node", "4"], &[]),
        (
            Some(UNSCHEDULABLE),
            "error: the run cannot start: the workers cannot be scheduled: the bundles together need CPU=4 but the cluster has CPU=2; each worker asks for 1 CPU: ask for less with -r CPU=0.5, or let the workers share more CPUs than this machine has with --num-cpus 4".to_owned()
        )
    );
    assert_eq!(
        refusal("refused-memory", &["--memory", "1GiB", "-r", "memory=2GiB"], &[]),
        (
            Some(UNSCHEDULABLE),
            "error: the run cannot start: the workers cannot be scheduled: bundle 0 needs memory=2GiB but the most memory any node has is 1GiB".to_owned()
        )
    );
}

#[test]
fn the_ray_runtime_without_ray_says_how_to_get_it() {
    // An interpreter that cannot import ray, wherever ray is installed: no site-packages.
    let dir = tempfile::tempdir().expect("a temp dir");
    let python = dir.path().join("python-without-ray");
    std::fs::write(&python, "#!/bin/sh\nexec python3 -I -S \"$@\"\n").expect("write");
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let python = python.to_str().expect("a UTF-8 path");
    let (code, line) = refusal(
        "no-ray",
        &["--runtime", "ray"],
        &[("TRAINYARD_RAY_PYTHON", python)],
    );
    assert_eq!(code, Some(BAD_INPUT), "{line}");
    assert_eq!(
        line,
        format!(
            "error: --runtime ray needs a Python with Ray 2.60.0, and {python} cannot import ray (ModuleNotFoundError: No module named 'ray'): install it there (pip install 'ray[train]==2.60.0'), or set TRAINYARD_RAY_PYTHON to an interpreter that has it"
        )
    );
}
