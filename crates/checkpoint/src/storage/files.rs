//! What both kinds of storage share: the files a rank hands in, temporary names, errors.
//!
//! Every checkpoint hand-in and every upload of an attempt's logs walks its directory here,
//! once: no symbolic link inside it is followed, and anything that is not a regular file or
//! a directory (a link, a FIFO, a socket, a device) is refused, naming it. A file is then
//! opened with `O_NOFOLLOW | O_NONBLOCK` and checked again on its descriptor ([`open_regular`]),
//! so that an entry swapped for a link or a FIFO between the walk and the copy is refused too,
//! and no open ever blocks.

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::OFlag;

use crate::StorageError;

/// How deep a handed-in directory may nest.
const MAX_DEPTH: usize = 64;

/// What one rank may hand in for one checkpoint: at most `files` files and `bytes` bytes in
/// all (`None`: no bound). The task's environment says ([`HandInLimits::from_env`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct HandInLimits {
    /// The most files.
    pub files: Option<u64>,
    /// The most bytes.
    pub bytes: Option<u64>,
}

impl HandInLimits {
    /// The bounds [`crate::CHECKPOINT_MAX_FILES`] and [`crate::CHECKPOINT_MAX_BYTES`] of
    /// `env` set (a value that is not a number sets none).
    #[must_use]
    pub fn from_env(env: &std::collections::BTreeMap<String, String>) -> Self {
        let number = |name: &str| env.get(name).and_then(|v| v.trim().parse().ok());
        Self {
            files: number(crate::CHECKPOINT_MAX_FILES),
            bytes: number(crate::CHECKPOINT_MAX_BYTES),
        }
    }
}

/// One file under a handed-in directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceFile {
    /// Its name relative to the directory, with `/` separators.
    pub(crate) name: String,
    /// Where it is.
    pub(crate) path: PathBuf,
    /// The agent's alone (in a directory taken whole into staging, see `take`): a store on
    /// the same file system may move it into place instead of copying it.
    pub(crate) owned: bool,
}

/// Every file under `source`, recursively, sorted by name. `source` itself may be a link to
/// a directory (the caller named it); nothing below it is followed: an entry that is not a
/// regular file or a directory is [`StorageError::NotARegularFile`].
pub(crate) fn walk(source: &Path) -> Result<Vec<SourceFile>, StorageError> {
    walk_within(source, HandInLimits::default())
}

/// [`walk`], refusing a directory beyond `limits` as soon as the walk passes one (so that a
/// directory of millions of files is not listed in full first).
pub(crate) fn walk_within(
    source: &Path,
    limits: HandInLimits,
) -> Result<Vec<SourceFile>, StorageError> {
    walk_sized(source, limits).map(|(files, _)| files)
}

/// [`walk_within`], with the files' total size.
pub(crate) fn walk_sized(
    source: &Path,
    limits: HandInLimits,
) -> Result<(Vec<SourceFile>, u64), StorageError> {
    match std::fs::metadata(source) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(not_a_directory(source)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_a_directory(source));
        }
        Err(error) => return Err(io("read", source, error)),
    }
    let mut walked = Walked {
        source,
        limits,
        files: Vec::new(),
        bytes: 0,
    };
    walked.walk_into(source, "", 0)?;
    let mut files = walked.files;
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((files, walked.bytes))
}

/// A walk under way.
struct Walked<'a> {
    source: &'a Path,
    limits: HandInLimits,
    files: Vec<SourceFile>,
    bytes: u64,
}

fn not_a_directory(source: &Path) -> StorageError {
    StorageError::NotADirectory {
        path: source.display().to_string(),
    }
}

impl Walked<'_> {
    fn walk_into(&mut self, dir: &Path, prefix: &str, depth: usize) -> Result<(), StorageError> {
        if depth > MAX_DEPTH {
            return Err(io(
                "read",
                dir,
                std::io::Error::other(format!("directories nest deeper than {MAX_DEPTH} levels")),
            ));
        }
        let entries = std::fs::read_dir(dir).map_err(|error| io("list", dir, error))?;
        for entry in entries {
            let entry = entry.map_err(|error| io("list", dir, error))?;
            let path = entry.path();
            let Some(file_name) = entry.file_name().to_str().map(str::to_owned) else {
                return Err(io(
                    "read",
                    &path,
                    std::io::Error::other("the file name is not UTF-8"),
                ));
            };
            let name = if prefix.is_empty() {
                file_name
            } else {
                format!("{prefix}/{file_name}")
            };
            let meta =
                std::fs::symlink_metadata(&path).map_err(|error| io("read", &path, error))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                self.walk_into(&path, &name, depth + 1)?;
            } else if kind.is_file() {
                self.files.push(SourceFile {
                    name,
                    path,
                    owned: false,
                });
                self.bytes = self.bytes.saturating_add(meta.len());
                self.check()?;
            } else {
                return Err(not_a_regular_file(&path, kind));
            }
        }
        Ok(())
    }

    /// Refuses the walk once it is beyond its limits.
    fn check(&self) -> Result<(), StorageError> {
        let path = || self.source.display().to_string();
        if let Some(limit) = self.limits.files.filter(|&l| self.files.len() as u64 > l) {
            return Err(StorageError::TooManyFiles {
                path: path(),
                limit,
            });
        }
        if let Some(limit) = self.limits.bytes.filter(|&l| self.bytes > l) {
            return Err(StorageError::TooLarge {
                path: path(),
                bytes: self.bytes,
                limit,
            });
        }
        Ok(())
    }
}

/// What kind of file `kind` is, in words.
fn kind_name(kind: std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

pub(crate) fn not_a_regular_file(path: &Path, kind: std::fs::FileType) -> StorageError {
    StorageError::NotARegularFile {
        path: path.display().to_string(),
        kind: kind_name(kind),
    }
}

/// Opens the regular file at `path` for reading without following a link in its last
/// component and without blocking (a FIFO put in its place since the walk), and checks on
/// the descriptor that it is a regular file.
pub(crate) fn open_regular(path: &Path) -> Result<File, StorageError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)
        .map_err(|error| {
            // ELOOP: the last component is a link.
            match std::fs::symlink_metadata(path) {
                Ok(meta) if !meta.is_file() => not_a_regular_file(path, meta.file_type()),
                _ => io("open", path, error),
            }
        })?;
    let kind = file
        .metadata()
        .map_err(|error| io("read", path, error))?
        .file_type();
    if !kind.is_file() {
        return Err(not_a_regular_file(path, kind));
    }
    Ok(file)
}

/// Sixteen hex digits, different on every call (in this process and, with high
/// probability, across processes and hosts).
pub(crate) fn random_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(nanos);
    format!("{:016x}", hasher.finish())
}

const PART: &str = ".part-";

/// The temporary name a file called `file_name` is written under before it is complete:
/// `.<file_name>.part-<16 hex digits>`, in the same folder.
pub(crate) fn temp_name(file_name: &str) -> String {
    format!(".{file_name}{PART}{}", random_suffix())
}

/// Whether `file_name` is one that [`temp_name`] makes.
pub(crate) fn is_temp(file_name: &str) -> bool {
    temp_of(file_name).is_some()
}

/// The name of the file that `file_name`, a name [`temp_name`] makes, is written for.
pub(crate) fn temp_of(file_name: &str) -> Option<&str> {
    let (name, suffix) = file_name.strip_prefix('.')?.rsplit_once(PART)?;
    (suffix.len() == 16 && suffix.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}

/// The index of a checkpoint folder's name (`checkpoint_000012` → 12).
pub(crate) fn checkpoint_index(dir_name: &str) -> Option<u64> {
    let digits = dir_name.strip_prefix("checkpoint_")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Sums the results of copying files several at once, each `(target, Ok(Some(bytes)))` when
/// copied and `Ok(None)` when skipped after another failed: the total size when none failed;
/// otherwise the first error and the targets that were written, for the caller to delete.
pub(crate) fn tally<T>(
    results: Vec<(T, Result<Option<u64>, StorageError>)>,
) -> Result<u64, (StorageError, Vec<T>)> {
    let mut total = 0;
    let mut first_error = None;
    let mut written = Vec::new();
    for (target, result) in results {
        match result {
            Ok(Some(bytes)) => {
                total += bytes;
                written.push(target);
            }
            Ok(None) => {}
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        None => Ok(total),
        Some(error) => Err((error, written)),
    }
}

/// [`StorageError::Io`] on a local path.
pub(crate) fn io(action: &'static str, path: &Path, error: std::io::Error) -> StorageError {
    StorageError::Io {
        action,
        path: path.display().to_string(),
        source: Box::new(error),
    }
}

/// [`StorageError::Io`] of a task that did not finish (it panicked or was cancelled).
pub(crate) fn join_error(
    action: &'static str,
    path: &str,
    error: tokio::task::JoinError,
) -> StorageError {
    StorageError::Io {
        action,
        path: path.to_owned(),
        source: Box::new(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_are_hidden_unique_and_recognised() {
        let a = temp_name("model.pt");
        let b = temp_name("model.pt");
        assert_ne!(a, b);
        assert!(a.starts_with(".model.pt.part-"), "{a}");
        assert!(is_temp(&a) && is_temp(&b));
        for name in [
            "model.pt",
            ".hidden",
            ".model.part-12",
            "model.pt.part-0123456789abcdef",
        ] {
            assert!(!is_temp(name), "{name}");
        }
    }

    #[test]
    fn only_checkpoint_folders_have_an_index() {
        assert_eq!(checkpoint_index("checkpoint_000012"), Some(12));
        assert_eq!(checkpoint_index("checkpoint_1234567"), Some(1_234_567));
        for name in ["checkpoint_", "checkpoint_12a", "run.json", "checkpoint_-1"] {
            assert_eq!(checkpoint_index(name), None, "{name}");
        }
    }

    #[test]
    fn a_tally_sums_the_copies_or_keeps_the_first_error_and_what_was_written() {
        assert_eq!(
            tally(vec![("a", Ok(Some(3))), ("b", Ok(Some(4)))]).ok(),
            Some(7)
        );
        let failed = |path: &str| not_a_directory(Path::new(path));
        let results = vec![
            ("a", Ok(Some(3))),
            ("b", Err(failed("first"))),
            ("c", Ok(None)),
            ("d", Err(failed("second"))),
            ("e", Ok(Some(1))),
        ];
        let Err((error, written)) = tally(results) else {
            panic!("a failed copy is an error");
        };
        assert!(
            matches!(&error, StorageError::NotADirectory { path } if path == "first"),
            "{error:?}"
        );
        assert_eq!(written, ["a", "e"]);
    }

    #[test]
    fn a_walk_names_nested_files_relative_to_the_directory_sorted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("b/c")).unwrap();
        std::fs::write(dir.path().join("z.bin"), b"z").unwrap();
        std::fs::write(dir.path().join("b/c/d.txt"), b"d").unwrap();
        std::fs::write(dir.path().join("a.txt"), b"a").unwrap();
        let names: Vec<_> = walk(dir.path())
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names, ["a.txt", "b/c/d.txt", "z.bin"]);
    }

    #[test]
    fn a_link_a_fifo_or_a_socket_inside_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        type Make = fn(&Path);
        let cases: [(&str, &str, Make); 4] = [
            ("link", "a symbolic link", |p| {
                std::os::unix::fs::symlink("../secret", p).unwrap();
            }),
            ("dir-link", "a symbolic link", |p| {
                std::os::unix::fs::symlink("/", p).unwrap();
            }),
            ("fifo", "a FIFO", |p| {
                nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
            }),
            ("socket", "a socket", |p| {
                std::os::unix::net::UnixListener::bind(p).unwrap();
            }),
        ];
        for (name, kind, make) in cases {
            let source = tempfile::tempdir().unwrap();
            std::fs::create_dir(source.path().join("sub")).unwrap();
            std::fs::write(source.path().join("model.pt"), b"m").unwrap();
            let path = source.path().join("sub").join(name);
            make(&path);
            let error = walk(source.path()).unwrap_err();
            assert!(
                matches!(&error, StorageError::NotARegularFile { path: p, kind: k }
                    if p == &path.display().to_string() && k == &kind),
                "{name}: {error:?}"
            );
            let text = error.to_string();
            assert!(
                text.contains(&format!("sub/{name}")) && text.contains(kind),
                "{text}"
            );
        }
    }

    #[test]
    fn a_file_swapped_for_a_fifo_or_a_link_after_the_walk_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let link = dir.path().join("link");
        std::fs::write(dir.path().join("file"), b"f").unwrap();
        std::os::unix::fs::symlink("file", &link).unwrap();
        // Opened without O_NONBLOCK, the FIFO would block this test for ever.
        for (path, kind) in [(fifo, "a FIFO"), (link, "a symbolic link")] {
            let error = open_regular(&path).unwrap_err();
            assert!(
                matches!(&error, StorageError::NotARegularFile { kind: k, .. } if k == &kind),
                "{error:?}"
            );
        }
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut open_regular(&dir.path().join("file")).unwrap(),
            &mut text,
        )
        .unwrap();
        assert_eq!(text, "f");
    }

    #[test]
    fn a_file_or_a_missing_path_is_not_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        for path in [file, dir.path().join("missing")] {
            assert!(matches!(
                walk(&path),
                Err(StorageError::NotADirectory { .. })
            ));
        }
    }
}
