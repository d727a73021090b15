//! A cgroup v2 tree for the tests: this machine's v2 hierarchy may have no memory
//! controller.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;

use super::setup::lists_controller;
use super::tree::{Cgroupfs, Tree, parse_procs};

/// A cgroup v2 tree in a temporary directory that keeps the kernel's rules this module
/// relies on: `mkdir` makes a cgroup's files (its controllers are those its parent
/// enables for its children), a controller is enabled for the children only of a cgroup
/// that holds no process (the root excepted) and moved into only one whose children use
/// no controller, writing a pid to `cgroup.procs` moves it, a cgroup with processes or
/// children cannot be removed, and a kill takes a process out of the tree.
#[derive(Debug)]
pub(super) struct FakeV2 {
    root: tempfile::TempDir,
    pub(super) killed: std::sync::Mutex<Vec<u32>>,
}

impl FakeV2 {
    /// A root whose cgroups may use `cpu`, `io`, `memory` and `pids`.
    pub(super) fn new() -> Self {
        let root = tempfile::tempdir().expect("a temporary directory");
        for (file, text) in [
            ("cgroup.controllers", "cpu io memory pids\n"),
            ("cgroup.subtree_control", ""),
            ("cgroup.procs", ""),
        ] {
            fs::write(root.path().join(file), text).expect("write the root's files");
        }
        Self {
            root,
            killed: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub(super) fn root(&self) -> &Path {
        self.root.path()
    }

    /// The pids in `dir`.
    pub(super) fn procs(&self, dir: &Path) -> Vec<u32> {
        parse_procs(&fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default())
    }

    /// Puts `pid` in `dir`, wherever it was.
    pub(super) fn place(&self, dir: &Path, pid: u32) {
        self.take_out(self.root(), pid);
        let mut pids = self.procs(dir);
        pids.push(pid);
        write_pids(dir, &pids);
    }

    /// Takes `pid` out of `dir` and every cgroup below it.
    fn take_out(&self, dir: &Path, pid: u32) {
        let pids = self.procs(dir);
        if pids.contains(&pid) {
            write_pids(
                dir,
                &pids.into_iter().filter(|&p| p != pid).collect::<Vec<_>>(),
            );
        }
        for child in self.children(dir).unwrap_or_default() {
            self.take_out(&child, pid);
        }
    }

    fn busy() -> io::Error {
        io::Error::from_raw_os_error(Errno::EBUSY as i32)
    }
}

pub(super) fn write_pids(dir: &Path, pids: &[u32]) {
    let text: String = pids.iter().map(|pid| format!("{pid}\n")).collect();
    fs::write(dir.join("cgroup.procs"), text).expect("write cgroup.procs");
}

impl Tree for FakeV2 {
    fn read(&self, path: &Path) -> io::Result<String> {
        fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        if !path.is_file() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        let dir = path.parent().unwrap_or(self.root());
        let is_root = dir == self.root();
        match path.file_name().and_then(|n| n.to_str()) {
            Some("cgroup.subtree_control") => {
                let available = fs::read_to_string(dir.join("cgroup.controllers"))?;
                let mut enabled = fs::read_to_string(path)?;
                for token in value.split_whitespace() {
                    let controller = token.trim_start_matches('+');
                    if !lists_controller(&available, controller) {
                        return Err(io::Error::from_raw_os_error(Errno::ENOENT as i32));
                    }
                    if !is_root && !self.procs(dir).is_empty() {
                        return Err(Self::busy());
                    }
                    if !lists_controller(&enabled, controller) {
                        enabled = format!("{} {controller}", enabled.trim()).trim().to_owned();
                    }
                }
                fs::write(path, format!("{enabled}\n"))
            }
            Some("cgroup.procs") => {
                let pid: u32 = value
                    .trim()
                    .parse()
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
                let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))?;
                if !is_root && !enabled.trim().is_empty() {
                    return Err(Self::busy());
                }
                self.place(dir, pid);
                Ok(())
            }
            Some("cgroup.kill") => {
                for pid in self.procs(dir) {
                    self.kill(pid);
                }
                Ok(())
            }
            _ => fs::write(path, value),
        }
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)?;
        let parent = path.parent().unwrap_or(self.root());
        let controllers = fs::read_to_string(parent.join("cgroup.subtree_control"))?;
        let mut files = vec![
            ("cgroup.controllers", controllers.clone()),
            ("cgroup.subtree_control", String::new()),
            ("cgroup.procs", String::new()),
            ("cgroup.kill", String::new()),
        ];
        if lists_controller(&controllers, "memory") {
            files.extend([
                ("memory.max", "max\n".to_owned()),
                ("memory.swap.max", "max\n".to_owned()),
                ("memory.oom.group", "0\n".to_owned()),
                ("memory.events", "oom 0\noom_kill 0\n".to_owned()),
            ]);
        }
        for (file, text) in files {
            fs::write(path.join(file), text)?;
        }
        Ok(())
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        if !path.is_dir() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        if !self.procs(path).is_empty() || !self.children(path)?.is_empty() {
            return Err(Self::busy());
        }
        fs::remove_dir_all(path)
    }

    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        Cgroupfs.children(path)
    }

    fn kill(&self, pid: u32) {
        self.take_out(self.root(), pid);
        self.killed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(pid);
    }
}

/// A pid no process of this machine has (above any `pid_max`), standing for another
/// process in the fake tree.
pub(super) const SOMEONE_ELSE: u32 = 1 << 30;

/// A fake host: the driver (this process) in `job`, a v2 cgroup with the memory
/// controller delegated to it, alone or with `others`.
pub(super) fn fake_host(others: &[u32]) -> (Arc<FakeV2>, PathBuf) {
    let tree = Arc::new(FakeV2::new());
    tree.write(&tree.root().join("cgroup.subtree_control"), "+memory")
        .expect("the root enables memory");
    let job = tree.root().join("job");
    tree.mkdir(&job).expect("mkdir job");
    tree.place(&job, std::process::id());
    for &other in others {
        tree.place(&job, other);
    }
    (tree, job)
}
