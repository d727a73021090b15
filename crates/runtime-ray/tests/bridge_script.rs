//! The bridge script's own logic, tested in Python (`bridge_script.py`) with a stand-in for
//! Ray: request lines that are not requests get error replies, work past its deadline is
//! refused, a spawn that completes past its deadline kills its actor, control calls have
//! threads of their own, and an actor kills only its agent and the agent's task groups.
//!
//! It needs a Python 3 (`TRAINYARD_RAY_PYTHON` when set, else `python3`), not Ray.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use std::time::{Duration, Instant};

/// How long the Python tests may take (they take about a second).
const BOUND: Duration = Duration::from_secs(120);

fn python() -> PathBuf {
    std::env::var_os("TRAINYARD_RAY_PYTHON")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

#[test]
fn the_bridge_scripts_own_logic_passes_its_python_tests() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("trainyard_bridge.py");
    std::fs::write(&script, trainyard_runtime_ray::BRIDGE_SCRIPT).expect("write the script");
    let tests = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bridge_script.py");
    let python = python();
    let log_path = dir.path().join("tests.log");
    let log = std::fs::File::create(&log_path).expect("the log file");
    let mut child = Command::new(&python)
        .arg(tests)
        .env("TRAINYARD_BRIDGE_SCRIPT", &script)
        .env_remove("TRAINYARD_BRIDGE_PARENT")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the tests") {
            break status;
        }
        if started.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the bridge script's tests did not finish within {BOUND:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log_path).expect("the tests' output");
    assert!(status.success(), "{status}:\n{text}");
    assert!(text.contains("\nOK"), "{text}");
}
