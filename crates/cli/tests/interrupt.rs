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
