//! A lock that a process holds on a file for as long as it lives, and the one way to ask
//! which process holds it: a POSIX record lock (`fcntl(F_SETLK)`), which the kernel
//! releases when its holder exits however it exits, and whose holder's pid `F_GETLK` tells.
//!
//! The file is made through [`crate::private`] (0600, never through a link), in a folder of
//! this user's alone, so that only this user's processes can hold it: the holder of such a
//! lock is proven to be the process that took it. A process that opens and closes the same
//! file while it holds the lock releases it (POSIX's rule): [`holder`] is for other
//! processes.

use std::fs::File;
use std::io::{self, Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, fcntl};

/// A lock this process holds until dropped (or until it exits). Dropped, its file is removed
/// too (while it is still the file locked here).
#[derive(Debug)]
pub struct HeldLock {
    /// The open file the lock is on: closing it releases the lock.
    file: File,
    path: PathBuf,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt as _;
        let same =
            |a: &std::fs::Metadata, b: &std::fs::Metadata| (a.dev(), a.ino()) == (b.dev(), b.ino());
        if let (Ok(locked), Ok(there)) =
            (self.file.metadata(), std::fs::symlink_metadata(&self.path))
        {
            if same(&locked, &there) {
                // Removed before the lock goes with the file: a reader finds no file, or the
                // file still locked.
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl HeldLock {
    /// Takes the lock on the file at `path` (made, mode 0600, when missing; an existing one
    /// must be this user's regular file), and writes `content` into it for readers.
    ///
    /// # Errors
    /// [`io::ErrorKind::WouldBlock`] when another process holds it (the message names its
    /// pid), or why the file cannot be made or locked.
    pub fn take(path: &Path, content: &str) -> io::Result<Self> {
        // A holder that is letting go removes the file before it closes it: a lock taken on
        // the file it removed would be no lock at all. Taken again on the file now there.
        for _ in 0..RETAKES {
            let file = lock_file(path, content)?;
            if is_at(&file, path) {
                return Ok(Self {
                    file,
                    path: path.to_path_buf(),
                });
            }
            // Not the file at the path any more: closed (its lock with it), nothing removed.
        }
        Err(io::Error::other(format!(
            "{} kept being replaced while it was being locked",
            path.display()
        )))
    }

    /// The locked file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether `file` is the file at `path` still.
fn is_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(locked), Ok(there)) => (locked.dev(), locked.ino()) == (there.dev(), there.ino()),
        _ => false,
    }
}

/// The file at `path`, locked by this process, holding `content`.
fn lock_file(path: &Path, content: &str) -> io::Result<File> {
    let (mut file, _) = crate::private::append(path)?;
    let whole = whole_file(libc::F_WRLCK);
    if let Err(error) = fcntl(&file, FcntlArg::F_SETLK(&whole)) {
        if matches!(error, nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) {
            let by = holder(path)
                .ok()
                .flatten()
                .map(|(pid, _)| format!(" (pid {pid})"))
                .unwrap_or_default();
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is locked by another process{by}", path.display()),
            ));
        }
        return Err(error.into());
    }
    file.set_len(0)?;
    file.write_all(content.as_bytes())?;
    file.flush()?;
    Ok(file)
}

/// The process that holds the lock on the file at `path`, and what it wrote into the file;
/// `None` when no process holds it, or there is no such file. The file must be this user's
/// regular file (no link): another user's says nothing of this user's processes.
///
/// Never call it in the process that holds the lock: its open and close of the file would
/// release that lock.
///
/// # Errors
/// When the file is another user's or not a regular file, or cannot be read.
pub fn holder(path: &Path) -> io::Result<Option<(u32, String)>> {
    let mut file = match crate::private::open_regular(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    crate::private::check_file(path, &file)?;
    let mut probe = whole_file(libc::F_WRLCK);
    fcntl(&file, FcntlArg::F_GETLK(&mut probe))?;
    if i32::from(probe.l_type) == libc::F_UNLCK {
        return Ok(None);
    }
    // A lock held from another host (NFS) names no process of this one (0, or negative).
    let Some(pid) = u32::try_from(probe.l_pid).ok().filter(|pid| *pid > 0) else {
        return Ok(None);
    };
    let mut content = String::new();
    file.rewind()?;
    file.read_to_string(&mut content)?;
    Ok(Some((pid, content)))
}

/// How often [`HeldLock::take`] takes the lock again when the file was replaced meanwhile.
const RETAKES: usize = 3;

/// A lock of the whole file, of `kind` (`F_WRLCK`, ...).
fn whole_file(kind: libc::c_int) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    /// Set in the environment of this test binary run again to hold a lock: the file, then
    /// the child holds it until its stdin closes.
    const HOLD_ENV: &str = "TRAINYARD_LOCK_TEST_HOLD";

    #[test]
    fn hold_child() {
        let Some(path) = std::env::var_os(HOLD_ENV) else {
            return; // Run as a child of the tests below only.
        };
        let _held = HeldLock::take(Path::new(&path), "the child's").expect("taken");
        println!("held");
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    }

    fn hold_in_child(path: &Path) -> std::process::Child {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "lock::tests::hold_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLD_ENV, path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the child runs");
        let mut out = child.stdout.take().expect("piped");
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !String::from_utf8_lossy(&seen).contains("held") {
            assert_eq!(out.read(&mut byte).expect("read"), 1, "the child ended");
            seen.push(byte[0]);
        }
        child
    }

    #[test]
    fn the_holder_is_the_process_that_took_the_lock_until_it_ends() {
        let dir = crate::private::temp_dir("trainyard-lock-test-").expect("made");
        let path = dir.path().join("run.lock");
        assert!(holder(&path).expect("read").is_none(), "no file, no holder");

        let mut child = hold_in_child(&path);
        let (pid, content) = holder(&path).expect("read").expect("held");
        assert_eq!((pid, content.as_str()), (child.id(), "the child's"));
        let error = HeldLock::take(&path, "mine").expect_err("held by the child");
        assert_eq!(error.kind(), io::ErrorKind::WouldBlock);
        assert!(
            error.to_string().contains(&format!("pid {}", child.id())),
            "{error}"
        );

        // Its end releases it, however it ends.
        child.kill().expect("killed");
        child.wait().expect("reaped");
        assert!(holder(&path).expect("read").is_none());
        let held = HeldLock::take(&path, "mine").expect("free again");
        assert_eq!(held.path(), path);
        drop(held);
        assert!(!path.exists(), "its file goes with it");
    }

    #[test]
    fn a_link_in_the_locks_place_is_refused() {
        let dir = crate::private::temp_dir("trainyard-lock-test-").expect("made");
        let target = dir.path().join("target");
        crate::private::write(&target, b"x").expect("written");
        let link = dir.path().join("run.lock");
        std::os::unix::fs::symlink(&target, &link).expect("linked");
        assert!(HeldLock::take(&link, "mine").is_err());
        assert!(holder(&link).is_err());
    }
}
