//! The cgroup tree this module works on, and the steps that make, write and remove its
//! cgroups: the kernel's cgroupfs, or a fake one in the tests.

use std::fmt;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::CgroupError;

/// How many times the processes of a cgroup are SIGKILLed before giving up.
const KILL_ROUNDS: u32 = 100;
/// How many times `rmdir` is retried while the kernel still reports EBUSY.
const RMDIR_ROUNDS: u32 = 50;
/// Pause between two kill or rmdir rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(10);

/// What this module does to a cgroup tree. [`Cgroupfs`] is the kernel's; the tests use a
/// fake tree in a temporary directory that keeps the kernel's rules (v2's "no internal
/// processes" among them).
pub(super) trait Tree: fmt::Debug + Send + Sync {
    /// Reads a file.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// One `write` to an existing file: cgroupfs files must not be created or truncated.
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// Whether a file or directory exists.
    fn exists(&self, path: &Path) -> bool;
    /// Makes a cgroup.
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty cgroup.
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// The child cgroups of a cgroup.
    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// SIGKILLs a process listed in a cgroup (never this process).
    fn kill(&self, pid: u32);
}

/// The kernel's cgroup file systems.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cgroupfs;

impl Tree for Cgroupfs {
    fn read(&self, path: &Path) -> io::Result<String> {
        fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .write_all(value.as_bytes())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(path)
    }

    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        Ok(fs::read_dir(path)?
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .map(|entry| entry.path())
            .collect())
    }

    fn kill(&self, pid: u32) {
        if let Some(pid) = signalable_pid(pid) {
            // ESRCH: it exited meanwhile, which is what we want.
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
}

pub(super) fn create_dir(tree: &dyn Tree, path: &Path) -> Result<(), CgroupError> {
    tree.mkdir(path).map_err(|source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    })
}

pub(super) fn write_value(tree: &dyn Tree, path: &Path, value: &str) -> Result<(), CgroupError> {
    tree.write(path, value)
        .map_err(|source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_owned(),
            source,
        })
}

/// Kills everything in `dir` and its descendants, then removes them bottom-up.
/// Returns whether `dir` is gone. Blocks.
pub(super) fn remove_tree(tree: &dyn Tree, dir: &Path) -> bool {
    match tree.children(dir) {
        Ok(children) => {
            for child in children {
                remove_tree(tree, &child);
            }
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => return true,
        Err(err) => {
            tracing::warn!(path = %dir.display(), error = %err, "cannot list cgroup");
        }
    }
    kill_all(tree, dir);
    remove_dir(tree, dir)
}

/// SIGKILLs the processes of one cgroup until `cgroup.procs` is empty, for a
/// bounded number of rounds. Never signals this process. Blocks.
pub(super) fn kill_all(tree: &dyn Tree, dir: &Path) {
    let kill_file = dir.join("cgroup.kill");
    if tree.exists(&kill_file) {
        if let Err(err) = tree.write(&kill_file, "1") {
            tracing::warn!(path = %kill_file.display(), error = %err, "cgroup.kill failed");
        }
    }
    let procs = dir.join("cgroup.procs");
    let own = std::process::id();
    for _ in 0..KILL_ROUNDS {
        let pids = match tree.read(&procs) {
            Ok(text) => parse_procs(&text),
            Err(err) if err.kind() == io::ErrorKind::NotFound => return,
            Err(err) => {
                tracing::warn!(path = %procs.display(), error = %err, "cannot list cgroup processes");
                return;
            }
        };
        if pids.contains(&own) {
            tracing::warn!(path = %dir.display(), pid = own, "this process is in the cgroup; not killing it");
        }
        let targets: Vec<u32> = pids
            .into_iter()
            .filter(|&pid| pid != own && signalable_pid(pid).is_some())
            .collect();
        if targets.is_empty() {
            return;
        }
        for pid in targets {
            tree.kill(pid);
        }
        thread::sleep(ROUND_PAUSE);
    }
    tracing::warn!(path = %dir.display(), rounds = KILL_ROUNDS, "processes survived SIGKILL");
}

/// `rmdir` with a bounded retry while the kernel still reports EBUSY. Blocks.
fn remove_dir(tree: &dyn Tree, dir: &Path) -> bool {
    for _ in 0..RMDIR_ROUNDS {
        match tree.rmdir(dir) {
            Ok(()) => return true,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return true,
            Err(err) if err.raw_os_error() == Some(Errno::EBUSY as i32) => {
                thread::sleep(ROUND_PAUSE);
            }
            Err(err) => {
                tracing::warn!(path = %dir.display(), error = %err, "cannot remove cgroup");
                return false;
            }
        }
    }
    tracing::warn!(path = %dir.display(), "cgroup stayed busy");
    false
}

/// A pid that can be signalled on its own: positive and within `i32`, so
/// never 0 or negative (which would address process groups).
pub(super) fn signalable_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid)
        .ok()
        .filter(|&raw| raw > 0)
        .map(Pid::from_raw)
}

/// The pids of `cgroup.procs`, skipping malformed lines.
pub(super) fn parse_procs(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procs_lists_keep_only_pids() {
        let cases: &[(&str, Vec<u32>)] = &[
            ("", vec![]),
            ("12\n345\n", vec![12, 345]),
            ("12\n\nabc\n-4\n 7 \n4294967296\n", vec![12, 7]),
        ];
        for (text, expected) in cases {
            assert_eq!(&parse_procs(text), expected, "input {text:?}");
        }
    }
    #[test]
    fn only_positive_pids_within_i32_are_ever_signalled() {
        assert_eq!(signalable_pid(0), None);
        assert_eq!(signalable_pid(u32::MAX), None);
        assert_eq!(signalable_pid(1 << 31), None);
        assert_eq!(signalable_pid(42), Some(Pid::from_raw(42)));
    }
}
