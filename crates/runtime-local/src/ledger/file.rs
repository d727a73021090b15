//! The ledger's files: opened without following links (nor hanging on a FIFO), read with a
//! bound, moved aside when they cannot be read, and replaced whole through a temporary
//! file that only this process can have made.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use serde::Deserialize;

use super::directory::own_uid;
use super::{Contents, FORMAT_VERSION, LedgerError};

/// The largest ledger read: far above what the runs of one machine hold.
const MAX_SIZE: u64 = 16 << 20;

/// Flags for every open: a link in the ledger's place is not followed, and a FIFO in its
/// place does not hang the open.
fn flags() -> i32 {
    (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits()
}

/// Whether `error` is the refusal of a link by `O_NOFOLLOW`.
fn is_link(error: &io::Error) -> bool {
    error.raw_os_error() == Some(Errno::ELOOP as i32)
}

/// Opens (making it with `mode` when missing) the lock file `path`, for writing when this
/// user may, else for reading: either serves `flock`.
pub(crate) fn open_lock(path: &Path, mode: u32) -> Result<File, LedgerError> {
    let io_error = |source: io::Error| LedgerError::Io {
        path: path.to_owned(),
        source: if is_link(&source) {
            io::Error::new(io::ErrorKind::InvalidInput, "a symbolic link")
        } else {
            source
        },
    };
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .custom_flags(flags())
        .open(path);
    let file = match opened {
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => OpenOptions::new()
            .read(true)
            .custom_flags(flags())
            .open(path)
            .map_err(io_error)?,
        other => other.map_err(io_error)?,
    };
    let meta = file.metadata().map_err(io_error)?;
    if !meta.is_file() {
        return Err(io_error(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    if own_uid() == Some(meta.uid()) && meta.mode() & 0o777 != mode {
        // The umask may have taken the group's bits from a file made here.
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(io_error)?;
    }
    Ok(file)
}

/// What a ledger file holds, as far as it can be read.
enum Loaded {
    /// Nothing: no file, or an empty one.
    Nothing,
    /// The runs, in this version's format (format 2 read as this one).
    Contents(Contents),
    /// A file that is no ledger: what is wrong with it.
    Corrupt(String),
    /// A ledger of a newer format.
    Newer(u32),
    /// A ledger of format 1 whose owners still run: their pids.
    OlderInUse(Vec<u32>),
}

/// Just the version, of any format.
#[derive(Deserialize)]
struct Header {
    version: u32,
}

/// Format 1, as far as needed to tell whether its runs still run.
#[derive(Deserialize)]
struct Version1 {
    runs: Vec<Version1Run>,
}

#[derive(Deserialize)]
struct Version1Run {
    owner: Version1Owner,
}

#[derive(Deserialize)]
struct Version1Owner {
    pid: u32,
    start_time: u64,
}

fn load(path: &Path) -> io::Result<Loaded> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(flags())
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Nothing),
        Err(error) if is_link(&error) => {
            return Ok(Loaded::Corrupt("a symbolic link".to_owned()));
        }
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            return Ok(Loaded::Corrupt(format!("not readable: {error}")));
        }
        Err(error) => return Err(error),
    };
    if !file.metadata()?.is_file() {
        return Ok(Loaded::Corrupt("not a regular file".to_owned()));
    }
    let mut text = Vec::new();
    file.take(MAX_SIZE + 1).read_to_end(&mut text)?;
    if text.len() as u64 > MAX_SIZE {
        return Ok(Loaded::Corrupt(format!("larger than {MAX_SIZE} bytes")));
    }
    if text.iter().all(u8::is_ascii_whitespace) {
        return Ok(Loaded::Nothing);
    }
    let version = match serde_json::from_slice::<Header>(&text) {
        Ok(header) => header.version,
        Err(error) => return Ok(Loaded::Corrupt(error.to_string())),
    };
    Ok(match version {
        // Format 2 is format 3 without members.
        2 | FORMAT_VERSION => match serde_json::from_slice::<Contents>(&text) {
            Ok(contents) => Loaded::Contents(Contents {
                version: FORMAT_VERSION,
                ..contents
            }),
            Err(error) => Loaded::Corrupt(error.to_string()),
        },
        1 => match serde_json::from_slice::<Version1>(&text) {
            Ok(old) => {
                let live: Vec<u32> = old
                    .runs
                    .iter()
                    .filter(|run| {
                        trainyard_sys::procfs::is_alive(run.owner.pid, Some(run.owner.start_time))
                    })
                    .map(|run| run.owner.pid)
                    .collect();
                if live.is_empty() {
                    Loaded::Nothing
                } else {
                    Loaded::OlderInUse(live)
                }
            }
            Err(error) => Loaded::Corrupt(error.to_string()),
        },
        newer if newer > FORMAT_VERSION => Loaded::Newer(newer),
        unknown => Loaded::Corrupt(format!("unknown version {unknown}")),
    })
}

/// The ledger at `path`: empty when there is none, or when it is not a ledger (it is moved
/// aside to `<ledger>.corrupt-<unix time>`, with a warning), or when it is of format 1 and
/// none of its runs still runs.
///
/// # Errors
/// [`LedgerError::NewerFormat`], [`LedgerError::OlderFormatInUse`], or
/// [`LedgerError::Io`].
pub(crate) fn read(path: &Path) -> Result<Contents, LedgerError> {
    let io_error = |source| LedgerError::Io {
        path: path.to_owned(),
        source,
    };
    match load(path).map_err(io_error)? {
        Loaded::Nothing => Ok(Contents::empty()),
        Loaded::Contents(contents) => Ok(contents),
        Loaded::Newer(found) => Err(LedgerError::NewerFormat {
            path: path.to_owned(),
            found,
        }),
        Loaded::OlderInUse(pids) => Err(LedgerError::OlderFormatInUse {
            path: path.to_owned(),
            pids,
        }),
        Loaded::Corrupt(problem) => {
            let aside = move_aside(path).map_err(io_error)?;
            tracing::warn!(
                ledger = %path.display(),
                moved_to = %aside.display(),
                problem,
                "the ledger is no ledger: moved aside, a fresh one starts"
            );
            Ok(Contents::empty())
        }
    }
}

/// Renames `path` to a free `<path>.corrupt-<unix time>[-<n>]`; the new name.
fn move_aside(path: &Path) -> io::Result<PathBuf> {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut base = path.as_os_str().to_owned();
    base.push(format!(".corrupt-{seconds}"));
    let mut aside = PathBuf::from(&base);
    let mut n = 0;
    while fs::symlink_metadata(&aside).is_ok() {
        n += 1;
        let mut next = base.clone();
        next.push(format!("-{n}"));
        aside = PathBuf::from(next);
    }
    fs::rename(path, &aside)?;
    Ok(aside)
}

/// Writes `contents` to a new file of mode `mode` beside `path` (made exclusively, under a
/// random name) and renames it over `path`. Not synced to disk: the ledger tells of live
/// processes, which a crash of the machine ends all the same, and a file a crash left
/// garbled reads as an empty ledger ([`read`] moves it aside).
pub(crate) fn write(path: &Path, contents: &Contents, mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".");
    let text = serde_json::to_vec_pretty(contents).map_err(io::Error::other)?;
    let mut temporary = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    // The umask may have taken the group's bits.
    temporary
        .as_file()
        .set_permissions(Permissions::from_mode(mode))?;
    temporary.write_all(&text)?;
    temporary.persist(path).map_err(|error| error.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn garbage_is_moved_aside_and_reads_as_an_empty_ledger() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger");
        fs::write(&path, "not json").expect("garbage");
        assert_eq!(read(&path).expect("fresh"), Contents::empty());
        assert!(
            !path.exists(),
            "the garbage is gone from the ledger's place"
        );
        let aside: Vec<String> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(aside[0].starts_with("ledger.corrupt-"), "{aside:?}");
        assert_eq!(
            fs::read_to_string(dir.path().join(&aside[0])).expect("kept"),
            "not json"
        );
    }

    #[test]
    fn a_newer_format_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger");
        let newer = r#"{ "version": 4, "runs": [], "leases": {} }"#;
        fs::write(&path, newer).expect("file");
        let error = read(&path).expect_err("refused");
        assert!(
            matches!(error, LedgerError::NewerFormat { found: 4, .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("format 4"), "{error}");
        assert_eq!(fs::read_to_string(&path).expect("kept"), newer);
    }

    #[test]
    fn a_format_2_ledger_reads_as_format_3_without_members() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger");
        let old = r#"{ "version": 2, "runs": [ { "run": "old",
            "owner": { "pid": 4242, "start_time": 7, "uid": 1000 }, "instance": 0,
            "bundles": [] } ] }"#;
        fs::write(&path, old).expect("file");
        let contents = read(&path).expect("read");
        assert_eq!(contents.version, FORMAT_VERSION);
        assert_eq!(contents.runs.len(), 1);
        assert!(contents.runs[0].members.is_empty());
        write(&path, &contents, 0o600).expect("written");
        let text = fs::read_to_string(&path).expect("ledger");
        assert!(text.contains(r#""version": 3"#), "{text}");
        assert!(!text.contains("members"), "no members, no field: {text}");
    }

    #[test]
    fn a_format_1_ledger_is_replaced_when_its_runs_are_gone_and_refused_while_one_runs() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger");
        let me = crate::ledger::Owner::this_process().expect("me");
        let old = |pid: u32, start: u64| {
            format!(
                r#"{{ "version": 1, "runs": [ {{ "run": "old", "owner": {{ "pid": {pid}, "start_time": {start} }},
                   "instance": 0, "bundles": [] }} ] }}"#
            )
        };
        fs::write(&path, old(me.pid, me.start_time.wrapping_add(1))).expect("file");
        assert_eq!(read(&path).expect("gone"), Contents::empty());
        fs::write(&path, old(me.pid, me.start_time)).expect("file");
        let error = read(&path).expect_err("in use");
        assert!(
            matches!(&error, LedgerError::OlderFormatInUse { pids, .. } if pids == &[me.pid]),
            "{error:?}"
        );
        assert!(path.exists(), "left alone");
    }

    #[test]
    fn the_temporary_file_is_new_and_the_ledger_gets_the_mode_asked_for_despite_the_umask() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger");
        // A link where a predictable temporary name would be is neither followed nor
        // replaced.
        let victim = dir.path().join("victim");
        fs::write(&victim, "keep").expect("victim");
        let pid = std::process::id();
        std::os::unix::fs::symlink(&victim, dir.path().join(format!("ledger.{pid}.tmp")))
            .expect("symlink");
        write(&path, &Contents::empty(), 0o660).expect("written");
        assert_eq!(fs::read_to_string(&victim).expect("victim"), "keep");
        let mode = fs::metadata(&path).expect("ledger").permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        assert_eq!(read(&path).expect("read"), Contents::empty());
        let lock = dir.path().join("ledger.lock");
        std::os::unix::fs::symlink(&victim, &lock).expect("symlink");
        let error = open_lock(&lock, 0o660).expect_err("a link is refused");
        assert!(error.to_string().contains("ledger.lock"), "{error}");
    }
}
