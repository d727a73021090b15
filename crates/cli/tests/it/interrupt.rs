//! Interrupting `trainyard run` before its workers start: what the driver started is stopped,
//! and it exits 130 like any interrupted run.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Waits up to `limit` for `child` to exit; its exit code (`None` when a signal ended it).
fn exit_code_within(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("trainyard did not exit within {limit:?} of the interrupt");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` still runs (a zombie runs no more).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X']))
    })
}

/// Waits up to `limit` for process `pid` to be gone; whether it is.
fn gone_within(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while running(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Waits up to `limit` for `path` to exist.
fn appears(path: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A Ctrl-C while the Ray runtime starts its throwaway head (here a stand-in for Python that
/// says it started, then waits as a head that is slow to come up) stops what was started.
#[test]
fn an_interrupt_while_the_runtime_starts_stops_what_was_started_and_exits_130() {
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let started = dir.path().join("started");
        let python = dir.path().join("python");
        std::fs::write(
            &python,
            format!(
                "#!/bin/sh\necho $$ > '{0}.tmp' && mv '{0}.tmp' '{0}'\nexec sleep 300\n",
                started.display()
            ),
        )
        .expect("write the stand-in");
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755))
            .expect("make it executable");
        let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(["run", "--runtime", "ray", "--", "true"])
            .env("TRAINYARD_RAY_PYTHON", &python)
            .env_remove("RAY_ADDRESS")
            .env("CI", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("trainyard starts");
        if !appears(&started, Duration::from_secs(30)) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{signal}: the stand-in for Python never started");
        }
        let head: u32 = std::fs::read_to_string(&started)
            .expect("the stand-in's pid")
            .trim()
            .parse()
            .expect("a pid");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        kill(pid, signal).expect("interrupt the driver");
        let code = exit_code_within(&mut child, Duration::from_secs(30));
        let stopped = gone_within(head, Duration::from_secs(5));
        if !stopped {
            let _ = kill(
                Pid::from_raw(i32::try_from(head).expect("pid")),
                Signal::SIGKILL,
            );
        }
        assert_eq!(code, Some(130), "{signal}");
        assert!(
            stopped,
            "{signal}: the stand-in for the head (pid {head}) was left running"
        );
    }
}

/// A Ctrl-C while the tasks run reaches them as SIGTERM, and what their handlers print still
/// reaches stdout before the driver exits 130; JSON output ends with `run_interrupted`.
#[test]
fn what_the_tasks_print_as_they_stop_reaches_stdout_and_json_ends_with_run_interrupted() {
    use std::io::{BufRead as _, BufReader};

    use trainyard_test_support::processes::{MARKER, Sandbox, left_behind};

    for format in ["text", "json"] {
        let sandbox = Sandbox::new("last-words");
        let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(["run", "-n", "2", "-r", "CPU=0.5", "--log-format", format])
            .args(["--env", &format!("{MARKER}={}", sandbox.mark())])
            .args([
                "--",
                "sh",
                "-c",
                "trap 'echo bye from $RANK; exit 0' TERM; echo up; sleep 600 & wait",
            ])
            .envs(sandbox.env())
            .env("CI", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("trainyard starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while lines
            .iter()
            .filter(|l: &&String| l.contains(" up") || l.contains("\"line\":\"up\""))
            .count()
            < 2
        {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => lines.push(line),
                Err(_) => {
                    let _ = child.kill();
                    panic!("{format}: the tasks did not start: {lines:?}");
                }
            }
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        kill(pid, Signal::SIGINT).expect("interrupt the driver");
        let code = exit_code_within(&mut child, Duration::from_secs(30));
        reader.join().expect("the reader ends with stdout");
        lines.extend(rx.try_iter());
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        assert_eq!(code, Some(130), "{format}: {stderr}");
        for rank in 0..2 {
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains(&format!("bye from {rank}"))),
                "{format}: rank {rank}'s handler's line is missing: {lines:?} {stderr}"
            );
        }
        if format == "json" {
            let last: serde_json::Value =
                serde_json::from_str(lines.last().expect("a line")).expect("JSON");
            assert_eq!(last["event"], "run_interrupted", "{lines:?}");
            assert_eq!(last["stopped"], true, "{lines:?}");
        } else {
            assert!(
                lines
                    .iter()
                    .any(|l| l.starts_with("(rank=1, pid=") && l.ends_with(") bye from 1")),
                "{lines:?}"
            );
        }
        let left = left_behind(sandbox.mark(), Duration::from_secs(10));
        assert!(left.is_empty(), "{format}: processes left behind: {left:?}");
    }
}
