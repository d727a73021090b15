//! What `trainyard run`, `plan` and `cluster` print, through the built binary: reports,
//! restarts, the worker list, sizes, the wording of what cannot be placed, and `--help`.
//! Every run carries its sandbox's marker, and each test checks that nothing is left running.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{MARKER, Sandbox, left_behind};
use trainyard_test_support::processes as common;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_trainyard"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `trainyard ARGS` in `sandbox`, started.
fn start(sandbox: &Sandbox, args: &[&str]) -> std::process::Child {
    Command::new(binary())
        .args(args)
        .envs(sandbox.env())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .env(
            "PYTHONPATH",
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts")
}

/// `trainyard ARGS` in `sandbox`, run to the end within `limit`.
fn trainyard(sandbox: &Sandbox, args: &[&str], limit: Duration) -> Output {
    let mut child = start(sandbox, args);
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "trainyard did not finish within {limit:?}; stderr: {}",
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// `trainyard run` with the sandbox's marker, `args`, then `--` and `program`.
fn run(sandbox: &Sandbox, args: &[&str], program: &[&str]) -> Output {
    let marker = format!("{MARKER}={}", sandbox.mark());
    let mut all = vec!["run", "--env", &marker];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(program);
    let out = trainyard(sandbox, &all, Duration::from_secs(60));
    let left = left_behind(sandbox.mark(), Duration::from_secs(10));
    assert!(left.is_empty(), "processes left behind: {left:?}");
    out
}

#[test]
fn each_report_of_rank_0_is_one_line_and_the_last_metrics_end_the_run() {
    let sandbox = Sandbox::new("report-lines");
    let script = "import os, trainyard_report as r\n\
        rank = int(os.environ['RANK'])\n\
        for epoch in range(1, 4): r.report({'epoch': epoch, 'loss': 1.0 / (epoch * (rank + 1)), 'phase': 'train'})\n";
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5"],
        &["python3", "-c", script],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("trainyard: report "))
        .collect();
    assert_eq!(
        lines,
        [
            "trainyard: report 1 (rank 0): epoch=1 loss=1.0 phase=train",
            "trainyard: report 2 (rank 0): epoch=2 loss=0.5 phase=train",
            "trainyard: report 3 (rank 0): epoch=3 loss=0.3333333333333333 phase=train",
        ],
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "trainyard: last report (rank 0): epoch=3 loss=0.3333333333333333 phase=train"
        ),
        "{stderr}"
    );
}

#[test]
fn a_restart_is_told_once() {
    let sandbox = Sandbox::new("restart-once");
    let out = run(
        &sandbox,
        &["-n", "1", "-r", "CPU=0.5", "--max-failures", "1"],
        &["sh", "-c", "exit 3"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let told: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("restarting"))
        .collect();
    assert_eq!(told.len(), 1, "{stderr}");
    assert!(
        told[0].starts_with("trainyard: attempt 1 failed"),
        "{stderr}"
    );
}

#[test]
fn the_worker_list_shows_the_pid_that_output_lines_carry() {
    let sandbox = Sandbox::new("worker-pids");
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5"],
        &["sh", "-c", "echo hello"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let pid_of = |line: &str| -> String {
        let start = line.find("pid=").expect("a pid") + 4;
        line[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect()
    };
    let listed: Vec<String> = stderr
        .lines()
        .filter(|l| l.starts_with("- (node_id="))
        .map(pid_of)
        .collect();
    let printed: Vec<String> = ["(rank=0, ", "(rank=1, "]
        .iter()
        .map(|prefix| {
            pid_of(
                stdout
                    .lines()
                    .find(|l| l.starts_with(prefix))
                    .unwrap_or_else(|| panic!("no line of {prefix} in {stdout}")),
            )
        })
        .collect();
    assert_eq!(listed, printed, "stdout: {stdout} stderr: {stderr}");
}

#[test]
fn sizes_read_as_people_read_them_in_text_and_as_bytes_in_json() {
    let sandbox = Sandbox::new("sizes");
    let args = ["cluster", "--num-cpus", "2", "--memory", "25276063744"];
    let out = trainyard(&sandbox, &args, Duration::from_secs(30));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("memory=23.5GiB"), "{stdout}");
    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let out = trainyard(&sandbox, &json_args, Duration::from_secs(30));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["nodes"][0]["resources"]["memory"], 25_276_063_744_u64);

    let out = trainyard(
        &sandbox,
        &[
            "plan",
            "--runtime",
            "local",
            "--num-cpus",
            "2",
            "--memory",
            "25276063744",
            "-r",
            "CPU=1,memory=1536MiB",
        ],
        Duration::from_secs(30),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("(CPU=1,memory=1.5GiB) ->"), "{stdout}");
}

#[test]
fn a_plan_that_cannot_be_placed_says_so_not_that_a_run_failed() {
    let sandbox = Sandbox::new("plan-wording");
    let out = trainyard(
        &sandbox,
        &[
            "plan",
            "--runtime",
            "local",
            "--num-cpus",
            "2",
            "-r",
            "CPU=4",
        ],
        Duration::from_secs(30),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.starts_with("error: the workers cannot be scheduled on local: "),
        "{stderr}"
    );
    assert!(!stderr.contains("run failed"), "{stderr}");
}

#[test]
fn run_help_says_that_backend_none_runs_plain_commands() {
    let sandbox = Sandbox::new("help");
    let out = trainyard(&sandbox, &["run", "--help"], Duration::from_secs(30));
    let help = text(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(out.status.success());
    assert!(help.contains("none runs plain commands"), "{help}");
    assert!(help.contains("Setting up process group"), "{help}");
}

/// The phases `--timings` shows, in launch order, then shutdown.
const PHASES: [&str; 11] = [
    "cluster",
    "run_folder",
    "reserve",
    "agents",
    "spawn",
    "handshake",
    "worker_info",
    "setup",
    "task_start",
    "first_output",
    "shutdown",
];

#[test]
fn timings_name_every_phase_in_launch_order_and_the_phases_add_up_to_the_launch() {
    let sandbox = Sandbox::new("timings-json");
    let out = run(
        &sandbox,
        &[
            "-n",
            "2",
            "-r",
            "CPU=0.5",
            "--timings",
            "--log-format",
            "json",
        ],
        &["sh", "-c", "sleep 0.1; echo first line of $RANK"],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = common::json_events(&stdout);
    let names: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    let at = names
        .iter()
        .position(|n| *n == "timings")
        .expect("a timings event");
    // After the run's own last event: the launch is timed once the run is over.
    assert_eq!(names[at - 1..], ["run_succeeded", "timings"], "{stdout}");
    let attempts = events[at]["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "{stdout}");
    let attempt = &attempts[0];
    let phases = attempt["phases"].as_array().expect("phases");
    let shown: Vec<&str> = phases.iter().filter_map(|p| p["phase"].as_str()).collect();
    assert_eq!(shown, PHASES, "{stdout}");
    for phase in phases {
        let per_worker = [
            "spawn",
            "handshake",
            "worker_info",
            "task_start",
            "first_output",
        ]
        .contains(&phase["phase"].as_str().unwrap_or_default());
        assert_eq!(
            phase["workers"]["count"].as_u64(),
            per_worker.then_some(2),
            "{phase}"
        );
    }
    let wall = |name: &str| {
        phases
            .iter()
            .find(|p| p["phase"] == name)
            .and_then(|p| p["wall_ms"].as_f64())
            .expect("a wall time")
    };
    // Each rank's first line comes after its `sleep 0.1`, counted from when the driver heard
    // that every task started: the word of a start travels agent → driver while the program
    // already runs, so the phase may be a few milliseconds short of the sleep.
    assert!(wall("first_output") >= 80.0, "{stdout}");
    let launch = attempt["launch_ms"].as_f64().expect("launch_ms");
    let added: f64 = phases
        .iter()
        .filter(|p| p["in_launch"] == true)
        .filter_map(|p| p["wall_ms"].as_f64())
        .sum();
    assert!(
        (added - launch).abs() <= 0.1 * launch,
        "the launch phases add up to {added} ms of a {launch} ms launch: {stdout}"
    );
    // The steps of starting the agents are inside it, not added to the launch again.
    assert!(wall("spawn") <= wall("agents") && wall("handshake") <= wall("agents"));
}

#[test]
fn timings_print_one_row_per_phase_after_the_run_and_only_when_asked() {
    let sandbox = Sandbox::new("timings-text");
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5", "--timings"],
        &["sh", "-c", "echo hello"],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let table: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("launch timings"))
        .collect();
    // Each row starts with what it is, then its times.
    let rows: Vec<&str> = table
        .iter()
        .map(|row| row.trim().split("  ").next().unwrap_or(row))
        .collect();
    assert_eq!(
        rows[..13],
        [
            "launch timings",
            "reading the cluster",
            "opening the run folder",
            "reserving the placement group",
            "starting the agents",
            "spawning an agent (×2)",
            "its handshake (×2)",
            "its metadata (×2)",
            "setting up ranks and the backend",
            "starting the task (×2)",
            "first output line (×2)",
            "launch",
            "shutdown",
        ],
        "{stderr}"
    );
    // After the run, before its last word.
    assert!(
        rows[13].starts_with("trainyard: the run succeeded"),
        "{stderr}"
    );
    let plain = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5"],
        &["sh", "-c", "echo hello"],
    );
    assert!(!text(&plain.stderr).contains("launch timings"));
}

/// Rank `r` hands in a one-file checkpoint with its first report, then: both ranks create
/// `$FLAG`, and rank 1 exits 3 a moment later (`fail`) or every rank sleeps (to be
/// interrupted).
const CHECKPOINT_THEN: &str = r"
import os, sys, tempfile, time
from trainyard import train
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, 'w' + os.environ['RANK'] + '.txt'), 'w').write('x')
    train.report({'epoch': 1}, checkpoint=train.Checkpoint.from_directory(d))
open(os.environ['FLAG'] + os.environ['RANK'], 'w').close()
time.sleep(1 if sys.argv[1] == 'fail' else 60)
sys.exit(3 if os.environ['RANK'] == '1' else 0)
";

#[test]
fn a_failed_run_without_a_name_says_which_name_resumes_it() {
    let sandbox = Sandbox::new("resume-name");
    let flag = sandbox.storage().join("flag");
    let out = run(
        &sandbox,
        &[
            "-n",
            "2",
            "-r",
            "CPU=0.5",
            "--env",
            &format!("FLAG={}", flag.display()),
        ],
        &["python3", "-c", CHECKPOINT_THEN, "fail"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let folder = stderr
        .lines()
        .find_map(|l| l.strip_prefix("trainyard: run folder: "))
        .expect("the run folder is shown");
    let name = Path::new(folder)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a name");
    assert!(
        stderr.lines().any(|l| l
            == format!("trainyard: the same command with --name {name} (and the same --storage) resumes from it")),
        "{stderr}"
    );
}

#[test]
fn an_interrupted_run_says_that_the_same_command_resumes_it() {
    let sandbox = Sandbox::new("resume-interrupted");
    let flag = sandbox.storage().join("flag");
    let marker = format!("{MARKER}={}", sandbox.mark());
    let flag_env = format!("FLAG={}", flag.display());
    let child = start(
        &sandbox,
        &[
            "run",
            "--env",
            &marker,
            "-n",
            "2",
            "-r",
            "CPU=0.5",
            "--name",
            "stopped-run",
            "--env",
            &flag_env,
            "--",
            "python3",
            "-c",
            CHECKPOINT_THEN,
            "sleep",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let flagged = |rank: u32| Path::new(&format!("{}{rank}", flag.display())).exists();
    while !(flagged(0) && flagged(1)) {
        assert!(
            Instant::now() < deadline,
            "the ranks did not report in time"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let child_pid = child.id();
    let interrupted = Command::new("kill")
        .args(["-INT", &child_pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    let out = common::wait_bounded(child, Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.lines().any(|l| l == "trainyard: the same command (same --name and --storage) resumes from it"),
        "{stderr}"
    );
    // The record says so too, and who ran it.
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(sandbox.storage().join("stopped-run/run.json")).expect("run.json"),
    )
    .expect("JSON");
    assert_eq!(record["status"], "interrupted", "{record}");
    assert_eq!(record["version"], 3, "{record}");
    assert_eq!(record["driver"]["pid"], child_pid, "{record}");
    let left = left_behind(sandbox.mark(), Duration::from_secs(10));
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn each_committed_checkpoint_is_one_driver_line() {
    let sandbox = Sandbox::new("checkpoint-lines");
    let script = r"
import os, tempfile
from trainyard import train
for epoch in range(2):
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, 'w' + os.environ['RANK'] + '.txt'), 'w').write('x')
        train.report({'epoch': epoch}, checkpoint=train.Checkpoint.from_directory(d))
";
    let out = run(
        &sandbox,
        &["-n", "2", "-r", "CPU=0.5"],
        &["python3", "-c", script],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("checkpoint committed"))
        .collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("trainyard: checkpoint committed: ")),
        "{stderr}"
    );
}

#[test]
fn a_crash_shows_its_traceback_live_and_once_as_the_root_cause() {
    let sandbox = Sandbox::new("crash-once");
    let script = "def step(batch):\n    raise ValueError(f'bad batch {batch}')\n\nstep(7)\n";
    let out = run(&sandbox, &["-n", "1"], &["python3", "-c", script]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("trainyard: root cause: rank 0 failed first, with ValueError: bad batch 7"),
        "{stderr}"
    );
    // Once as the rank printed it, once under the root cause; not a third time as the
    // rank's last lines.
    let raised = stderr
        .lines()
        .filter(|l| l.trim_end().ends_with("File \"<string>\", line 2, in step"))
        .count();
    assert_eq!(raised, 2, "{stderr}");
    assert!(!stderr.contains("the last lines of rank 0"), "{stderr}");
}

#[test]
fn a_hand_in_beyond_max_checkpoint_size_fails_that_ranks_report() {
    let sandbox = Sandbox::new("checkpoint-cap");
    let script = r"
import os, tempfile
from trainyard import train
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, 'w.bin'), 'wb').write(b'x' * 4096)
    train.report({'epoch': 1}, checkpoint=train.Checkpoint.from_directory(d))
";
    let out = run(
        &sandbox,
        &["--max-checkpoint-size", "1KiB"],
        &["python3", "-c", script],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("more than the 1024 a checkpoint may (max_checkpoint_size)"),
        "{stderr}"
    );
}
