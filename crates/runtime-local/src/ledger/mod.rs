//! The machine-wide reservation ledger: what every local run on this machine holds, so that
//! concurrent runs without a daemon share it (no CPU, memory or device given twice).
//!
//! The ledger is one JSON file, changed only while holding an exclusive lock on a file
//! beside it (`<ledger>.lock`), and replaced whole by renaming over it a new file made
//! exclusively under a random name beside it, so a reader never sees half a write and a
//! driver killed while writing leaves the old ledger intact:
//!
//! ```json
//! { "version": 3,
//!   "runs": [ { "run": "run-1a2b", "owner": { "pid": 4242, "start_time": 881234, "uid": 1000 },
//!               "instance": 0,
//!               "bundles": [ { "resources": { "CPU": 1, "GPU": 1 }, "devices": { "GPU": ["0"] } } ],
//!               "members": [ { "pid": 4250, "start_time": 881290 } ] } ] }
//! ```
//!
//! # Which entries count
//!
//! While a [`Ledger`] lives, its process holds a shared lock on a third file,
//! `<ledger>.live`. An entry holds resources only while its process runs, started when the
//! entry says, runs as the user the entry says, and holds that lock (as `/proc/locks`
//! shows; where it cannot be read, the first three decide). An entry whose process is gone
//! holds resources still while one of its members runs: the run's agents, each recorded by
//! its pid and start time once the run has started it and removed once it has ended and
//! been reaped. A member counts only while its process runs, started when the entry says,
//! runs as the user the entry says (as `/proc/<pid>/status` shows; where it cannot be
//! read, it does not count), and holds the liveness file locked as the owner does (each
//! agent takes that lock when it starts, from `TRAINYARD_LEDGER_LIVE`): so what a run
//! holds, its GPUs among them, goes to no other run
//! while its workers stop their tasks, even when its driver was SIGKILLed. Every other
//! entry is dropped by the next run that takes the lock: a run's entries go away however it
//! ends, SIGKILL included, once its agents are gone, and an entry someone wrote by hand
//! (naming pid 1, or another user's process, or a process that is no run of this ledger)
//! holds nothing and is dropped with a warning; a member naming a process that is no agent
//! of a run (pid 1), or one of another user than the entry's, keeps nothing.
//!
//! # Where it is
//!
//! [`LedgerLocation::from_env`]: `$TRAINYARD_LEDGER` when set (`system` for
//! [`SYSTEM_LEDGER`]), else `$XDG_RUNTIME_DIR/trainyard/ledger`, else
//! `~/.cache/trainyard/<host>/ledger`, else `/run/user/<uid>/trainyard/ledger` (never a shared
//! temporary directory, where another user could make the directory first and so stop
//! every run of this user). A missing directory is made with mode 0700, but for the
//! shared one's. A directory that is a symbolic link, or that every user may write to
//! without the sticky bit, is refused; so is a per-user one (the two defaults) that is not
//! this user's or that lets others in (any group or other bit): another user may have put it
//! there.
//!
//! # Sharing between users
//!
//! Users of a machine share a ledger through a directory of a group they are all in, made
//! setgid so that every file in it belongs to that group. An administrator makes it:
//!
//! ```text
//! groupadd trainyard && usermod -aG trainyard alice    # and each user of trainyard
//! install -d -m 2770 -g trainyard /var/lib/trainyard   # 2775 lets others read it too
//! ```
//!
//! and the users set `TRAINYARD_LEDGER=system` (or a path in such a directory). In a setgid
//! directory the ledger's files are made with mode 0660 (whatever the umask), elsewhere with
//! mode 0600. No link in the ledger's directory is followed, and a FIFO there hangs no run.
//!
//! What this guarantees against a member of the group, who can write the ledger as any run
//! does: an entry that names no live run of the ledger as the user it runs as (pid 1,
//! another user's process, a dead one) holds nothing (see above); a file that is no ledger
//! (not JSON, not readable, a link, larger than 16 MiB, version 0) is moved aside to
//! `<ledger>.corrupt-<unix time>` with a warning and a fresh ledger starts, so no run stops;
//! a run waits for a lock at most [`LOCK_TIMEOUT`] and then fails with
//! [`LedgerError::Busy`], naming the holder's pid and uid. What it does not: such a member
//! can remove or change the entries of live runs (and so be given what another run holds),
//! can forge entries naming a live run of the ledger (its own or another's) or, as members,
//! live agents of such runs, which hold what they say while that run or those agents live,
//! and can keep runs from starting by holding a lock or
//! by putting a file nobody can open in a lock's place. Sharing a ledger means trusting the
//! group with the machine's reservations; the checks keep a hand-made, stale or damaged
//! entry or file from holding resources or stopping runs, and a run from waiting without
//! end.
//!
//! # Versions
//!
//! A ledger of a newer format is left alone and refused ([`LedgerError::NewerFormat`]).
//! Format 3 added the entries' members: one of format 2 is read as format 3 without them
//! (its entries are believed by the same rules) and written back as format 3. An older
//! trainyard leaves a ledger of format 3 alone and refuses it, where it would have taken an
//! entry with members for a damaged file and moved the whole ledger aside. One of format 1
//! (without users or the liveness lock) is replaced when none of its runs still runs, and
//! refused while one does ([`LedgerError::OlderFormatInUse`]): its entries cannot be
//! checked as these are, and dropping them would give away what they hold.

mod directory;
mod file;
mod lock;
mod owner;
mod share;

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::Flock;
use serde::{Deserialize, Serialize};
use trainyard_runtime::reservations::HeldBundle;

pub use directory::DirectoryProblem;
pub use lock::LockHolder;
pub use owner::{Member, Owner};
pub(crate) use share::{Membership, free_changed, join, release, release_now, settle, wait_ready};
pub use share::{holder, shortage};

/// The variable that says where the ledger is.
pub const LEDGER_ENV: &str = "TRAINYARD_LEDGER";

/// The system-wide ledger, for a machine whose users share it: `TRAINYARD_LEDGER=system`.
/// Its directory is made by an administrator, setgid and of the group whose members share
/// it: `install -d -m 2770 -g trainyard /var/lib/trainyard` (see the [module docs](self)).
pub const SYSTEM_LEDGER: &str = "/var/lib/trainyard/ledger";

/// The version of the file format this code writes and reads.
const FORMAT_VERSION: u32 = 3;

/// How long a run waits for the ledger's lock before it gives up: far longer than anyone
/// holds it (a read and a write of a small file).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// ([`LedgerLocation::user_default`]).
    #[must_use]
    pub fn from_env() -> Self {
        match std::env::var_os(LEDGER_ENV) {
            Some(value) if value == "system" => Self::At(PathBuf::from(SYSTEM_LEDGER)),
            Some(value) if !value.is_empty() => Self::At(PathBuf::from(value)),
            _ => Self::At(Self::user_default()),
        }
    }

    /// The user's own ledger, in a directory no other user can make or change:
    /// `$XDG_RUNTIME_DIR/trainyard/ledger`; else `~/.cache/trainyard/<host>/ledger` (a home
    /// shared between machines keeps one ledger per machine); else, without a home,
    /// `/run/user/<uid>/trainyard/ledger`. Never a shared temporary directory, where another
    /// user could make the directory first and so stop every run of this user.
    #[must_use]
    pub fn user_default() -> PathBuf {
        user_default_and_why().0
    }
}

/// Says once, as a warning, why the ledger at `path` is not under `$XDG_RUNTIME_DIR` when
/// it is the user's own one and that is so: when the ledger is made there, by the first run
/// on this host (later runs find it and say nothing).
fn say_why_not_in_runtime_dir(path: &Path) {
    let (own, fallback) = user_default_and_why();
    if let Some(why) = fallback.filter(|_| own == path && !path.exists()) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "{why}: this user's ledger is in `{}` (set {LEDGER_ENV} to put it elsewhere)",
                path.display()
            );
        });
    }
}

/// [`LedgerLocation::user_default`], and why it is not under `$XDG_RUNTIME_DIR` when it is
/// not.
fn user_default_and_why() -> (PathBuf, Option<&'static str>) {
    let (dir, why) = trainyard_sys::private::user_state_dir();
    (dir.join("ledger"), why)
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
    /// Its other processes (agents), which keep it after its owner has gone while one of
    /// them runs as the owner's user.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub members: BTreeSet<Member>,
}

impl RunEntry {
    fn is(&self, owner: Owner, instance: u64) -> bool {
        self.owner == owner && self.instance == instance
    }

    /// Whether one of its members runs as its owner's user and is one of `holders`, the
    /// processes that hold the liveness file ([`Member::keeps`]).
    fn has_live_member(&self, holders: Option<&BTreeSet<u32>>) -> bool {
        self.members
            .iter()
            .any(|member| member.keeps(self.owner.uid, holders))
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

    /// Drops the entries that cannot be believed (their owner runs as another user, or is
    /// no run of this ledger: see [`Owner::check`]; or it is gone, and so are its members:
    /// see [`Member::keeps`]); how many. `live` is the ledger's liveness file.
    fn reclaim(&mut self, live: &Path) -> usize {
        let runs = live_holders(live);
        let before = self.runs.len();
        self.runs
            .retain(|entry| match entry.owner.check(runs.as_ref()) {
                Ok(()) => true,
                Err(owner::Untrusted::Gone) => entry.has_live_member(runs.as_ref()),
                Err(why) => {
                    tracing::warn!(
                        ledger_run = entry.run,
                        pid = entry.owner.pid,
                        uid = entry.owner.uid,
                        %why,
                        "a ledger entry that cannot be believed holds nothing: dropped"
                    );
                    false
                }
            });
        before - self.runs.len()
    }
}

/// The processes that hold the liveness file `live` locked: the runs of the ledger.
/// `None` when `/proc/locks` cannot tell (entries are then checked by process alone).
fn live_holders(live: &Path) -> Option<BTreeSet<u32>> {
    let meta = match std::fs::symlink_metadata(live) {
        Ok(meta) if meta.is_file() => meta,
        // No run holds a file that is not there (or not a file).
        _ => return Some(BTreeSet::new()),
    };
    match lock::holders(lock::FileId::of_metadata(&meta)) {
        Ok(holders) => Some(holders),
        Err(error) => {
            tracing::warn!(%error, "/proc/locks cannot be read: ledger entries are checked by their process alone");
            None
        }
    }
}

/// Why the ledger cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// Its directory cannot be made or examined.
    #[error("cannot create the ledger's directory `{}`", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The shared ledger's directory is missing: only an administrator makes it.
    #[error(
        "the shared ledger's directory `{}` does not exist; an administrator makes it, setgid and of the group of trainyard's users: `install -d -m 2770 -g trainyard {}`",
        path.display(), path.display()
    )]
    NoSharedDirectory {
        /// The directory.
        path: PathBuf,
    },
    /// The ledger's directory is one others could slip files into or swap.
    #[error("the ledger's directory `{}` is {problem}; {accepted}", path.display())]
    UnsafeDirectory {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: DirectoryProblem,
        /// What is accepted.
        accepted: &'static str,
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
    /// The file is a ledger of a newer format, which this version leaves alone.
    #[error(
        "the ledger `{}` is in format {found}, newer than this trainyard's ({FORMAT_VERSION}); upgrade trainyard, or set {LEDGER_ENV} to a ledger elsewhere",
        path.display()
    )]
    NewerFormat {
        /// The file.
        path: PathBuf,
        /// Its format.
        found: u32,
    },
    /// The file is a ledger of format 1 whose runs still run.
    #[error(
        "the ledger `{}` is in format 1 and held by runs of an older trainyard (pid {}); let them finish, or set {LEDGER_ENV} to a ledger elsewhere",
        path.display(), pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    OlderFormatInUse {
        /// The file.
        path: PathBuf,
        /// The runs' processes.
        pids: Vec<u32>,
    },
    /// Another process held a lock of the ledger for longer than [`LOCK_TIMEOUT`].
    #[error(
        "the ledger `{}` stayed locked for {waited:?}{}: its lock `{}` is held by a process that does not let go",
        path.display(),
        holder.map_or_else(String::new, |holder| format!(" by {holder}")),
        lock.display()
    )]
    Busy {
        /// The file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// How long this run tried.
        waited: Duration,
        /// Who holds the lock, when `/proc/locks` tells.
        holder: Option<LockHolder>,
    },
}

/// One run's handle on the ledger: it reads what the others hold and records what it holds,
/// each time under the lock. While it lives, it holds the ledger's liveness file locked
/// (shared), which is what makes its entry believed. See the [module docs](self).
#[derive(Debug)]
pub struct Ledger {
    files: Files,
    run: String,
    owner: Owner,
    instance: u64,
    /// The run's agents, recorded in its entry.
    members: Mutex<Members>,
    /// What the file has of the changes to the members: held while they are written, so
    /// that one write records every change made before it.
    recorded: Mutex<Recorded>,
    _live: Flock<File>,
}

/// How many changes to the members the file has, and the last write of them that failed:
/// the changes it was to record, and why.
#[derive(Debug, Default)]
struct Recorded {
    changes: u64,
    failed: Option<(u64, String)>,
}

/// The run's agents, and how many changes were made to them.
#[derive(Debug, Default)]
struct Members {
    set: BTreeSet<Member>,
    changes: u64,
}

/// The ledger's files, and their mode.
#[derive(Debug, Clone)]
struct Files {
    path: PathBuf,
    lock: PathBuf,
    live: PathBuf,
    mode: u32,
}

impl Files {
    /// Prepares the ledger's directory ([`directory::prepare`]) and names the files.
    fn new(path: &Path) -> Result<Self, LedgerError> {
        let sharing = directory::prepare(path)?;
        let beside = |suffix: &str| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        };
        Ok(Self {
            path: path.to_owned(),
            lock: beside(".lock"),
            live: beside(".live"),
            mode: sharing.mode(),
        })
    }

    /// Runs `change` on the ledger's contents under its lock (waiting for it up to
    /// [`LOCK_TIMEOUT`]), after dropping the entries that cannot be believed, and writes
    /// the contents back when they changed.
    fn locked<T>(&self, change: impl FnOnce(&mut Contents) -> T) -> Result<T, LedgerError> {
        let lock_file = file::open_lock(&self.lock, self.mode)?;
        let _guard = lock::acquire(lock_file, true, &self.lock, &self.path)?;
        let before = file::read(&self.path)?;
        let mut contents = before.clone();
        contents.reclaim(&self.live);
        let answer = change(&mut contents);
        if contents != before {
            file::write(&self.path, &contents, self.mode).map_err(|source| LedgerError::Io {
                path: self.path.clone(),
                source,
            })?;
        }
        Ok(answer)
    }
}

impl Ledger {
    /// The ledger at `path` for run `run` of this process; makes its directory if needed
    /// (not the shared [`SYSTEM_LEDGER`]'s) and locks its liveness file.
    ///
    /// # Errors
    /// [`LedgerError::Directory`], [`LedgerError::NoSharedDirectory`],
    /// [`LedgerError::UnsafeDirectory`], [`LedgerError::Busy`] when another process holds
    /// the liveness file exclusively, or [`LedgerError::Io`].
    pub fn open(path: &Path, run: &str) -> Result<Self, LedgerError> {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        say_why_not_in_runtime_dir(path);
        let files = Files::new(path)?;
        let owner = Owner::this_process().map_err(|source| LedgerError::Io {
            path: PathBuf::from("/proc/self/status"),
            source,
        })?;
        let live = file::open_lock(&files.live, files.mode)?;
        let live = lock::acquire(live, false, &files.live, path)?;
        Ok(Self {
            files,
            run: run.to_owned(),
            owner,
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            members: Mutex::new(Members::default()),
            recorded: Mutex::new(Recorded::default()),
            _live: live,
        })
    }

    /// The ledger file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.files.path
    }

    /// Its liveness file, which every process of a live run holds locked: the agents hold
    /// it from [`trainyard_wire::config::LEDGER_LIVE`].
    #[must_use]
    pub fn live_path(&self) -> &Path {
        &self.files.live
    }

    /// Under the lock: drops the entries that cannot be believed, hands the others' live
    /// entries to `change`, and records what it returns as all this run holds, with the
    /// run's members (nothing removes the run's entry).
    ///
    /// # Errors
    /// [`LedgerError::Io`], [`LedgerError::Busy`], [`LedgerError::NewerFormat`] or
    /// [`LedgerError::OlderFormatInUse`]; the ledger is unchanged then.
    pub fn update<T>(
        &self,
        change: impl FnOnce(&[RunEntry]) -> (Vec<HeldBundle>, T),
    ) -> Result<T, LedgerError> {
        self.files.locked(|contents| {
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
                    members: self.members(),
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

    /// Records `member`, a process this run has started (an agent, running as this
    /// process's user), in the run's entry: once this process has gone, the entry holds
    /// what it holds while a member runs.
    ///
    /// # Errors
    /// As [`Ledger::update`]; the member is recorded with the next update then.
    pub fn add_member(&self, member: Member) -> Result<(), LedgerError> {
        self.change_members(|set| {
            set.insert(member);
        })
    }

    /// Removes `member` (once it has ended and been reaped) from the run's entry.
    ///
    /// # Errors
    /// As [`Ledger::update`]; the member is removed with the next update then.
    pub fn remove_member(&self, member: Member) -> Result<(), LedgerError> {
        self.change_members(|set| {
            set.remove(&member);
        })
    }

    /// The run's members now.
    fn members(&self) -> BTreeSet<Member> {
        crate::lock(&self.members).set.clone()
    }

    /// Changes the run's members, and returns once the ledger has the change: written by
    /// this call, or by another made meanwhile (the agents of a run join and leave at about
    /// the same time, and each write reads, checks and writes the whole ledger, so one
    /// write records what many calls waited on).
    fn change_members(
        &self,
        change: impl FnOnce(&mut BTreeSet<Member>),
    ) -> Result<(), LedgerError> {
        let this = {
            let mut members = crate::lock(&self.members);
            change(&mut members.set);
            members.changes += 1;
            members.changes
        };
        let mut recorded = crate::lock(&self.recorded);
        if recorded.changes >= this {
            return Ok(());
        }
        // A write that was to record this change failed while this call waited: the same
        // write now would wait as long for the same lock; say why it failed instead.
        if let Some((attempted, why)) = &recorded.failed {
            if *attempted >= this {
                return Err(LedgerError::Io {
                    path: self.files.path.clone(),
                    source: io::Error::other(why.clone()),
                });
            }
        }
        let attempting = crate::lock(&self.members).changes;
        let mut taken = attempting;
        let written = self.files.locked(|contents| {
            // Read under the file's lock, as `update` does, so neither writes an older set.
            let members = crate::lock(&self.members);
            taken = members.changes;
            for entry in &mut contents.runs {
                if entry.is(self.owner, self.instance) {
                    entry.members.clone_from(&members.set);
                }
            }
        });
        match written {
            Ok(()) => {
                *recorded = Recorded {
                    changes: taken,
                    failed: None,
                };
                Ok(())
            }
            Err(error) => {
                let why = trainyard_resources::ErrorChain(&error).to_string();
                recorded.failed = Some((attempting, why));
                Err(error)
            }
        }
    }
}

/// The live runs of the ledger at `path` (dropping from it the entries that cannot be
/// believed on the way).
///
/// # Errors
/// As [`Ledger::open`] and [`Ledger::update`].
pub fn live_runs(path: &Path) -> Result<Vec<RunEntry>, LedgerError> {
    Files::new(path)?.locked(|contents| contents.runs.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry of user `uid` whose owner is gone (no process has that pid), with `members`.
    fn orphan(uid: u32, members: &[Member]) -> RunEntry {
        RunEntry {
            run: "orphan".to_owned(),
            owner: Owner {
                pid: u32::MAX - 1,
                start_time: 1,
                uid,
            },
            instance: 0,
            bundles: Vec::new(),
            members: members.iter().copied().collect(),
        }
    }

    /// The entries of `runs` that [`Contents::reclaim`] keeps, this process holding the
    /// liveness file locked as an agent does.
    fn kept(runs: Vec<RunEntry>) -> Vec<String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let live = dir.path().join("ledger.live");
        let file = std::fs::File::create(&live).expect("the liveness file");
        let _held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock)
            .map_err(|(_, errno)| errno)
            .expect("a shared lock");
        let mut contents = Contents {
            version: FORMAT_VERSION,
            runs,
        };
        contents.reclaim(&live);
        contents.runs.into_iter().map(|entry| entry.run).collect()
    }

    fn this_process() -> (Member, u32) {
        let me = Owner::this_process().expect("/proc/self");
        let member = Member {
            pid: me.pid,
            start_time: me.start_time,
        };
        (member, me.uid)
    }

    #[test]
    fn an_entry_whose_owner_is_gone_is_kept_while_a_member_of_its_user_runs() {
        let (me, uid) = this_process();
        let gone = Member {
            start_time: me.start_time.wrapping_add(1),
            ..me
        };
        let named = |run: &str, entry: RunEntry| RunEntry {
            run: run.to_owned(),
            ..entry
        };
        let runs = vec![
            named("alive-member", orphan(uid, &[gone, me])),
            named("gone-member", orphan(uid, &[gone])),
            named("no-member", orphan(uid, &[])),
        ];
        assert_eq!(kept(runs), ["alive-member"]);
    }

    #[test]
    fn a_member_of_another_user_than_its_entry_keeps_nothing() {
        let (me, uid) = this_process();
        let init = Member {
            pid: 1,
            start_time: trainyard_sys::procfs::read_stat(1)
                .expect("/proc/1/stat")
                .and_then(|stat| stat.start_time)
                .expect("a start time"),
        };
        let init_uid = owner::real_uid(1).expect("/proc/1/status").expect("a uid");
        let runs = vec![
            orphan(uid.wrapping_add(1), &[me]),
            orphan(init_uid.wrapping_add(1), &[init]),
        ];
        assert!(kept(runs).is_empty());
    }

    #[test]
    fn members_join_the_runs_entry_and_leave_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger");
        let ledger = Ledger::open(&path, "members").expect("opened");
        let (me, _) = this_process();
        ledger.add_member(me).expect("added");
        assert!(
            live_runs(&path).expect("runs").is_empty(),
            "a run that holds nothing has no entry"
        );
        let bundle = HeldBundle {
            resources: "CPU=1".parse().expect("resources"),
            devices: std::collections::BTreeMap::new(),
        };
        ledger.update(|_| (vec![bundle], ())).expect("updated");
        let members = |path: &Path| -> Vec<BTreeSet<Member>> {
            live_runs(path)
                .expect("runs")
                .into_iter()
                .map(|entry| entry.members)
                .collect()
        };
        assert_eq!(members(&path), [BTreeSet::from([me])]);
        let other = Member {
            start_time: me.start_time.wrapping_add(1),
            ..me
        };
        ledger.add_member(other).expect("added");
        assert_eq!(members(&path), [BTreeSet::from([me, other])]);
        ledger.remove_member(me).expect("removed");
        ledger.remove_member(other).expect("removed");
        assert_eq!(members(&path), [BTreeSet::new()]);
    }

    #[test]
    fn members_that_join_at_once_are_each_in_the_ledger_when_their_join_returns() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger");
        let ledger = Ledger::open(&path, "members").expect("opened");
        let bundle = HeldBundle {
            resources: "CPU=1".parse().expect("resources"),
            devices: std::collections::BTreeMap::new(),
        };
        ledger.update(|_| (vec![bundle], ())).expect("updated");
        let (me, _) = this_process();
        let recorded = |member: Member| {
            live_runs(&path)
                .expect("runs")
                .iter()
                .any(|entry| entry.members.contains(&member))
        };
        let joined: Vec<Member> = std::thread::scope(|scope| {
            let joins: Vec<_> = (0..16u64)
                .map(|n| {
                    let (ledger, recorded) = (&ledger, &recorded);
                    scope.spawn(move || {
                        let member = Member {
                            start_time: me.start_time.wrapping_add(n),
                            ..me
                        };
                        ledger.add_member(member).expect("added");
                        assert!(recorded(member), "in the ledger once its join returned");
                        member
                    })
                })
                .collect();
            joins
                .into_iter()
                .map(|join| join.join().expect("joined"))
                .collect()
        });
        assert_eq!(ledger.members().len(), 16);
        std::thread::scope(|scope| {
            for member in &joined {
                let (ledger, recorded) = (&ledger, &recorded);
                scope.spawn(move || {
                    ledger.remove_member(*member).expect("removed");
                    assert!(!recorded(*member), "gone once its leave returned");
                });
            }
        });
        assert!(live_runs(&path).expect("runs")[0].members.is_empty());
    }
}
