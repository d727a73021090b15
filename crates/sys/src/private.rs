//! Private files and folders: the one place where trainyard makes a temporary folder, a
//! socket's folder, a staging or download folder, or a file it writes for the user.
//!
//! The rule, whatever the umask and wherever the path (a shared, sticky `/tmp` included):
//! - a folder it makes is mode 0700 and a file it makes mode 0600 (set on the open
//!   descriptor after creation, so that a umask of 0 or 0777 changes nothing);
//! - nothing is opened or made through a link: a link where a file or folder is expected is
//!   refused, never followed;
//! - a file or folder that is there already is used only when it is this user's (its owner is
//!   the effective user) and, for a folder, writable by no one else; a file is truncated
//!   only after that check, never by the open itself.
//!
//! The workspace's lint keeps it so: `clippy.toml` disallows `tempfile::tempdir`,
//! `tempfile::Builder::tempdir`, `std::fs::write`, `File::create` and their async
//! counterparts outside this module.
//!
//! ```
//! # fn main() -> std::io::Result<()> {
//! use std::os::unix::fs::PermissionsExt as _;
//!
//! let dir = trainyard_sys::private::temp_dir("trainyard-example-")?;
//! let file = dir.path().join("out.txt");
//! trainyard_sys::private::write(&file, b"only mine")?;
//! assert_eq!(std::fs::metadata(&file)?.permissions().mode() & 0o777, 0o600);
//! assert_eq!(std::fs::metadata(dir.path())?.permissions().mode() & 0o777, 0o700);
//! # Ok(())
//! # }
//! ```

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write as _};
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};

pub use tempfile::TempDir;

/// The mode of every folder made here.
pub const DIR_MODE: u32 = 0o700;
/// The mode of every file made here.
pub const FILE_MODE: u32 = 0o600;

/// A fresh folder named `PREFIX` and random characters in the temporary directory (`$TMPDIR`,
/// else `/tmp`), mode 0700; removed with what it holds when dropped
/// ([`TempDir::keep`] keeps it).
///
/// # Errors
/// When it cannot be made.
pub fn temp_dir(prefix: &str) -> io::Result<TempDir> {
    temp_dir_in(&std::env::temp_dir(), prefix)
}

/// [`temp_dir`], in `parent`.
///
/// # Errors
/// When it cannot be made.
pub fn temp_dir_in(parent: &Path, prefix: &str) -> io::Result<TempDir> {
    #[allow(
        clippy::disallowed_methods,
        reason = "this is the one place that makes them"
    )]
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(Permissions::from_mode(DIR_MODE))
        .tempdir_in(parent)?;
    // mkdir's mode is masked by the umask: set it on the folder itself (no link: it was made
    // just now, and a link would be refused).
    open_dir(dir.path())?.set_permissions(Permissions::from_mode(DIR_MODE))?;
    Ok(dir)
}

/// Folder `path`, this user's alone: made with mode 0700 when missing (its parent exists),
/// else used when it passes [`check_dir`].
///
/// # Errors
/// [`io::ErrorKind::PermissionDenied`] for a folder that fails the check (the message says
/// why), [`io::ErrorKind::NotADirectory`] for anything else there, or why it cannot be made.
pub fn dir(path: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => open_dir(path)?.set_permissions(Permissions::from_mode(DIR_MODE)),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => check_dir(path),
        Err(error) => Err(error),
    }
}

/// [`dir`], with its missing parents made first (mode 0700, as `mkdir -p` would make them
/// with a umask of 077). Parents that are there are not checked: they are where the caller
/// was told to write.
///
/// # Errors
/// As [`dir`].
pub fn dir_all(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        missing_dirs(parent)?;
    }
    dir(path)
}

/// Makes the folders of `path` that are missing, itself included, each with mode 0700; those
/// there are not checked. For a folder the user named to write new files into (made with
/// [`create_new`] or [`create_unique`]: nothing there is reused).
///
/// # Errors
/// Why a folder cannot be made.
pub fn missing_dirs(path: &Path) -> io::Result<()> {
    let missing: Vec<&Path> = path
        .ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .take_while(|p| std::fs::symlink_metadata(p).is_err())
        .collect();
    for dir in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
            Ok(()) => open_dir(dir)?.set_permissions(Permissions::from_mode(DIR_MODE))?,
            // Made meanwhile by someone else: not one of ours, not checked.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Whether the folder at `path` may hold this user's private files: it is a folder and no
/// link, this user's, and writable by no one else.
///
/// # Errors
/// [`io::ErrorKind::PermissionDenied`] naming the owner or the mode that fails, or
/// [`io::ErrorKind::NotADirectory`].
pub fn check_dir(path: &Path) -> io::Result<()> {
    let meta = open_dir(path)?.metadata()?;
    let mode = meta.mode() & 0o7777;
    owned(path, &meta)?;
    if mode & 0o022 != 0 {
        return Err(refused(
            path,
            &format!("others may write to it (mode {mode:04o})"),
        ));
    }
    Ok(())
}

/// A new file at `path`, mode 0600, for writing; never through a link.
///
/// # Errors
/// [`io::ErrorKind::AlreadyExists`] when anything is there (a link included).
pub fn create_new(path: &Path) -> io::Result<File> {
    let file = options().write(true).create_new(true).open(path)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// A new file in `dir` named `PREFIX`, random characters and `SUFFIX`, mode 0600, for reading
/// and writing: a name no one could have made first. It stays when the file is dropped.
///
/// # Errors
/// Why it cannot be made.
pub fn create_unique(dir: &Path, prefix: &str, suffix: &str) -> io::Result<(File, PathBuf)> {
    let (file, path) = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .permissions(Permissions::from_mode(FILE_MODE))
        .tempfile_in(dir)?
        .keep()
        .map_err(|error| error.error)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok((file, path))
}

/// A file at `path` written from its start: a new one (mode 0600), or the one there when it
/// is this user's regular file (see [`check_file`]), emptied.
///
/// # Errors
/// As [`check_file`], or why it cannot be made.
pub fn create(path: &Path) -> io::Result<File> {
    let (file, made) = open_or_make(path, false)?;
    if !made {
        file.set_len(0)?;
    }
    Ok(file)
}

/// A file at `path` to read and append to: a new one (mode 0600), or the one there when it is
/// this user's regular file (see [`check_file`]), kept as it is.
///
/// # Errors
/// As [`create`].
pub fn append(path: &Path) -> io::Result<(File, bool)> {
    open_or_make(path, true)
}

/// Writes `bytes` into the file at `path` as [`create`] opens it.
///
/// # Errors
/// As [`create`], or the write's.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    create(path)?.write_all(bytes)
}

/// Replaces the file at `path` with one holding `bytes`, whole: written under a new random
/// name beside it, then renamed over it (a link at `path` is replaced, not followed). A file
/// of another user's there is not replaced (a sticky folder refuses the rename; elsewhere
/// [`io::ErrorKind::PermissionDenied`] says whose it is).
///
/// # Errors
/// Why it could not be written or renamed; nothing is left under the temporary name.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        owned(path, &meta)?;
    }
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => (dir, name.to_string_lossy()),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no file", path.display()),
            ));
        }
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut temp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".part")
        .permissions(Permissions::from_mode(FILE_MODE))
        .tempfile_in(dir)?;
    temp.as_file()
        .set_permissions(Permissions::from_mode(FILE_MODE))?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map(drop).map_err(|error| error.error)
}

/// The file at `path` opened for reading, when it is a regular file and no link (a FIFO never
/// blocks the open).
///
/// # Errors
/// [`io::ErrorKind::InvalidInput`] for anything but a regular file, or the open's error.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(file)
}

/// Whether `file` (opened at `path`) may be written as this user's: a regular file whose
/// owner is this user.
///
/// # Errors
/// [`io::ErrorKind::PermissionDenied`] naming its owner, or
/// [`io::ErrorKind::InvalidInput`] for anything but a regular file.
pub fn check_file(path: &Path, file: &File) -> io::Result<()> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    owned(path, &meta)?;
    Ok(())
}

/// This process's effective user id: the owner of what it makes.
#[must_use]
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The folder of this user's for what outlives one command on this host but is no run's (the
/// machine-wide ledger, the locks drivers hold): `$XDG_RUNTIME_DIR/trainyard`; else
/// `~/.cache/trainyard/<host>` (a home shared between machines keeps one folder per
/// machine); else, without a home, `/run/user/<uid>/trainyard`. Never a shared temporary
/// folder, where another user could make it first. With why it is not the first, when it is
/// not.
#[must_use]
pub fn user_state_dir() -> (PathBuf, Option<&'static str>) {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|dir| dir.is_absolute() && dir != Path::new("/"))
    };
    if let Some(dir) = absolute("XDG_RUNTIME_DIR") {
        return (dir.join("trainyard"), None);
    }
    if let Some(home) = absolute("HOME") {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|name| name.into_string().ok())
            .filter(|name| !name.is_empty() && !name.contains('/'))
            .unwrap_or_else(|| "localhost".to_owned());
        return (
            home.join(".cache").join("trainyard").join(host),
            Some("XDG_RUNTIME_DIR is not set"),
        );
    }
    (
        PathBuf::from("/run/user")
            .join(euid().to_string())
            .join("trainyard"),
        Some("neither XDG_RUNTIME_DIR nor HOME is set"),
    )
}

/// [`user_state_dir`]'s folder `name`, made (with what is missing above it, mode 0700) when
/// missing, and used only when both it and the state folder are this user's and closed to
/// everyone else (mode 0700): another user's folder of that name is refused, never used.
///
/// # Errors
/// [`io::ErrorKind::PermissionDenied`] naming what fails, or why it cannot be made.
pub fn state_dir(name: &str) -> io::Result<PathBuf> {
    let (base, _) = user_state_dir();
    let dir = base.join(name);
    missing_dirs(&dir)?;
    for path in [&base, &dir] {
        check_dir(path)?;
        let mode = open_dir(path)?.metadata()?.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(refused(
                path,
                &format!("other users may enter it (mode {mode:04o}, not 0700)"),
            ));
        }
    }
    Ok(dir)
}

/// Opens `path` as [`create`] or [`append`] do; whether the file was made.
fn open_or_make(path: &Path, append: bool) -> io::Result<(File, bool)> {
    let mut new = options();
    new.write(true).read(append).create_new(true);
    match new.open(path) {
        Ok(file) => {
            file.set_permissions(Permissions::from_mode(FILE_MODE))?;
            Ok((file, true))
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            let mut there = options();
            there.write(true).read(append).append(append);
            let file = there
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(path)
                .map_err(|error| match error.raw_os_error() {
                    Some(libc::ELOOP) => refused(path, "it is a link"),
                    _ => error,
                })?;
            check_file(path, &file)?;
            Ok((file, false))
        }
        Err(error) => Err(error),
    }
}

/// What every file open here starts from: never through a link, closed on exec.
fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    options
}

/// The folder at `path`, opened without following a link.
fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|error| match error.raw_os_error() {
            // O_DIRECTORY is checked before O_NOFOLLOW: a link to a folder is ENOTDIR too.
            Some(libc::ELOOP | libc::ENOTDIR)
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                refused(path, "it is a link")
            }
            Some(libc::ENOTDIR) => io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a folder", path.display()),
            ),
            _ => error,
        })
}

/// Whether `meta` (of `path`) is this user's.
fn owned(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    if meta.uid() == euid() {
        return Ok(());
    }
    Err(refused(
        path,
        &format!(
            "it is uid {}'s, not this user's (uid {})",
            meta.uid(),
            euid()
        ),
    ))
}

/// A refusal of `path` for `why`.
fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{} is refused: {why}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).expect("there").mode() & 0o7777
    }

    /// Set in the environment of this test binary run again for one umask: the umask is the
    /// whole process's, so it is changed only in a process of its own.
    const UMASK_ENV: &str = "TRAINYARD_PRIVATE_TEST_UMASK";

    /// The child's side of the test below: with the umask it is given.
    #[test]
    fn umask_child() {
        let Some(mask) = std::env::var(UMASK_ENV)
            .ok()
            .and_then(|m| u32::from_str_radix(&m, 8).ok())
        else {
            return; // Run as a child of the test below only.
        };
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask));
        made_private(mask);
    }

    #[test]
    fn folders_are_0700_and_files_0600_whatever_the_umask() {
        for mask in ["000", "002", "022", "077", "277"] {
            let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args([
                    "--exact",
                    "private::tests::umask_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(UMASK_ENV, mask)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("the child runs");
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "umask {mask}: {said}");
            assert!(said.contains("1 passed"), "umask {mask}: {said}");
        }
    }

    fn made_private(mask: u32) {
        let top = temp_dir("trainyard-private-test-").expect("made");
        assert_eq!(mode(top.path()), DIR_MODE, "umask {mask:03o}");
        let sub = top.path().join("a/b");
        dir_all(&sub).expect("made");
        assert_eq!(mode(&sub), DIR_MODE, "umask {mask:03o}");
        let file = sub.join("f");
        write(&file, b"x").expect("written");
        assert_eq!(mode(&file), FILE_MODE, "umask {mask:03o}");
        let replaced = sub.join("r");
        replace(&replaced, b"y").expect("replaced");
        assert_eq!(mode(&replaced), FILE_MODE, "umask {mask:03o}");
        let (_, made) = append(&sub.join("log")).expect("made");
        assert!(made);
        assert_eq!(mode(&sub.join("log")), FILE_MODE, "umask {mask:03o}");
    }

    #[test]
    fn a_link_is_refused_and_never_followed() {
        let top = temp_dir("trainyard-private-test-").expect("made");
        let target = top.path().join("target");
        std::fs::create_dir(&target).expect("made");
        let precious = target.join("precious");
        std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(&precious)
            .and_then(|mut f| f.write_all(b"precious"))
            .expect("written");

        let file_link = top.path().join("file-link");
        symlink(&precious, &file_link).expect("linked");
        for result in [
            write(&file_link, b"evil").map(drop),
            create(&file_link).map(drop),
            append(&file_link).map(drop),
            create_new(&file_link).map(drop),
            open_regular(&file_link).map(drop),
        ] {
            assert!(result.is_err());
        }
        assert_eq!(std::fs::read(&precious).expect("read"), b"precious");

        let dir_link = top.path().join("dir-link");
        symlink(&target, &dir_link).expect("linked");
        let error = dir(&dir_link).expect_err("refused");
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied, "{error}");
        assert!(error.to_string().contains("link"), "{error}");
        assert!(check_dir(&dir_link).is_err());

        // A link is replaced, not followed.
        replace(&file_link, b"new").expect("replaced");
        assert_eq!(std::fs::read(&precious).expect("read"), b"precious");
        assert_eq!(std::fs::read(&file_link).expect("read"), b"new");
    }

    #[test]
    fn a_folder_others_may_write_to_is_refused_naming_its_mode() {
        let top = temp_dir("trainyard-private-test-").expect("made");
        let open = top.path().join("open");
        std::fs::create_dir(&open).expect("made");
        std::fs::set_permissions(&open, Permissions::from_mode(0o777)).expect("chmod");
        let error = dir(&open).expect_err("refused");
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert!(error.to_string().contains("mode 0777"), "{error}");
        std::fs::set_permissions(&open, Permissions::from_mode(0o755)).expect("chmod");
        dir(&open).expect("this user's, writable by no one else");
    }

    #[test]
    fn an_own_file_is_emptied_or_appended_to_and_a_fifo_is_refused_without_blocking() {
        let top = temp_dir("trainyard-private-test-").expect("made");
        let file = top.path().join("out");
        write(&file, b"first").expect("written");
        let (mut appended, made) = append(&file).expect("opened");
        assert!(!made);
        appended.write_all(b" second").expect("written");
        assert_eq!(std::fs::read(&file).expect("read"), b"first second");
        write(&file, b"third").expect("written");
        assert_eq!(std::fs::read(&file).expect("read"), b"third");

        let fifo = top.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("made");
        assert!(create(&fifo).is_err());
        assert!(open_regular(&fifo).is_err());
    }

    #[test]
    fn a_state_folder_is_private_and_another_users_is_refused() {
        let dir = state_dir("private-test").expect("made");
        assert!(dir.starts_with(user_state_dir().0));
        assert_eq!(mode(&dir), DIR_MODE);
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).expect("chmod");
        let error = state_dir("private-test").expect_err("open to others");
        assert!(error.to_string().contains("mode 0755"), "{error}");
        std::fs::remove_dir(&dir).expect("removed");
    }
}
