//! The ledger's locks (`flock(2)` on files beside it), taken with a bounded wait, and who
//! holds them, as `/proc/locks` tells.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::{LOCK_TIMEOUT, LedgerError};

/// Pause between tries for a lock.
const LOCK_RETRY: Duration = Duration::from_millis(2);

/// A file as `/proc/locks` names it: device major and minor number, and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    major: u64,
    minor: u64,
    inode: u64,
}

impl FileId {
    /// The file `file` is open on.
    pub(crate) fn of(file: &File) -> io::Result<Self> {
        Ok(Self::of_metadata(&file.metadata()?))
    }

    /// The file `meta` describes.
    pub(crate) fn of_metadata(meta: &Metadata) -> Self {
        let dev = meta.dev();
        // The kernel's `dev_t` as glibc encodes it (`gnu_dev_major`, `gnu_dev_minor`).
        Self {
            major: ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff),
            minor: ((dev >> 12) & 0xffff_ff00) | (dev & 0x00ff),
            inode: meta.ino(),
        }
    }
}

/// A process that holds a lock on a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockHolder {
    /// Its process id.
    pub pid: u32,
    /// Its real user id, when `/proc/<pid>/status` can be read.
    pub uid: Option<u32>,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.pid)?;
        if let Some(uid) = self.uid {
            write!(f, " (uid {uid})")?;
        }
        Ok(())
    }
}

/// One granted `flock` lock of `/proc/locks`: `<n>: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<inode> 0 EOF`.
/// Waiters (`<n>: -> FLOCK ...`), other kinds of lock and lines that do not parse are `None`.
fn parse_flock(line: &str) -> Option<(bool, u32, FileId)> {
    let mut fields = line.split_whitespace().skip(1);
    if fields.next()? != "FLOCK" {
        return None;
    }
    let exclusive = match fields.nth(1)? {
        "WRITE" => true,
        "READ" => false,
        _ => return None,
    };
    let pid = fields.next()?.parse().ok()?;
    let mut file = fields.next()?.split(':');
    let major = u64::from_str_radix(file.next()?, 16).ok()?;
    let minor = u64::from_str_radix(file.next()?, 16).ok()?;
    let inode = file.next()?.parse().ok()?;
    Some((
        exclusive,
        pid,
        FileId {
            major,
            minor,
            inode,
        },
    ))
}

/// The processes that hold a `flock` on `file` (exclusively, or at all).
fn holders_in(locks: &str, file: FileId, exclusive_only: bool) -> BTreeSet<u32> {
    locks
        .lines()
        .filter_map(parse_flock)
        .filter(|&(exclusive, pid, id)| id == file && pid > 0 && (exclusive || !exclusive_only))
        .map(|(_, pid, _)| pid)
        .collect()
}

/// The processes that hold a `flock` on `file` now, from `/proc/locks`.
///
/// # Errors
/// When `/proc/locks` cannot be read.
pub(crate) fn holders(file: FileId) -> io::Result<BTreeSet<u32>> {
    let locks = std::fs::read_to_string("/proc/locks")?;
    Ok(holders_in(&locks, file, false))
}

/// Who holds `file` exclusively, as far as `/proc/locks` tells.
fn exclusive_holder(file: &File) -> Option<LockHolder> {
    let id = FileId::of(file).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = holders_in(&locks, id, true).into_iter().next()?;
    let uid = super::owner::real_uid(pid).ok().flatten();
    Some(LockHolder { pid, uid })
}

/// Locks `file` (the lock file `path`), exclusively or shared, trying for up to
/// [`LOCK_TIMEOUT`]; the lock lasts as long as the returned value. `ledger` is the ledger
/// the error names.
pub(crate) fn acquire(
    file: File,
    exclusive: bool,
    path: &Path,
    ledger: &Path,
) -> Result<Flock<File>, LedgerError> {
    let how = if exclusive {
        FlockArg::LockExclusiveNonblock
    } else {
        FlockArg::LockSharedNonblock
    };
    let started = Instant::now();
    let mut file = file;
    loop {
        match Flock::lock(file, how) {
            Ok(lock) => return Ok(lock),
            Err((back, Errno::EWOULDBLOCK | Errno::EINTR)) => file = back,
            Err((_, errno)) => {
                return Err(LedgerError::Io {
                    path: path.to_owned(),
                    source: io::Error::from(errno),
                });
            }
        }
        if started.elapsed() > LOCK_TIMEOUT {
            return Err(LedgerError::Busy {
                path: ledger.to_owned(),
                lock: path.to_owned(),
                waited: started.elapsed(),
                holder: exclusive_holder(&file),
            });
        }
        std::thread::sleep(LOCK_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKS: &str = "\
1: FLOCK  ADVISORY  WRITE 7301 fe:00:5333057 0 EOF
1: -> FLOCK  ADVISORY  WRITE 7400 fe:00:5333057 0 EOF
2: POSIX  ADVISORY  WRITE 7330 fe:00:5333057 0 EOF
3: FLOCK  ADVISORY  READ 2014 fe:00:10133507 0 EOF
4: FLOCK  ADVISORY  READ 2015 fe:00:10133507 0 EOF
5: OFDLCK ADVISORY  READ -1 fe:00:10133507 0 EOF
";

    #[test]
    fn the_holders_are_the_granted_flocks_on_that_file_and_not_the_waiters() {
        let ledger = FileId {
            major: 0xfe,
            minor: 0,
            inode: 5_333_057,
        };
        assert_eq!(holders_in(LOCKS, ledger, false), BTreeSet::from([7301]));
        let live = FileId {
            inode: 10_133_507,
            ..ledger
        };
        assert_eq!(holders_in(LOCKS, live, false), BTreeSet::from([2014, 2015]));
        assert!(holders_in(LOCKS, live, true).is_empty(), "none exclusive");
    }

    #[test]
    fn a_file_is_named_as_proc_locks_names_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("lock");
        let file = File::create(&path).expect("file");
        let id = FileId::of(&file).expect("stat");
        let lock = acquire(file, true, &path, &path).expect("free");
        let held = holders(id).expect("/proc/locks");
        assert_eq!(held, BTreeSet::from([std::process::id()]));
        drop(lock);
        assert!(holders(id).expect("/proc/locks").is_empty());
    }
}
