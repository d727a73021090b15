//! The machine-wide reservation ledger: what every local run on this machine holds, so that
//! concurrent runs without a daemon share it (no CPU, memory or device given twice).
//!
//! The ledger is one JSON file, changed only while holding an exclusive lock on a file
//! beside it (`<ledger>.lock`), and replaced whole by an atomic rename, so a reader never
//! sees half a write and a driver killed while writing leaves the old ledger intact:
//!
//! ```json
//! { "version": 1,
//!   "runs": [ { "run": "run-1a2b", "owner": { "pid": 4242, "start_time": 881234 }, "instance": 0,
//!               "bundles": [ { "resources": { "CPU": 1, "GPU": 1 }, "devices": { "GPU": ["0"] } } ] } ] }
//! ```
//!
//! An entry whose owner process is gone (its pid is free, a zombie, or taken by a process
//! that started later) is dropped by the next run that takes the lock: a run's entries go
//! away however it ends, SIGKILL included.
//!
//! Where it is ([`LedgerLocation::from_env`]): `$TRAINYARD_LEDGER` when set (`system` for
//! [`SYSTEM_LEDGER`], which every user of a shared machine can be pointed at), else
//! `$XDG_RUNTIME_DIR/trainyard/ledger`, else `trainyard-<uid>/ledger` in the temporary
//! directory (made with mode 0700 and checked to be this user's).

mod owner;
mod share;

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use trainyard_runtime::reservations::HeldBundle;

pub use owner::Owner;
pub use share::{holder, shortage};
pub(crate) use share::{release, release_now, settle, wait_ready};

/// The variable that says where the ledger is.
pub const LEDGER_ENV: &str = "TRAINYARD_LEDGER";

/// The system-wide ledger, for a machine whose users share it: `TRAINYARD_LEDGER=system`.
/// Its directory must exist and be writable by every user of trainyard (mode 1777, say).
pub const SYSTEM_LEDGER: &str = "/var/lib/trainyard/ledger";

/// The version of the file format this code writes and reads.
const FORMAT_VERSION: u32 = 1;

/// How long a run waits for the ledger's lock before it gives up: far longer than anyone
/// holds it (a read and a write of a small file).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between tries for the lock.
const LOCK_RETRY: Duration = Duration::from_millis(2);

/// Where a run records what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LedgerLocation {
    /// Nowhere: the run takes its nodes to be all its own (for tests, or a machine given
    /// to one run).
    Off,
    /// The ledger file at this path.
    At(PathBuf),
}

impl LedgerLocation {
    /// `$TRAINYARD_LEDGER` (`system` meaning [`SYSTEM_LEDGER`]), else the user's own ledger
    /// under `$XDG_RUNTIME_DIR`, else under the temporary directory.
    #[must_use]
    pub fn from_env() -> Self {
        match std::env::var_os(LEDGER_ENV) {
            Some(value) if value == "system" => Self::At(PathBuf::from(SYSTEM_LEDGER)),
            Some(value) if !value.is_empty() => Self::At(PathBuf::from(value)),
            _ => Self::At(Self::user_default()),
        }
    }

    /// The user's own ledger: `$XDG_RUNTIME_DIR/trainyard/ledger`, else
    /// `trainyard-<uid>/ledger` in the temporary directory.
    #[must_use]
    pub fn user_default() -> PathBuf {
        match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
            Some(dir) if dir.is_absolute() => dir.join("trainyard").join("ledger"),
            _ => {
                let uid = own_uid().map_or_else(|| "user".to_owned(), |uid| uid.to_string());
                std::env::temp_dir()
                    .join(format!("trainyard-{uid}"))
                    .join("ledger")
            }
        }
    }
}

/// What one run holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunEntry {
    /// The run's name.
    pub run: String,
    /// Its driver process.
    pub owner: Owner,
    /// Tells apart runtimes of one driver process.
    #[serde(default)]
    pub instance: u64,
    /// What it holds, bundle by bundle.
    pub bundles: Vec<HeldBundle>,
}

impl RunEntry {
    fn is(&self, owner: Owner, instance: u64) -> bool {
        self.owner == owner && self.instance == instance
    }
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    version: u32,
    runs: Vec<RunEntry>,
}

impl Contents {
    const fn empty() -> Self {
        Self {
            version: FORMAT_VERSION,
            runs: Vec::new(),
        }
    }

    /// Drops the entries whose owner is gone; how many.
    fn reclaim(&mut self, alive: impl Fn(&Owner) -> bool) -> usize {
        let before = self.runs.len();
        self.runs.retain(|entry| alive(&entry.owner));
        before - self.runs.len()
    }
}

/// Why the ledger cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// Its directory cannot be made.
    #[error("cannot create the ledger's directory `{}`", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The per-user directory in the temporary directory belongs to another user.
    #[error("the ledger's directory `{}` belongs to user {owner}, not to this user; set {LEDGER_ENV}", path.display())]
    NotOwned {
        /// The directory.
        path: PathBuf,
        /// Its owner's uid.
        owner: u32,
    },
    /// The file or its lock cannot be read or written.
    #[error("cannot use the ledger `{}`", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is not a ledger this version understands.
    #[error("the ledger `{}` cannot be read; remove it when no trainyard run is running", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Another process held the lock for longer than [`LOCK_TIMEOUT`].
    #[error("the ledger `{}` stayed locked for {waited:?}", path.display())]
    Busy {
        /// The file.
        path: PathBuf,
        /// How long this run tried.
        waited: Duration,
    },
}

/// One run's handle on the ledger: it reads what the others hold and records what it holds,
/// each time under the lock. See the [module docs](self).
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    lock_path: PathBuf,
    run: String,
    owner: Owner,
    instance: u64,
}

impl Ledger {
    /// The ledger at `path` for run `run` of this process; makes its directory if needed.
    ///
    /// # Errors
    /// [`LedgerError::Directory`], [`LedgerError::NotOwned`], or [`LedgerError::Io`] when
    /// this process's own start time cannot be read.
    pub fn open(path: &Path, run: &str) -> Result<Self, LedgerError> {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        make_directory(path)?;
        let owner = Owner::this_process().map_err(|source| LedgerError::Io {
            path: PathBuf::from("/proc/self/stat"),
            source,
        })?;
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        Ok(Self {
            path: path.to_owned(),
            lock_path: PathBuf::from(lock_path),
            run: run.to_owned(),
            owner,
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The ledger file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Under the lock: drops dead runs' entries, hands the live entries of the other runs
    /// to `change`, and records what it returns as all this run holds (nothing removes the
    /// run's entry).
    ///
    /// # Errors
    /// Any [`LedgerError`] but `Directory` and `NotOwned`; the ledger is unchanged then.
    pub fn update<T>(
        &self,
        change: impl FnOnce(&[RunEntry]) -> (Vec<HeldBundle>, T),
    ) -> Result<T, LedgerError> {
        locked(&self.path, &self.lock_path, |contents| {
            contents.reclaim(Owner::is_alive);
            contents
                .runs
                .retain(|entry| !entry.is(self.owner, self.instance));
            let (bundles, answer) = change(&contents.runs);
            if !bundles.is_empty() {
                contents.runs.push(RunEntry {
                    run: self.run.clone(),
                    owner: self.owner,
                    instance: self.instance,
                    bundles,
                });
            }
            answer
        })
    }

    /// Removes this run's entry.
    ///
    /// # Errors
    /// As [`Ledger::update`].
    pub fn release(&self) -> Result<(), LedgerError> {
        self.update(|_| (Vec::new(), ()))
    }
}

/// The live runs of the ledger at `path` (dropping dead ones from it on the way).
///
/// # Errors
/// As [`Ledger::open`] and [`Ledger::update`].
pub fn live_runs(path: &Path) -> Result<Vec<RunEntry>, LedgerError> {
    make_directory(path)?;
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    locked(path, Path::new(&lock_path), |contents| {
        contents.reclaim(Owner::is_alive);
        contents.runs.clone()
    })
}

/// This process's user id (the owner of its `/proc` entry).
fn own_uid() -> Option<u32> {
    fs::metadata("/proc/self").ok().map(|meta| meta.uid())
}

/// Makes the ledger's directory: mode 0700 and checked to be this user's when it is the
/// per-user one in the temporary directory.
fn make_directory(path: &Path) -> Result<(), LedgerError> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| LedgerError::Directory {
            path: dir.to_owned(),
            source,
        })?;
    if path == LedgerLocation::user_default() {
        let meta = fs::metadata(dir).map_err(|source| LedgerError::Directory {
            path: dir.to_owned(),
            source,
        })?;
        if own_uid().is_some_and(|me| meta.uid() != me) {
            return Err(LedgerError::NotOwned {
                path: dir.to_owned(),
                owner: meta.uid(),
            });
        }
    }
    Ok(())
}

/// Runs `change` on the ledger's contents under its lock, trying for the lock up to
/// [`LOCK_TIMEOUT`], and writes the contents back when `change` altered them.
fn locked<T>(
    path: &Path,
    lock_path: &Path,
    change: impl FnOnce(&mut Contents) -> T,
) -> Result<T, LedgerError> {
    let lock_file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(lock_path)
        .map_err(|source| LedgerError::Io {
            path: lock_path.to_owned(),
            source,
        })?;
    let mut lock = fd_lock::RwLock::new(lock_file);
    let started = Instant::now();
    loop {
        match lock.try_write() {
            Ok(_guard) => {
                let before = read(path)?;
                let mut contents = before.clone();
                let answer = change(&mut contents);
                if contents != before {
                    write(path, &contents).map_err(|source| LedgerError::Io {
                        path: path.to_owned(),
                        source,
                    })?;
                }
                return Ok(answer);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(source) => {
                return Err(LedgerError::Io {
                    path: lock_path.to_owned(),
                    source,
                });
            }
        }
        if started.elapsed() > LOCK_TIMEOUT {
            return Err(LedgerError::Busy {
                path: path.to_owned(),
                waited: started.elapsed(),
            });
        }
        std::thread::sleep(LOCK_RETRY);
    }
}

fn read(path: &Path) -> Result<Contents, LedgerError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Contents::empty()),
        Err(source) => {
            return Err(LedgerError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    if text.trim().is_empty() {
        return Ok(Contents::empty());
    }
    serde_json::from_str(&text).map_err(|source| LedgerError::Unreadable {
        path: path.to_owned(),
        source,
    })
}

/// Writes `contents` to a file beside `path` and renames it over `path`.
fn write(path: &Path, contents: &Contents) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.tmp", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let text = serde_json::to_vec_pretty(contents).map_err(io::Error::other)?;
    let mut file = File::create(&temporary)?;
    file.write_all(&text)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, path)
}
