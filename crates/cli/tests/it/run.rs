//! `trainyard run` and `trainyard cluster` through the built binary, with real worker
//! processes on this machine. Every run carries a marker in its workers' environment, and
//! each test checks afterwards that no process with that marker is left; every run reserves
//! through a ledger of its test's own ([`Sandbox`]).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use common::{MARKER, Sandbox, json_events, left_behind, marked, report_steps, wait_bounded};
use trainyard_test_support::processes as common;
use trainyard_test_support::running::Running;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_trainyard"))
}

/// `trainyard run` with `args` before `--` and `program` after, in `sandbox`.
fn run_command(sandbox: &Sandbox, args: &[&str], program: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("run")
        .args(["--env", &format!("{MARKER}={}", sandbox.mark())])
        .args(args)
        .arg("--")
        .args(program)
        .envs(sandbox.env())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

/// Runs to the end, bounded by `limit`.
fn run(sandbox: &Sandbox, args: &[&str], program: &[&str], limit: Duration) -> Output {
    let child = run_command(sandbox, args, program)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    wait_bounded(child, limit)
}

/// Waits up to `limit` for every process of `sandbox`'s runs to be gone.
fn assert_nothing_left(sandbox: &Sandbox, limit: Duration) {
    let left = left_behind(sandbox.mark(), limit);
    assert!(
        left.is_empty(),
        "processes left behind after {limit:?}: {left:?}"
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn every_rank_gets_the_torch_environment_through_a_real_process() {
    let sandbox = Sandbox::new("env");
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5,memory=64MiB"],
        &[
            "sh",
            "-c",
            "echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT TRAINYARD_WORLD_RANK=$TRAINYARD_WORLD_RANK PRIVATE=${TRAINYARD_AGENT_CONFIG:-none}${TRAINYARD_ROLE:-}",
        ],
        Duration::from_secs(60),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout} stderr: {stderr}");
    let mut port = None;
    for rank in 0..2 {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!(" RANK={rank} ")))
            .unwrap_or_else(|| panic!("no line of rank {rank} in {stdout}"));
        assert!(
            line.starts_with(&format!("(rank={rank}, pid=")),
            "the line has the rank prefix: {line}"
        );
        for want in [
            format!("LOCAL_RANK={rank}"),
            "WORLD_SIZE=2".to_owned(),
            "LOCAL_WORLD_SIZE=2".to_owned(),
            "GROUP_RANK=0".to_owned(),
            "MASTER_ADDR=127.0.0.1".to_owned(),
            format!("TRAINYARD_WORLD_RANK={rank}"),
            "PRIVATE=none".to_owned(),
        ] {
            assert!(line.contains(&want), "{want} missing in {line}");
        }
        let this_port = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("MASTER_PORT="))
            .expect("a port");
        assert!(this_port.parse::<u16>().is_ok_and(|p| p > 0), "{line}");
        assert!(
            port.is_none_or(|p| p == this_port),
            "both ranks share one port"
        );
        port = Some(this_port);
    }
    assert!(
        stderr.contains("Started distributed worker processes:"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("world_rank=").count(), 2, "{stderr}");
    assert!(
        stderr.contains("Setting up process group for: env:// [rank=0, world_size=2]"),
        "{stderr}"
    );
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn a_rank_that_exits_non_zero_fails_the_run_naming_it_its_code_and_its_last_lines() {
    let sandbox = Sandbox::new("exit");
    let started = Instant::now();
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5"],
        &[
            "sh",
            "-c",
            "if [ $RANK = 1 ]; then echo preparing; echo giving up >&2; exit 3; fi; echo rank 0 is training; exec sleep 60",
        ],
        Duration::from_secs(60),
    );
    let stderr = text(&out.stderr);
    assert!(
        text(&out.stdout).contains(") rank 0 is training"),
        "the other rank's output on its way is not lost: {}",
        text(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rank 1 exited with code 3"), "{stderr}");
    assert!(
        stderr.contains("(rank=1) giving up"),
        "last lines: {stderr}"
    );
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: "), "one error line last: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "rank 0's sleep was not waited for: {:?}",
        started.elapsed()
    );
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

/// A rendezvous the ranks' host cannot reach (`MASTER_ADDR` given, in the documentation
/// prefix no network routes) fails the attempt within seconds, before any task starts, naming
/// the rank, its host, the address, the port and the interface, instead of every rank waiting
/// out the process group's timeout (30 minutes by default) in `init_process_group`.
#[test]
fn a_rendezvous_no_host_can_reach_fails_before_any_task_starts_naming_it() {
    let sandbox = Sandbox::new("preflight");
    let started = Instant::now();
    let out = run(
        &sandbox,
        &[
            "-n",
            "2",
            "-r",
            "CPU=0.5",
            "--env",
            "MASTER_ADDR=2001:db8::1",
            "--env",
            "MASTER_PORT=29500",
        ],
        &["sh", "-c", "echo task started; exec sleep 60"],
        Duration::from_secs(60),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        !text(&out.stdout).contains("task started"),
        "no task starts: {}",
        text(&out.stdout)
    );
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("rank 0's host")
            && last.contains("cannot reach the rendezvous [2001:db8::1]:29500")
            && last.contains("interface"),
        "names the rank, the address, the port and the interface: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "fails in seconds: {:?}",
        started.elapsed()
    );
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_with_the_signal() {
    let sandbox = Sandbox::new("signal");
    let out = run(
        &sandbox,
        &["-n", "1", "-r", "CPU=0.5"],
        &["sh", "-c", "kill -9 $$"],
        Duration::from_secs(60),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("rank 0 was killed by signal 9 (SIGKILL)"),
        "{stderr}"
    );
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn a_rank_over_its_memory_limit_is_reported_as_such() {
    let sandbox = Sandbox::new("memory");
    let out = run(
        &sandbox,
        &[
            "-n",
            "1",
            "-r",
            r#"{"CPU": 0.5, "memory": "64MiB"}"#,
            "--enforce-memory",
        ],
        &["python3", "-c", common::TOUCH_512MIB],
        Duration::from_secs(60),
    );
    common::assert_stopped_by_64mib_limit(&out);
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn a_rank_that_ignores_sigterm_is_killed_after_the_patience_when_another_fails() {
    let sandbox = Sandbox::new("hang");
    let started = Instant::now();
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5"],
        &[
            "sh",
            "-c",
            "if [ $RANK = 0 ]; then sleep 0.5; exit 1; fi; trap '' TERM; while true; do sleep 1; done",
        ],
        Duration::from_secs(60),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rank 0 exited with code 1"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopping the hung rank took {:?}",
        started.elapsed()
    );
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn max_failures_restarts_once_and_a_transient_fault_then_succeeds() {
    let sandbox = Sandbox::new("restart");
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5", "--max-failures", "1"],
        &[
            "sh",
            "-c",
            "if [ $TRAINYARD_RESTART_COUNT = 0 ] && [ $RANK = 0 ]; then exit 1; fi; echo attempt $TRAINYARD_RESTART_COUNT ok",
        ],
        Duration::from_secs(60),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.matches("attempt 1 ok").count(), 2, "{stdout}");
    assert!(stderr.contains("(2 attempts)"), "{stderr}");
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn a_program_that_does_not_exist_fails_once_not_once_per_restart() {
    let sandbox = Sandbox::new("missing");
    let started = Instant::now();
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5", "--max-failures", "5"],
        &["no-such-program-anywhere", "--flag"],
        Duration::from_secs(60),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("program `no-such-program-anywhere` was not found"),
        "{stderr}"
    );
    assert!(stderr.contains("after 1 attempt"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn a_request_no_node_can_hold_fails_at_once_with_exit_3() {
    let sandbox = Sandbox::new("infeasible");
    let started = Instant::now();
    let out = run(
        &sandbox,
        &["-n", "1", "-r", "CPU=1000"],
        &["true"],
        Duration::from_secs(30),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("CPU"), "{stderr}");
    assert!(stderr.contains("bundle 0"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Starts a run whose ranks print `started` and then sleep, and waits for both lines.
fn start_sleeping_run(sandbox: &Sandbox) -> (Running, Vec<u32>) {
    let mut run = Running::start(&mut run_command(
        sandbox,
        &["-n", "2", "-r", "CPU=0.5"],
        &["sh", "-c", "echo started; exec sleep 120"],
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    while seen < 2 {
        match run.next_line(deadline.saturating_duration_since(Instant::now())) {
            Some((_, line)) if line.ends_with(" started") => seen += 1,
            Some(_) => {}
            None => panic!(
                "the workers did not start within a minute:\n{}",
                run.stdout()
            ),
        }
    }
    // A task may be between `sh` and `exec sleep` for a moment; look again until all four
    // processes show.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut workers = marked(sandbox.mark());
    while workers.len() < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        workers = marked(sandbox.mark());
    }
    assert!(workers.len() >= 4, "two agents and two tasks: {workers:?}");
    (run, workers)
}

#[test]
fn sigint_and_sigterm_stop_the_workers_and_exit_130() {
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let sandbox = Sandbox::new("interrupt");
        let (run, _) = start_sleeping_run(&sandbox);
        let pid = Pid::from_raw(i32::try_from(run.id()).expect("pid"));
        let sent = Instant::now();
        kill(pid, signal).expect("signal the driver");
        let ended = run.finish(Duration::from_secs(30));
        assert_eq!(ended.code(), Some(130), "{signal}: {}", ended.all());
        let took = ended.at.duration_since(sent);
        assert!(
            took < Duration::from_secs(10),
            "{signal}: stopping took {took:?}"
        );
        assert_nothing_left(&sandbox, Duration::from_secs(5));
    }
}

#[test]
fn the_workers_die_with_a_driver_killed_by_sigkill() {
    let sandbox = Sandbox::new("sigkill");
    let (mut run, _) = start_sleeping_run(&sandbox);
    run.kill();
    assert_nothing_left(&sandbox, Duration::from_secs(5));
}

#[test]
fn bad_run_input_exits_2_with_one_line() {
    let cases: &[&[&str]] = &[
        &["run"],
        &["run", "-n", "0", "--", "true"],
        &["run", "--nodes", "0", "--", "true"],
        &["run", "--num-gpus", "-1", "--", "true"],
        &["run", "--memory", "lots", "--", "true"],
        &["run", "--max-failures", "-2", "--", "true"],
        &["run", "--env", "NOEQUALS", "--", "true"],
        &["run", "--placement-timeout", "0", "--", "true"],
        &["run", "--runtime", "ray", "--num-cpus", "2", "--", "true"],
        &["run", "--runtime", "ray", "--no-wait", "--", "true"],
        &["run", "--wait-for-resources", "--", "true"],
        &["run", "--address", "10.0.0.1:6379", "--", "true"],
        &[
            "run",
            "--runtime",
            "ray",
            "--env-from-driver",
            "=X",
            "--",
            "true",
        ],
        &[
            "run",
            "--runtime",
            "ray",
            "--address",
            "127.0.0.1:1",
            "--",
            "true",
        ],
        &["run", "--resources", "CPU=4", "--", "true"],
    ];
    let sandbox = Sandbox::new("bad-run-input");
    for args in cases {
        let out = Command::new(binary())
            .args(*args)
            .envs(sandbox.env())
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("trainyard runs");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn cluster_shows_the_nodes_as_text_and_json() {
    let sandbox = Sandbox::new("cluster");
    let out = Command::new(binary())
        .envs(sandbox.env())
        .args([
            "cluster",
            "--nodes",
            "2",
            "--num-cpus",
            "4",
            "--memory",
            "8GiB",
            "--num-gpus",
            "2",
            "--format",
            "json",
        ])
        .output()
        .expect("trainyard runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let nodes = json["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0]["resources"]["CPU"], 2);
    assert_eq!(nodes[1]["gpu_ids"], serde_json::json!(["1"]));
    let out = Command::new(binary())
        .envs(sandbox.env())
        .args(["cluster", "--num-cpus", "3"])
        .output()
        .expect("trainyard runs");
    let stdout = text(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("local-0") && stdout.contains("CPU=3"),
        "{stdout}"
    );
}

/// The local runtime passes the driver's whole environment to its workers, as `torchrun`
/// does (a remote runtime passes only what it is given: see `tests/ray.rs`).
#[test]
fn the_local_runtime_passes_the_drivers_environment() {
    let sandbox = Sandbox::new("driver-env");
    let child = run_command(
        &sandbox,
        &["-n", "1"],
        &["sh", "-c", "echo driver=$TY_DRIVER_VAR"],
    )
    .env("TY_DRIVER_VAR", "from-the-driver")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("trainyard starts");
    let output = wait_bounded(child, Duration::from_secs(60));
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("driver=from-the-driver"),
        "{}",
        text(&output.stdout)
    );
    assert!(left_behind(sandbox.mark(), Duration::from_secs(10)).is_empty());
}

/// Every report a worker sent before it died reaches the driver, in order per rank: rank 1
/// sends 300 reports and waits; then rank 0 sends 300 and SIGKILLs itself, which ends the
/// attempt and gets rank 1 stopped. Nothing either sent may be missing.
#[test]
fn reports_sent_before_a_worker_dies_are_not_lost() {
    let sandbox = Sandbox::new("reports");
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let flag = scratch.path().join("rank-1-reported");
    let python_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python");
    let script = "import os, signal, time, trainyard_report as r\n\
        rank, flag = int(os.environ['RANK']), os.environ['TY_FLAG']\n\
        if rank == 0:\n    while not os.path.exists(flag): time.sleep(0.01)\n\
        for step in range(300): r.report({'step': step})\n\
        if rank == 1:\n    open(flag, 'w').close()\n    time.sleep(60)\n\
        os.kill(os.getpid(), signal.SIGKILL)\n";
    let env = format!("TY_FLAG={}", flag.display());
    let child = run_command(
        &sandbox,
        &["-n", "2", "--log-format", "json", "--env", &env],
        &["python3", "-c", script],
    )
    .env("PYTHONPATH", &python_dir)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("trainyard starts");
    let output = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let events = json_events(&text(&output.stdout));
    for rank in 0..2 {
        let steps = report_steps(&events, rank);
        assert_eq!(
            steps,
            (0..300).collect::<Vec<u64>>(),
            "rank {rank}'s reports, all and in order"
        );
    }
    assert!(left_behind(sandbox.mark(), Duration::from_secs(10)).is_empty());
}
