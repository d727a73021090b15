//! The agent's private directory: a fresh `0700` folder under the temporary directory, made
//! on the first task and deleted when the agent exits (by the watchdog when the agent is
//! killed). It holds the Python files the agent carries (`python/`, put on the tasks'
//! `PYTHONPATH`) only where the directory all agents share cannot be used
//! ([`crate::python::shared`]), `scratch/`, where remote checkpoints are downloaded for a task, and
//! `errors/`, where tasks that ask for one get their error file
//! ([`ERROR_FILE_VAR`](trainyard_runtime::root_cause::ERROR_FILE_VAR)).

use std::path::PathBuf;

use crate::watchdog::Watchdog;

/// What the directory's name starts with; the agent's pid and a random part follow.
const PREFIX: &str = "trainyard-agent-";

/// How old a directory of the name without a pid (made by an earlier version) must be before
/// it is swept when empty.
const UNNAMED_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// The agent's private directory; deleted when dropped.
#[derive(Debug)]
pub(crate) struct WorkDir {
    root: trainyard_sys::private::TempDir,
    /// Where the carried Python files are.
    python: PathBuf,
}

impl WorkDir {
    /// Makes the directory (readable by this user only) and finds the carried Python files,
    /// written into it when the shared directory cannot be used; the agent's `watchdog`
    /// deletes it should the agent be killed.
    ///
    /// # Errors
    /// When the directory or a file cannot be written.
    pub(crate) fn create(watchdog: &Watchdog) -> std::io::Result<Self> {
        // A read of the whole temporary directory, which a node may fill with thousands of
        // entries: not on the way to the task's start. Nothing waits for it.
        let tmp = std::env::temp_dir();
        if std::thread::Builder::new()
            .name("trainyard-tmp-sweep".into())
            .spawn(move || sweep_left_behind(&tmp))
            .is_err()
        {
            sweep_left_behind(&std::env::temp_dir());
        }
        // The tasks' files depend on it being this user's alone (0700).
        let root = trainyard_sys::private::temp_dir(&format!("{PREFIX}{}-", std::process::id()))?;
        watchdog.remove_at_end(root.path());
        let python = match crate::python::shared() {
            Ok(shared) => shared,
            Err(error) => {
                tracing::debug!(%error, "the carried Python files go into the agent's directory");
                let own = root.path().join("python");
                crate::python::write(&own)?;
                own
            }
        };
        Ok(Self { root, python })
    }

    /// The directory to put on `PYTHONPATH`.
    pub(crate) fn python(&self) -> &std::path::Path {
        &self.python
    }

    /// An empty folder for the downloads of the task about to start: what an earlier task
    /// downloaded is deleted (that task has ended).
    ///
    /// # Errors
    /// When the folder cannot be emptied or made.
    pub(crate) fn fresh_scratch(&self) -> std::io::Result<PathBuf> {
        let scratch = self.root.path().join("scratch");
        match std::fs::remove_dir_all(&scratch) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        std::fs::create_dir(&scratch)?;
        Ok(scratch)
    }

    /// Where task number `task` writes its error file (`errors/task-<task>.json`): the folder
    /// made, and a file already there removed.
    ///
    /// # Errors
    /// When the folder cannot be made or the stale file cannot be removed.
    pub(crate) fn error_file(&self, task: u64) -> std::io::Result<PathBuf> {
        let errors = self.root.path().join("errors");
        std::fs::create_dir_all(&errors)?;
        let file = errors.join(format!("task-{task}.json"));
        match std::fs::remove_file(&file) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(file),
        }
    }

    /// The directory itself.
    #[cfg(test)]
    pub(crate) fn root(&self) -> &std::path::Path {
        self.root.path()
    }
}

/// Removes the directories in `tmp` that agents of this user's left when they were killed
/// with their watchdog: those named after an agent that no longer runs, and empty ones of an
/// earlier version's (no pid in the name) not changed for [`UNNAMED_AGE`]. A directory of a
/// live agent, or of another user's, is never touched.
fn sweep_left_behind(tmp: &std::path::Path) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let own = trainyard_sys::private::euid();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|name| name.strip_prefix(PREFIX)) else {
            continue;
        };
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != own {
            continue;
        }
        match rest
            .split_once('-')
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        {
            Some(pid) if !trainyard_sys::procfs::is_alive(pid, None) => {
                let _ = std::fs::remove_dir_all(&path);
            }
            Some(_) => {}
            None => {
                let old = meta
                    .modified()
                    .ok()
                    .and_then(|at| at.elapsed().ok())
                    .is_some_and(|age| age > UNNAMED_AGE);
                if old {
                    // Only when empty: removing a folder with anything in it fails.
                    let _ = std::fs::remove_dir(&path);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_directory_is_private_finds_the_package_and_is_gone_when_dropped() {
        let dir = WorkDir::create(&Watchdog::default()).expect("created");
        let root = dir.root().to_owned();
        let mode = std::fs::metadata(&root)
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(dir.python().join("trainyard/train/__init__.py").is_file());
        assert!(dir.python().join("trainyard_report.py").is_file());
        drop(dir);
        assert!(!root.exists(), "{} is left behind", root.display());
    }

    #[test]
    fn each_task_gets_an_empty_scratch_folder() {
        let dir = WorkDir::create(&Watchdog::default()).expect("created");
        let scratch = dir.fresh_scratch().expect("made");
        std::fs::write(scratch.join("old"), b"an earlier task's download").expect("written");
        let again = dir.fresh_scratch().expect("made again");
        assert_eq!(again, scratch);
        assert_eq!(std::fs::read_dir(&again).expect("readable").count(), 0);
    }

    #[test]
    fn folders_of_agents_that_are_gone_are_swept_and_those_of_live_ones_kept() {
        let tmp = trainyard_sys::private::temp_dir("trainyard-sweep-test-").expect("made");
        // A pid that is no process: past the kernel's largest.
        let gone = tmp.path().join(format!("{PREFIX}4194305-abc"));
        let live = tmp
            .path()
            .join(format!("{PREFIX}{}-def", std::process::id()));
        let unnamed_fresh = tmp.path().join(format!("{PREFIX}ghi"));
        for dir in [&gone, &live, &unnamed_fresh] {
            std::fs::create_dir(dir).expect("made");
        }
        std::fs::write(gone.join("left"), b"a download").expect("written");
        sweep_left_behind(tmp.path());
        assert!(
            !gone.exists(),
            "a gone agent's folder is swept, with what it holds"
        );
        assert!(live.exists(), "a live agent's folder is kept");
        assert!(
            unnamed_fresh.exists(),
            "an unnamed folder is kept until it is old"
        );
    }
}
