//! The Python step of `cargo xtask ci` (alone: `cargo xtask python`): builds the wheel as a
//! user does (`pip wheel .`), installs it into a fresh virtual environment and runs the pytest
//! suite of `python/tests/driver` there, from a folder outside the repository, with no Rust
//! toolchain on `PATH` and no `TRAINYARD_*` variable pointing anywhere.
//!
//! The fresh environment reaches the project's torch through a `.pth` file naming the site
//! packages of the torch venv (`TRAINYARD_TORCH_PYTHON`, else `scripts/python-env.sh`): the
//! wheel, cloudpickle and pytest are installed into it, torch (4 GB) is not installed twice.
//! Without torch the step says `SKIP:`; under `CI=true` only when `TRAINYARD_TORCH_SKIP`
//! says why (`trainyard_test_support::processes::torch_python`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The most the wheel may weigh.
const MAX_WHEEL_BYTES: u64 = 15 * 1000 * 1000;

/// pytest's exit code when it collected no test: an error here, never a pass.
const PYTEST_NO_TESTS: i32 = 5;

/// Runs `command`, saying what it runs; an error naming it when it fails.
pub(crate) fn run(command: &mut Command) -> Result<(), String> {
    eprintln!("$ {command:?}");
    let status = command
        .status()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed ({status})"))
    }
}

/// What `python -c code` prints, trimmed.
fn python_says(python: &Path, code: &str) -> Result<String, String> {
    let out = Command::new(python)
        .args(["-c", code])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} -c {code:?} failed: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `PATH` without the folders that hold a Rust toolchain (`cargo`, `rustc`, `rustup`).
fn path_without_rust() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|dir| {
            !["cargo", "rustc", "rustup"]
                .iter()
                .any(|tool| dir.join(tool).exists())
        })
        .collect();
    std::env::join_paths(kept)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Builds the wheel into `dist` with `python`'s pip, as `pip wheel . -w dist` does; its path.
pub(crate) fn build_wheel(python: &Path, root: &Path, dist: &Path) -> Result<PathBuf, String> {
    let started = Instant::now();
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--disable-pip-version-check",
            "-w",
        ])
        .arg(dist)
        .arg(root))?;
    let wheel = std::fs::read_dir(dist)
        .map_err(|e| format!("cannot read {}: {e}", dist.display()))?
        .flatten()
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| format!("pip wheel left no wheel in {}", dist.display()))?;
    let bytes = std::fs::metadata(&wheel)
        .map_err(|e| format!("cannot read {}: {e}", wheel.display()))?
        .len();
    eprintln!(
        "the wheel: {} ({:.1} MB), built in {:.0} s",
        wheel.display(),
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    if bytes > MAX_WHEEL_BYTES {
        return Err(format!(
            "the wheel weighs {bytes} bytes, more than {MAX_WHEEL_BYTES}: {}",
            wheel.display()
        ));
    }
    Ok(wheel)
}

/// A fresh virtual environment in `venv` with `wheel` (and its dependencies) and pytest
/// installed, reaching the torch venv of `torch_python` through a `.pth` file; its python.
pub(crate) fn fresh_venv(
    torch_python: &Path,
    venv: &Path,
    wheel: &Path,
) -> Result<PathBuf, String> {
    run(Command::new(torch_python).args(["-m", "venv"]).arg(venv))?;
    let python = venv.join("bin/python");
    let purelib = "import sysconfig; print(sysconfig.get_path('purelib'))";
    let ours = PathBuf::from(python_says(&python, purelib)?);
    let torch = python_says(torch_python, purelib)?;
    std::fs::write(ours.join("_trainyard_torch.pth"), format!("{torch}\n"))
        .map_err(|e| format!("cannot write the .pth file in {}: {e}", ours.display()))?;
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "-q"])
        .arg(wheel)
        .arg("pytest"))?;
    Ok(python)
}

/// Runs the suite with `python` from `cwd`, with no Rust toolchain on `PATH`.
fn pytest(python: &Path, root: &Path, cwd: &Path) -> Result<(), String> {
    let bin = python.parent().unwrap_or(Path::new("."));
    let path = format!("{}:{}", bin.display(), path_without_rust());
    let mut command = Command::new(python);
    command
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"])
        .arg(root.join("python/tests/driver"))
        .current_dir(cwd)
        .env("PATH", path)
        .env("TRAINYARD_TEST_FROM_WHEEL", "1");
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let toolchain = name.starts_with("CARGO") || name.starts_with("RUST");
        // What CI says about a cluster or a library it could not set up goes through (see
        // test_runtimes.py, test_integrations.py).
        let ours = name.starts_with("TRAINYARD_")
            && !matches!(
                name.as_ref(),
                "TRAINYARD_TEST_FROM_WHEEL"
                    | "TRAINYARD_SLURM_SKIP"
                    | "TRAINYARD_RAY_SKIP"
                    | "TRAINYARD_INTEGRATIONS_SKIP"
            );
        if toolchain || ours || name == "PYTHONPATH" || name == "VIRTUAL_ENV" {
            command.env_remove(name.as_ref());
        }
    }
    eprintln!("$ {command:?} (no Rust toolchain on PATH)");
    let status = command
        .status()
        .map_err(|e| format!("cannot run pytest: {e}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(PYTEST_NO_TESTS) => Err("pytest collected no tests in python/tests/driver".to_owned()),
        _ => Err(format!("the Python tests failed ({status})")),
    }
}

/// The Python step; `Ok` with a `SKIP:` line when torch cannot be had (see the module).
pub(crate) fn run_suite() -> Result<(), String> {
    let Some(torch_python) = trainyard_test_support::processes::torch_python() else {
        return Ok(());
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root
        .canonicalize()
        .map_err(|e| format!("cannot find the workspace at {}: {e}", root.display()))?;
    let scratch = crate::target_dir().join("python-ci");
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .map_err(|e| format!("cannot clear {}: {e}", scratch.display()))?;
    }
    let cwd = scratch.join("elsewhere");
    std::fs::create_dir_all(&cwd).map_err(|e| format!("cannot create {}: {e}", cwd.display()))?;
    let wheel = build_wheel(&torch_python, &root, &scratch.join("dist"))?;
    let python = fresh_venv(&torch_python, &scratch.join("venv"), &wheel)?;
    pytest(&python, &root, &cwd)
}
