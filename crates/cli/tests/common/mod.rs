//! What the CLI's end-to-end tests share: every run carries a marker in its workers'
//! environment, and these helpers find the processes that still carry it. The soak's driver
//! (`xtask/src/soak/driver.rs`) marks its runs with them too.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The variable that marks a test's processes.
pub(crate) const MARKER: &str = "TRAINYARD_TEST_MARKER";

/// Live (not zombie) processes whose environment holds `MARKER=mark`.
pub(crate) fn marked(mark: &str) -> Vec<u32> {
    let needle = format!("{MARKER}={mark}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
                && !is_zombie(*pid)
        })
        .collect()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

/// Waits up to `limit` for every marked process to be gone; the ones left, if any.
pub(crate) fn left_behind(mark: &str, limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left = marked(mark);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The events of a `--log-format json` run's stdout, one per line.
pub(crate) fn json_events(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON event per line"))
        .collect()
}

/// The `step` of each report of `rank`, in the order they arrived.
pub(crate) fn report_steps(events: &[serde_json::Value], rank: u64) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["event"] == "report" && e["rank"] == rank)
        .filter_map(|e| e["metrics"]["step"].as_u64())
        .collect()
}

/// The workspace's root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's python, or `None` (after saying why) when torch cannot be installed here.
pub(crate) fn torch_python() -> Option<PathBuf> {
    if let Ok(python) = std::env::var("TRAINYARD_TORCH_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/python-env.sh"))
        .stdin(Stdio::null())
        .output()
        .expect("bash runs scripts/python-env.sh");
    match out.status.code() {
        Some(0) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .map(|line| PathBuf::from(line.trim())),
        Some(3) => {
            eprintln!(
                "SKIP: the torch tests cannot run: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        _ => panic!(
            "scripts/python-env.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
