//! Hung ranks, root causes, on-demand stacks and per-rank log files through the built
//! binary: real worker processes, real PyTorch (gloo) where the case is about Python, and
//! plain shell commands where any process will do.

use trainyard_test_support::processes as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{MARKER, Sandbox, json_events, left_behind, root, torch_python};
use trainyard_test_support::running::{Ended, Running};

/// How long one run may take before the test kills it.
const RUN_LIMIT: Duration = Duration::from_secs(240);

/// A `trainyard run` confined to `sandbox`, named `name`, with two workers.
fn trainyard(sandbox: &Sandbox, name: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .current_dir(root())
        .args(["run", "-n", "2", "-r", "CPU=0.5", "--name", name])
        .args(["--env", &format!("{MARKER}={}", sandbox.mark())])
        .envs(sandbox.env())
        .env(MARKER, sandbox.mark())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A Python script of this test's own.
fn script(name: &str) -> PathBuf {
    root().join("crates/cli/tests/python").join(name)
}

/// The line of `file` that holds `needle`, counting from 1.
fn line_of(file: &Path, needle: &str) -> usize {
    let text = std::fs::read_to_string(file).expect("the script is readable");
    text.lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
        .expect("the script holds the line")
}

/// The stacks block's line of `rank` on stderr.
fn stacks_line(stderr: &str, rank: u32) -> &str {
    let prefix = format!("  rank {rank}: ");
    stderr
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no stacks line of rank {rank} in:\n{stderr}"))
}

fn assert_nothing_left(sandbox: &Sandbox) {
    let left = left_behind(sandbox.mark(), Duration::from_secs(10));
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn a_hung_torch_rank_is_stopped_with_every_ranks_stacks() {
    let Some(python) = torch_python() else {
        return;
    };
    let sandbox = Sandbox::new("hang-torch");
    let mut command = trainyard(&sandbox, "hang");
    command
        // Importing torch and joining the group come before the first report, against the
        // same clock: 20 s fits them on a loaded machine.
        .args(["--hang-timeout", "20s", "--"])
        .arg(&python)
        .arg(script("hang.py"));
    let mut run = Running::start(&mut command);
    // Both ranks are past init_process_group: rank 1 sleeps, rank 0 waits in all_reduce.
    run.expect_line("rank 0 ready", RUN_LIMIT);
    let ready = run.expect_line("rank 1 ready", RUN_LIMIT);
    let Ended {
        status,
        at: ended,
        stdout,
        stderr,
        ..
    } = run.finish(RUN_LIMIT);
    let code = status.code();
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let took = ended.duration_since(ready);
    // 20 s, then both ranks' stacks (py-spy, slow on a loaded machine) and the stop.
    assert!(
        took < Duration::from_secs(26),
        "the hang ended {took:?} after both ranks were ready (20 s timeout + 6 s)\n{stderr}"
    );
    assert!(
        stderr.contains("no progress within the hang timeout; every rank's stacks:"),
        "{stderr}"
    );
    let rank_0 = stacks_line(&stderr, 0);
    let rank_1 = stacks_line(&stderr, 1);
    assert!(
        rank_0.contains("all_reduce"),
        "rank 0 waits in all_reduce: {rank_0}\n{stderr}"
    );
    assert!(
        rank_1.contains("sleep"),
        "rank 1 sleeps: {rank_1}\n{stderr}"
    );
    assert!(
        rank_1.contains("hang.py:"),
        "rank 1's frame in the script: {rank_1}"
    );
    assert!(
        stderr.contains("made no progress for 20 s"),
        "the failure says how long: {stderr}"
    );
    // The full dumps and every rank's output are in the run's log folder.
    let logs = sandbox.storage().join("hang/logs/attempt_0");
    let dump = std::fs::read_dir(&logs)
        .expect("the log folder exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("stacks-"))
        })
        .expect("a stack dump");
    let dump = std::fs::read_to_string(dump).unwrap();
    assert!(
        dump.contains("=== rank 0 ===") && dump.contains("=== rank 1 ==="),
        "{dump}"
    );
    assert!(dump.contains("distributed_c10d.py"), "{dump}");
    let rank_1_log = std::fs::read_to_string(logs.join("rank_1.log")).unwrap();
    assert!(rank_1_log.contains(" stdout rank 1 ready"), "{rank_1_log}");
    assert!(
        stderr.contains(&format!(
            "rank 1's output: {}",
            logs.join("rank_1.log").display()
        )) || stderr.contains(&format!(
            "rank 0's output: {}",
            logs.join("rank_0.log").display()
        )),
        "the summary names the log file: {stderr}"
    );
    assert_nothing_left(&sandbox);
}

#[test]
fn a_hung_shell_command_shows_process_state_and_wait_channel() {
    let sandbox = Sandbox::new("hang-shell");
    let mut command = trainyard(&sandbox, "hang-shell");
    command.args([
        "--backend",
        "none",
        "--hang-timeout",
        "2s",
        "--progress",
        "output",
        "--",
        "sh",
        "-c",
        "echo up; sleep 600; echo never",
    ]);
    let mut run = Running::start(&mut command);
    let up = run.expect_line("up", RUN_LIMIT);
    let Ended {
        status,
        at: ended,
        stdout,
        stderr,
        ..
    } = run.finish(RUN_LIMIT);
    let code = status.code();
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(
        ended.duration_since(up) < Duration::from_secs(5),
        "{stderr}"
    );
    for rank in 0..2 {
        let line = stacks_line(&stderr, rank);
        // The leaf of the tree, `sleep`, waits in the kernel's nanosleep.
        assert!(line.contains(", S ") && line.contains("sleep"), "{line}");
    }
    let logs = sandbox.storage().join("hang-shell/logs/attempt_0");
    let dump = std::fs::read_dir(&logs)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("stacks-"))
        .expect("a stack dump");
    let dump = std::fs::read_to_string(dump.path()).unwrap();
    assert!(
        dump.contains("sh -c echo up; sleep 600; echo never"),
        "{dump}"
    );
    assert!(dump.contains(": sleep 600\n"), "{dump}");
    assert!(dump.contains("waits in hrtimer_nanosleep"), "{dump}");
    assert_nothing_left(&sandbox);
}

/// Runs `bad_batch.py` (with `extra` script arguments); exit code, stdout, stderr.
fn bad_batch(
    sandbox: &Sandbox,
    name: &str,
    flags: &[&str],
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let python = torch_python().expect("checked by the caller");
    let mut command = trainyard(sandbox, name);
    command
        .args(flags)
        .arg("--")
        .arg(&python)
        .arg(script("bad_batch.py"))
        .args(extra);
    let ended = Running::start(&mut command).finish(RUN_LIMIT);
    (ended.code(), ended.stdout, ended.stderr)
}

#[test]
fn the_root_cause_is_the_first_rank_to_fail_with_its_recorded_exception() {
    if torch_python().is_none() {
        return;
    }
    let sandbox = Sandbox::new("root-cause");
    let (code, stdout, stderr) = bad_batch(&sandbox, "recorded", &["--log-format", "json"], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    let events = json_events(&stdout);
    let failed = events
        .iter()
        .find(|e| e["event"] == "run_failed")
        .unwrap_or_else(|| panic!("a run_failed event: {stdout}"));
    let failure = &failed["report"]["failures"][0];
    assert_eq!(failure["kind"], "task_failed", "{failure}");
    assert_eq!(failure["rank"], 1, "rank 1 failed first: {failure}");
    let error = &failure["error"];
    assert_eq!(error["source"], "error_file", "{error}");
    assert_eq!(error["exception"], "ValueError", "{error}");
    assert_eq!(error["message"], "bad batch", "{error}");
    let script = script("bad_batch.py");
    assert_eq!(error["file"], script.display().to_string(), "{error}");
    assert_eq!(
        error["line"],
        line_of(&script, "raise ValueError"),
        "the traceback's innermost frame: {error}"
    );
    // The exception ends the rank with code 1; now and then gloo's threads abort its
    // interpreter's exit instead (torch's own "terminate called without an active
    // exception", after the error file is written). The root cause is the same either way.
    assert!(
        failed["error"].as_str().is_some_and(|e| {
            (e.contains("rank 1 exited with code 1: ")
                || e.contains("rank 1 was killed by signal 6 (SIGABRT): "))
                && e.contains("ValueError: bad batch")
        }),
        "{failed}"
    );
    assert_nothing_left(&sandbox);
}

#[test]
fn without_record_the_root_cause_comes_from_the_ranks_output() {
    if torch_python().is_none() {
        return;
    }
    let sandbox = Sandbox::new("root-cause-output");
    let (code, _, stderr) = bad_batch(&sandbox, "unrecorded", &[], &["--no-record"]);
    assert_eq!(code, Some(1), "{stderr}");
    let script = script("bad_batch.py");
    let expected = format!(
        "trainyard: root cause: rank 1 failed first, with ValueError: bad batch ({}:{}) (from its output)",
        script.display(),
        line_of(&script, "raise ValueError")
    );
    assert!(
        stderr.contains(&expected),
        "expected `{expected}` in:\n{stderr}"
    );
    assert!(
        stderr.contains("(rank=1) Traceback (most recent call last):"),
        "the traceback is shown: {stderr}"
    );
    let log = sandbox
        .storage()
        .join("unrecorded/logs/attempt_0/rank_1.log");
    assert!(
        stderr.contains(&format!("trainyard: rank 1's output: {}", log.display())),
        "{stderr}"
    );
    assert_nothing_left(&sandbox);
}

#[test]
fn a_rank_that_fails_in_its_collective_after_another_crashed_is_one_line() {
    if torch_python().is_none() {
        return;
    }
    let sandbox = Sandbox::new("followers");
    // Rank 0 fails as soon as rank 1's process ends; the driver stops it 20 ms after the
    // last line it heard, so on a loaded machine rank 0 may be stopped before it prints.
    // Such a try shows nothing to fold: another one is made.
    for attempt in 0..3 {
        let name = format!("followers-{attempt}");
        let (code, _, stderr) = bad_batch(&sandbox, &name, &[], &["--no-record", "--waiting"]);
        assert_eq!(code, Some(1), "{stderr}");
        let log = sandbox
            .storage()
            .join(format!("{name}/logs/attempt_0/rank_0.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if !text.contains("[rank0]: Traceback (most recent call last):") {
            eprintln!("try {attempt}: rank 0 was stopped before it failed; again");
            continue;
        }
        // Rank 1's traceback as it came, then rank 0's gloo failure in one line.
        let crash = stderr
            .find("[rank1]: Traceback (most recent call last):")
            .unwrap_or_else(|| panic!("rank 1's traceback is shown: {stderr}"));
        assert!(
            stderr[crash..].contains("[rank1]: ValueError: bad batch"),
            "{stderr}"
        );
        assert!(
            !stderr.contains("[rank0]: Traceback"),
            "rank 0's traceback is not shown: {stderr}"
        );
        let folded = stderr
            .lines()
            .find(|line| line.starts_with("trainyard: rank 0 raised "))
            .unwrap_or_else(|| panic!("a line for rank 0's failure: {stderr}"));
        assert!(
            folded.contains(" s after rank 1: RuntimeError: ")
                && folded.contains("Connection closed by peer")
                && folded.ends_with(&format!(" lines): {}", log.display())),
            "{folded}"
        );
        assert!(
            stderr
                .contains("trainyard: root cause: rank 1 failed first, with ValueError: bad batch"),
            "{stderr}"
        );
        assert_nothing_left(&sandbox);
        return;
    }
    panic!("rank 0 was stopped before it failed in 3 tries");
}

#[test]
fn sigquit_prints_a_healthy_runs_stacks_and_the_run_completes() {
    let Some(python) = torch_python() else {
        return;
    };
    let sandbox = Sandbox::new("sigquit");
    let mut command = trainyard(&sandbox, "sigquit");
    command.arg("--").arg(&python).arg(script("healthy.py"));
    let mut run = Running::start(&mut command);
    run.expect_line("rank 0 step 3", RUN_LIMIT);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT).expect("SIGQUIT is sent");
    let Ended {
        status,
        stdout,
        stderr,
        ..
    } = run.finish(RUN_LIMIT);
    let code = status.code();
    assert_eq!(code, Some(0), "the run completes:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains("every rank's stacks (SIGQUIT; the run goes on):"),
        "{stderr}"
    );
    for rank in 0..2 {
        let line = stacks_line(&stderr, rank);
        assert!(line.contains("healthy.py:"), "{line}");
    }
    assert!(stdout.contains("rank 1 done"), "{stdout}");
    assert_nothing_left(&sandbox);
}

#[test]
fn every_rank_has_a_log_file_and_ranks_filters_only_the_console() {
    let sandbox = Sandbox::new("rank-logs");
    let mut command = trainyard(&sandbox, "filtered");
    command.args([
        "--backend",
        "none",
        "--ranks",
        "1",
        "--",
        "sh",
        "-c",
        "echo out of $TRAINYARD_WORLD_RANK; echo err of $TRAINYARD_WORLD_RANK >&2",
    ]);
    let Ended {
        status,
        stdout,
        stderr,
        ..
    } = Running::start(&mut command).finish(RUN_LIMIT);
    let code = status.code();
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(") out of 1"), "{stdout}");
    assert!(stderr.contains(") err of 1"), "{stderr}");
    assert!(
        !stdout.contains("out of 0") && !stderr.contains("err of 0"),
        "{stdout}\n{stderr}"
    );
    let logs = sandbox.storage().join("filtered/logs/attempt_0");
    for rank in 0..2 {
        let text = std::fs::read_to_string(logs.join(format!("rank_{rank}.log"))).unwrap();
        assert!(text.contains(&format!(" stdout out of {rank}")), "{text}");
        assert!(text.contains(&format!(" stderr err of {rank}")), "{text}");
    }
    // --log-dir puts them elsewhere.
    let elsewhere = sandbox.storage().join("elsewhere");
    let mut command = trainyard(&sandbox, "elsewhere");
    command
        .args(["--backend", "none", "--log-dir"])
        .arg(&elsewhere)
        .args(["--", "sh", "-c", "echo hi from $TRAINYARD_WORLD_RANK"]);
    let Ended { status, stderr, .. } = Running::start(&mut command).finish(RUN_LIMIT);
    let code = status.code();
    assert_eq!(code, Some(0), "{stderr}");
    let text = std::fs::read_to_string(elsewhere.join("attempt_0/rank_1.log")).unwrap();
    assert!(text.contains(" stdout hi from 1"), "{text}");
    assert_nothing_left(&sandbox);
}
