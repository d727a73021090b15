//! The Python package in `python/`: its own tests (standard library only) pass against the
//! source tree. The wheel (`pyproject.toml` at the root) and the driver's tests with torch run
//! in `cargo xtask ci`, which builds and installs it into a fresh virtual environment.
//!
//! Without `python3` a test says `SKIP:` and passes; under `CI=true` it fails instead, as CI
//! has it.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::process::Command;

/// The bound of every command.
const LIMIT: Duration = Duration::from_secs(180);

/// `python/` of the workspace.
fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../python")
        .canonicalize()
        .expect("python/ exists")
}

/// Runs `command`, bounded, with none of the variables that would point Python at another
/// copy of the package or at a trainyard agent.
async fn run(command: &mut Command) -> std::io::Result<Output> {
    for var in [
        "PYTHONPATH",
        "PYTHONHOME",
        "PIP_INDEX_URL",
        "PIP_REQUIRE_VIRTUALENV",
        "TRAINYARD_REPORT_ADDR",
        "TRAINYARD_REPORT_TOKEN",
    ] {
        command.env_remove(var);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    tokio::time::timeout(LIMIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{command:?} did not end within {LIMIT:?}"))
}

fn text(output: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Says why a test cannot run: `SKIP:`, or under `CI=true` a failure.
fn cannot_run(why: &str) {
    assert!(
        !std::env::var("CI").is_ok_and(|ci| ci == "true"),
        "under CI=true the Python tests run: {why}"
    );
    println!("SKIP: {why}");
}

/// Whether `python3` runs here; says why not when it does not.
async fn python3() -> bool {
    let found = run(Command::new("python3").arg("--version"))
        .await
        .is_ok_and(|out| out.status.success());
    if !found {
        cannot_run("python3 is not on PATH");
    }
    found
}

#[tokio::test]
async fn the_python_package_passes_its_own_tests() {
    if !python3().await {
        return;
    }
    // `tests/driver/` (pytest, torch) has no `__init__.py`: unittest does not descend into it.
    let output = run(Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-v"])
        .current_dir(python_dir()))
    .await
    .expect("python3 runs");
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn the_python_package_and_the_crates_are_one_version() {
    let init = std::fs::read_to_string(python_dir().join("trainyard/__init__.py"))
        .expect("trainyard/__init__.py is readable");
    let expected = format!("__version__ = \"{}\"", env!("CARGO_PKG_VERSION"));
    assert!(
        init.lines().any(|line| line == expected),
        "python/trainyard/__init__.py must say {expected}"
    );
}
