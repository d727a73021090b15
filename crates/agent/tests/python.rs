//! The Python package in `python/`: its own tests pass, and `pip install ./python` works
//! with no package registry (its build backend is in the directory, standard library only).
//!
//! Without `python3`, or without `venv`/`pip` for it, a test says `SKIP:` and passes; under
//! `CI=true` it fails instead, as CI has them.

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
    let output = run(Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests", "-v"])
        .current_dir(python_dir()))
    .await
    .expect("python3 runs");
    assert!(output.status.success(), "{}", text(&output));
}

#[tokio::test]
async fn pip_installs_the_python_package_without_a_registry() {
    if !python3().await {
        return;
    }
    let scratch = tempfile::tempdir().expect("a temp dir");
    let venv = scratch.path().join("venv");
    let made = run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
        .await
        .expect("python3 runs");
    if !made.status.success() {
        cannot_run(&format!(
            "python3 cannot make a virtual environment with pip here: {}",
            text(&made)
        ));
        return;
    }
    let python = venv.join("bin/python");
    let installed = run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-cache-dir",
            "--disable-pip-version-check",
        ])
        .arg(python_dir())
        .current_dir(scratch.path()))
    .await
    .expect("pip runs");
    assert!(installed.status.success(), "{}", text(&installed));
    let script = "import os, trainyard, trainyard_report\n\
                  from trainyard import train\n\
                  assert train.get_context().get_world_size() == 1\n\
                  print(os.path.dirname(os.path.dirname(trainyard.__file__)))\n\
                  print(os.path.dirname(trainyard_report.__file__))\n\
                  print(trainyard.__version__)\n";
    let imported = run(Command::new(&python)
        .args(["-c", script])
        .current_dir(scratch.path()))
    .await
    .expect("the venv's python runs");
    assert!(imported.status.success(), "{}", text(&imported));
    let stdout = String::from_utf8_lossy(&imported.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", text(&imported));
    assert!(
        lines[0].ends_with("site-packages") && lines[1] == lines[0],
        "both are installed into the venv: {lines:?}"
    );
    assert_eq!(lines[2], "0.1.0");
}
