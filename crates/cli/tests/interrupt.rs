//! Interrupting `trainyard run` before its workers start: what the driver started is stopped,
//! and it exits 130 like any interrupted run.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;
use common::{MARKER, left_behind};

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
        let mark = format!("interrupt-start-{signal}-{}", std::process::id());
        let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(["run", "--runtime", "ray", "--", "true"])
            .env("TRAINYARD_RAY_PYTHON", &python)
            .env_remove("RAY_ADDRESS")
            .env(MARKER, &mark)
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
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        kill(pid, signal).expect("interrupt the driver");
        let code = exit_code_within(&mut child, Duration::from_secs(30));
        let left = left_behind(&mark, Duration::from_secs(5));
        for pid in &left {
            let _ = kill(
                Pid::from_raw(i32::try_from(*pid).unwrap_or(i32::MAX)),
                Signal::SIGKILL,
            );
        }
        assert_eq!(code, Some(130), "{signal}");
        assert!(left.is_empty(), "{signal}: left behind: {left:?}");
    }
}
