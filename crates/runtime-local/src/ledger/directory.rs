//! The ledger's directory: made when missing (but for the shared one, which an
//! administrator makes), refused when others could slip files into it unseen, and what it
//! says about the mode of the ledger's files.

use std::fmt;
use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::Path;

use super::{LedgerError, LedgerLocation, SYSTEM_LEDGER};

/// Who the ledger's files are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// This user alone: files of mode 0600.
    Private,
    /// The group of a setgid directory, whose files are that group's: files of mode 0660.
    Group,
}

impl Sharing {
    /// The mode of the ledger's files.
    pub(crate) const fn mode(self) -> u32 {
        match self {
            Self::Private => 0o600,
            Self::Group => 0o660,
        }
    }
}

/// What is wrong with the ledger's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirectoryProblem {
    /// It is a symbolic link.
    Symlink,
    /// It is no directory.
    NotADirectory,
    /// Every user may write to it, and the sticky bit does not keep them off each other's
    /// files.
    WorldWritable {
        /// Its mode.
        mode: u32,
    },
    /// The per-user directory belongs to another user.
    NotOwned {
        /// Its owner.
        owner: u32,
        /// This user.
        uid: u32,
    },
    /// The per-user directory lets other users in.
    OpenToOthers {
        /// Its mode.
        mode: u32,
    },
}

impl fmt::Display for DirectoryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Symlink => f.write_str("a symbolic link"),
            Self::NotADirectory => f.write_str("not a directory"),
            Self::WorldWritable { mode } => write!(
                f,
                "writable by every user without the sticky bit (mode {mode:04o})"
            ),
            Self::NotOwned { owner, uid } => {
                write!(f, "owned by uid {owner}, not by this user (uid {uid})")
            }
            Self::OpenToOthers { mode } => {
                write!(f, "open to other users (mode {mode:04o}, not 0700)")
            }
        }
    }
}

/// What a per-user directory must be.
pub(crate) const PER_USER: &str = "the per-user ledger's directory must be a directory (not a link) of this user's with mode 0700: remove it, or set TRAINYARD_LEDGER to a ledger elsewhere";

/// What any other ledger directory must be.
pub(crate) const SHARED: &str = "a ledger shared by a group needs a setgid directory of that group (`install -d -m 2770 -g trainyard /var/lib/trainyard`), a private one a directory of this user's";

/// This process's effective user id (the owner of its `/proc` entry).
pub(crate) fn own_uid() -> Option<u32> {
    fs::metadata("/proc/self").ok().map(|meta| meta.uid())
}

/// Makes the ledger's directory when missing (mode 0700; never the shared
/// [`SYSTEM_LEDGER`]'s), checks it, and says who its files are for.
pub(crate) fn prepare(path: &Path) -> Result<Sharing, LedgerError> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(Sharing::Private);
    };
    let directory_error = |source: io::Error| LedgerError::Directory {
        path: dir.to_owned(),
        source,
    };
    if path == Path::new(SYSTEM_LEDGER) {
        if let Err(error) = fs::symlink_metadata(dir) {
            return Err(if error.kind() == io::ErrorKind::NotFound {
                LedgerError::NoSharedDirectory {
                    path: dir.to_owned(),
                }
            } else {
                directory_error(error)
            });
        }
    } else {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(directory_error)?;
    }
    let meta = fs::symlink_metadata(dir).map_err(directory_error)?;
    let per_user = path == LedgerLocation::user_default();
    let refuse = |problem| LedgerError::UnsafeDirectory {
        path: dir.to_owned(),
        problem,
        accepted: if per_user { PER_USER } else { SHARED },
    };
    if meta.file_type().is_symlink() {
        return Err(refuse(DirectoryProblem::Symlink));
    }
    if !meta.is_dir() {
        return Err(refuse(DirectoryProblem::NotADirectory));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(refuse(DirectoryProblem::WorldWritable { mode }));
    }
    if per_user {
        if let Some(uid) = own_uid().filter(|&uid| uid != meta.uid()) {
            return Err(refuse(DirectoryProblem::NotOwned {
                owner: meta.uid(),
                uid,
            }));
        }
        if mode & 0o077 != 0 {
            return Err(refuse(DirectoryProblem::OpenToOthers { mode }));
        }
        return Ok(Sharing::Private);
    }
    Ok(if mode & 0o2000 == 0 {
        Sharing::Private
    } else {
        Sharing::Group
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn a_setgid_directory_shares_with_its_group_and_a_plain_one_does_not() {
        let root = tempfile::tempdir().expect("temp dir");
        let ledger = root.path().join("ledger");
        assert_eq!(prepare(&ledger).expect("private"), Sharing::Private);
        chmod(root.path(), 0o2770);
        assert_eq!(prepare(&ledger).expect("shared"), Sharing::Group);
        chmod(root.path(), 0o1777);
        assert_eq!(
            prepare(&ledger).expect("sticky"),
            Sharing::Private,
            "a sticky directory shares no files"
        );
        assert_eq!(Sharing::Group.mode(), 0o660);
    }

    #[test]
    fn a_world_writable_directory_without_the_sticky_bit_is_refused() {
        let root = tempfile::tempdir().expect("temp dir");
        chmod(root.path(), 0o777);
        let error = prepare(&root.path().join("ledger")).expect_err("refused");
        assert!(
            matches!(
                error,
                LedgerError::UnsafeDirectory {
                    problem: DirectoryProblem::WorldWritable { mode: 0o777 },
                    ..
                }
            ),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(text.contains(&root.path().display().to_string()), "{text}");
        assert!(
            text.contains("mode 0777") && text.contains("setgid"),
            "{text}"
        );
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let root = tempfile::tempdir().expect("temp dir");
        let real = root.path().join("real");
        fs::create_dir(&real).expect("dir");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let error = prepare(&link.join("ledger")).expect_err("refused");
        assert!(
            matches!(
                error,
                LedgerError::UnsafeDirectory {
                    problem: DirectoryProblem::Symlink,
                    ..
                }
            ),
            "{error:?}"
        );
    }
}
