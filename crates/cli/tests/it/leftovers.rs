//! The leftover checks of the CLI tests and the soak find what a run leaves behind, an
//! agent's watchdog included: a forked one carries its agent's environment, the marker
//! among it (one started as a program carries none, and is found through its agent while
//! that lives); either is found as an orphan of this session once its agent is gone.
//!
//! A test binary of its own: the watchdog it leaves behind on purpose, for a moment, is an
//! orphan that the leftover checks of a test running beside it would wait for.

use trainyard_test_support::processes as common;

use std::fs::OpenOptions;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{MARKER, Sandbox, is_watchdog, left_behind, marked, orphaned_watchdogs};
/// Polls `check` every 20 ms until it holds or `limit` passes; whether it held.
fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !check() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_watchdog_left_behind_by_a_killed_run_is_found_as_left_behind() {
    let sandbox = Sandbox::new("leftover-watchdog");
    let mut driver = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["run", "-n", "2", "-r", "CPU=0.5", "--backend", "none"])
        .args(["--env", &format!("{MARKER}={}", sandbox.mark())])
        .args(["--", "sh", "-c", "echo started; exec sleep 120"])
        .envs(sandbox.env())
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("trainyard starts");
    let stdout = driver.stdout.take().expect("stdout");
    let started = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .filter(|line| line.ends_with(" started"))
        .take(2)
        .count();
    assert_eq!(started, 2, "both ranks start");

    // While the agents live, their watchdogs are theirs.
    let mut watchdogs = Vec::new();
    let found = eventually(Duration::from_secs(10), || {
        watchdogs = marked(sandbox.mark())
            .into_iter()
            .filter(|p| is_watchdog(*p))
            .collect();
        watchdogs.len() == 2
    });
    assert!(found, "one watchdog per agent: {watchdogs:?}");

    // A watchdog whose stdin someone else also holds open never sees its agent go: it
    // stays behind when the run is killed, until that other end closes too.
    let stuck = watchdogs[0];
    let other_end = OpenOptions::new()
        .write(true)
        .open(format!("/proc/{stuck}/fd/0"))
        .expect("open the watchdog's stdin pipe");
    driver.kill().expect("SIGKILL the driver");
    let _ = driver.wait();
    // A forked watchdog carries its agent's environment, the marker among it.
    let only_it_left = eventually(Duration::from_secs(10), || {
        marked(sandbox.mark()).iter().all(|pid| *pid == stuck)
    });
    let orphans = orphaned_watchdogs();
    let left = left_behind(sandbox.mark(), Duration::ZERO);
    // End of file: the watchdog ends, before the assertions, which may fail.
    drop(other_end);
    assert!(only_it_left, "everything else of the run is gone");
    assert!(orphans.contains(&stuck), "{stuck} in {orphans:?}");
    assert!(left.contains(&stuck), "{stuck} in {left:?}");
    assert!(
        left_behind(sandbox.mark(), Duration::from_secs(10)).is_empty(),
        "nothing is left once the watchdog is killed"
    );
}
