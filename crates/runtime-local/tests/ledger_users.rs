//! The ledger between users: two real Unix users of one group share a ledger in a setgid
//! directory, and neither can stop the other's runs by corrupting it, by holding its lock,
//! or by forging entries; nor can one squat another's per-user ledger directory.
//!
//! The second user is this test binary run again as another uid (and the shared gid), doing
//! one action named in its environment. Changing uid needs root: elsewhere these tests say
//! `SKIP` and pass.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use trainyard_runtime::reservations::HeldBundle;
use trainyard_runtime_local::ledger::{
    DirectoryProblem, LOCK_TIMEOUT, Ledger, LedgerError, LedgerLocation, Owner, RunEntry, live_runs,
};

/// The action the re-run test binary takes.
const ACTION_ENV: &str = "TRAINYARD_LEDGER_USERS_ACTION";
/// The ledger it acts on.
const PATH_ENV: &str = "TRAINYARD_LEDGER_USERS_PATH";
/// The pid a forged entry names as run by another user.
const VICTIM_ENV: &str = "TRAINYARD_LEDGER_USERS_VICTIM";
/// The group both users are in.
const GROUP: u32 = 65533;
/// The first unprivileged user.
const ALICE: u32 = 65533;
/// The second unprivileged user.
const MALLORY: u32 = 65534;
/// The bound on every wait for a child.
const LIMIT: Duration = Duration::from_secs(60);
/// What marks the actors' words (the test harness prints lines of its own).
const SAYS: &str = "actor: ";

// ---- the second user's side ----

fn gpu(id: &str) -> HeldBundle {
    HeldBundle {
        resources: "CPU=1,GPU=1".parse().expect("resources"),
        devices: BTreeMap::from([("GPU".to_owned(), vec![id.to_owned()])]),
    }
}

/// Waits for the parent to close stdin: the actor holds what it holds until then.
fn until_told() {
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// The entries a forger writes: pid 1 as root with its true start time, the test's own
/// process claimed as the forger's uid, and the forger itself (alive, its true uid, but no
/// run of the ledger); each holds a GPU.
fn forged(victim: u32) -> serde_json::Value {
    let start = |pid: u32| {
        trainyard_sys::procfs::read_stat(pid)
            .expect("stat")
            .and_then(|stat| stat.start_time)
            .expect("start time")
    };
    let me = Owner::this_process().expect("me");
    let entries = [
        (
            "pid-1",
            Owner {
                pid: 1,
                start_time: start(1),
                uid: 0,
            },
            "0",
        ),
        (
            "someone-elses-pid",
            Owner {
                pid: victim,
                start_time: start(victim),
                uid: me.uid,
            },
            "1",
        ),
        ("not-a-run", me, "2"),
    ];
    let runs: Vec<RunEntry> = entries
        .into_iter()
        .map(|(run, owner, id)| RunEntry {
            run: run.to_owned(),
            owner,
            instance: 0,
            bundles: vec![gpu(id)],
            members: std::collections::BTreeSet::new(),
        })
        .collect();
    serde_json::json!({ "version": 2, "runs": runs })
}

fn act(action: &str, path: &Path) -> Result<(), String> {
    let say = |what: &str| println!("{SAYS}{what}");
    match action {
        "hold" => {
            let ledger = Ledger::open(path, "held").map_err(|e| e.to_string())?;
            ledger
                .update(|_| (vec![gpu("0")], ()))
                .map_err(|e| e.to_string())?;
            say("held");
            until_told();
            ledger.release().map_err(|e| e.to_string())
        }
        "list" => match live_runs(path) {
            Ok(runs) => {
                for run in runs {
                    say(&format!("run {} uid {}", run.run, run.owner.uid));
                }
                say("listed");
                Ok(())
            }
            Err(error) => {
                say(&format!("error {error}"));
                Ok(())
            }
        },
        "garbage" => {
            fs::write(path, "{ \"version\": 2, \"runs\": [ garbage").map_err(|e| e.to_string())?;
            say("written");
            Ok(())
        }
        "forge" => {
            let victim: u32 = std::env::var(VICTIM_ENV)
                .ok()
                .and_then(|pid| pid.parse().ok())
                .ok_or("no victim pid")?;
            let text = serde_json::to_vec(&forged(victim)).map_err(|e| e.to_string())?;
            fs::write(path, text).map_err(|e| e.to_string())?;
            say("forged");
            until_told();
            Ok(())
        }
        "lock" => {
            let mut lock_path = path.as_os_str().to_owned();
            lock_path.push(".lock");
            let file = fs::File::open(&lock_path).map_err(|e| e.to_string())?;
            let mut lock = fd_lock::RwLock::new(file);
            let _guard = lock.write().map_err(|e| e.to_string())?;
            say("locked");
            until_told();
            Ok(())
        }
        "squat" => {
            // `path` is the per-user directory to squat: a link to the victim's `target`.
            let target = path.with_file_name("target");
            std::os::unix::fs::symlink(&target, path).map_err(|e| e.to_string())?;
            say("squatted");
            Ok(())
        }
        "mkdir" => {
            fs::create_dir(path).map_err(|e| e.to_string())?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o700))
                .map_err(|e| e.to_string())?;
            say("made");
            Ok(())
        }
        "open-default" => {
            match Ledger::open(&LedgerLocation::user_default(), "victim") {
                Ok(_) => say("opened"),
                Err(error) => say(&format!("error {error} | {error:?}")),
            }
            Ok(())
        }
        other => Err(format!("no action `{other}`")),
    }
}

#[test]
fn acting_user() {
    let (Ok(action), Some(path)) = (std::env::var(ACTION_ENV), std::env::var_os(PATH_ENV)) else {
        return; // Run as a child of the tests below only.
    };
    if let Err(problem) = act(&action, Path::new(&path)) {
        panic!("{action}: {problem}");
    }
}

// ---- the first user's side ----

/// An actor: the test binary run again, as `user` (and [`GROUP`]) when given.
struct Actor {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Actor {
    fn start(action: &str, path: &Path, user: Option<u32>, env: &[(&str, &OsStr)]) -> Self {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args(["--exact", "acting_user", "--nocapture", "--test-threads=1"])
            .env(ACTION_ENV, action)
            .env(PATH_ENV, path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        if let Some(uid) = user {
            command.uid(uid).gid(GROUP);
        }
        let mut child = command.spawn().expect("the actor starts");
        let stdout = child.stdout.take().expect("piped");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness may start the line (`test acting_user ... `).
                if let Some((_, said)) = line.split_once(SAYS) {
                    if send.send(said.to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The actor's next line.
    fn next(&self) -> String {
        match self.lines.recv_timeout(LIMIT) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("the actor said nothing for {LIMIT:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("the actor ended without a word"),
        }
    }

    /// Lets the actor go on (closes its stdin) and waits for it to succeed.
    fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(status.success(), "the actor failed: {status}");
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("the actor did not end within {LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Actor {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether this process may act as other users; `SKIP` said when not (and, under
/// `CI=true`, a failure unless `TRAINYARD_TWO_USERS_SKIP` says why).
fn root() -> bool {
    trainyard_test_support::users::can_act_as_others()
}

/// A shared ledger as an administrator makes it: a setgid directory of [`GROUP`], mode
/// 2770, that other users can reach.
fn shared_ledger() -> (tempfile::TempDir, PathBuf) {
    let top = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(top.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = top.path().join("trainyard");
    fs::create_dir(&dir).expect("dir");
    std::os::unix::fs::chown(&dir, Some(0), Some(GROUP)).expect("chown");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o2770)).expect("chmod");
    (top, dir.join("ledger"))
}

fn runs(path: &Path) -> Vec<(String, u32)> {
    live_runs(path)
        .expect("the ledger is readable")
        .into_iter()
        .map(|run| (run.run, run.owner.uid))
        .collect()
}

#[test]
fn two_users_of_one_group_share_the_ledger_and_its_files_are_the_groups() {
    if !root() {
        return;
    }
    let (_top, path) = shared_ledger();
    let alice = Actor::start("hold", &path, Some(ALICE), &[]);
    assert_eq!(alice.next(), "held");
    let mallory = Actor::start("list", &path, Some(MALLORY), &[]);
    assert_eq!(mallory.next(), format!("run held uid {ALICE}"));
    assert_eq!(mallory.next(), "listed");
    mallory.finish();
    for suffix in ["", ".lock", ".live"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let meta = fs::metadata(&file).expect("the ledger's file");
        assert_eq!(
            (meta.mode() & 0o777, meta.gid()),
            (0o660, GROUP),
            "ledger{suffix} is the group's"
        );
    }
    assert_eq!(runs(&path), [("held".to_owned(), ALICE)]);
    alice.finish();
    assert!(runs(&path).is_empty(), "released");
}

#[test]
fn garbage_written_by_another_user_is_moved_aside_and_the_next_run_goes_on() {
    if !root() {
        return;
    }
    let (_top, path) = shared_ledger();
    let ledger = Ledger::open(&path, "mine").expect("open");
    ledger.update(|_| (vec![gpu("0")], ())).expect("recorded");
    let mallory = Actor::start("garbage", &path, Some(MALLORY), &[]);
    assert_eq!(mallory.next(), "written");
    mallory.finish();

    let others = ledger
        .update(|others| (vec![gpu("0")], others.to_vec()))
        .expect("a corrupt ledger stops no run");
    assert!(others.is_empty(), "{others:?}");
    assert_eq!(runs(&path), [("mine".to_owned(), 0)], "recorded afresh");
    let dir = path.parent().expect("dir");
    let aside: Vec<PathBuf> = fs::read_dir(dir)
        .expect("list")
        .map(|entry| entry.expect("entry").path())
        .filter(|p| p.to_string_lossy().contains("ledger.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "moved aside, not lost: {aside:?}");
    assert!(
        fs::read_to_string(&aside[0])
            .expect("kept")
            .contains("garbage")
    );
    // The fresh ledger is still the group's.
    let mallory = Actor::start("list", &path, Some(MALLORY), &[]);
    assert_eq!(mallory.next(), "run mine uid 0");
    assert_eq!(mallory.next(), "listed");
    mallory.finish();
    ledger.release().expect("released");
}

#[test]
fn another_user_holding_the_lock_forever_gets_a_busy_error_naming_them_not_a_hang() {
    if !root() {
        return;
    }
    let (_top, path) = shared_ledger();
    assert!(runs(&path).is_empty(), "the lock file exists");
    let mallory = Actor::start("lock", &path, Some(MALLORY), &[]);
    assert_eq!(mallory.next(), "locked");
    let started = Instant::now();
    let (send, receive) = std::sync::mpsc::channel();
    let waiter = {
        let path = path.clone();
        std::thread::spawn(move || {
            let _ = send.send(live_runs(&path));
        })
    };
    let outcome = receive
        .recv_timeout(LOCK_TIMEOUT + LIMIT)
        .expect("the waiter gives up instead of hanging");
    let waited = started.elapsed();
    waiter.join().expect("the waiter ends");
    let error = outcome.expect_err("the ledger is held");
    let LedgerError::Busy { holder, .. } = &error else {
        panic!("expected Busy, got {error:?}");
    };
    let holder = holder.expect("/proc/locks names the holder");
    assert_eq!(
        (holder.pid, holder.uid),
        (mallory.child.id(), Some(MALLORY))
    );
    assert!(
        waited >= LOCK_TIMEOUT && waited < LOCK_TIMEOUT + Duration::from_secs(5),
        "gave up after {waited:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains(&format!("pid {} (uid {MALLORY})", holder.pid))
            && text.contains("ledger.lock"),
        "{text}"
    );
    mallory.finish();
    assert!(runs(&path).is_empty(), "usable once let go");
}

#[test]
fn forged_entries_for_pid_1_another_users_process_or_no_run_hold_nothing() {
    if !root() {
        return;
    }
    let (_top, path) = shared_ledger();
    let ledger = Ledger::open(&path, "mine").expect("open");
    let me = std::process::id().to_string();
    let mallory = Actor::start(
        "forge",
        &path,
        Some(MALLORY),
        &[(VICTIM_ENV, OsStr::new(&me))],
    );
    assert_eq!(mallory.next(), "forged");
    let text = fs::read_to_string(&path).expect("the forged ledger");
    assert!(
        text.contains("pid-1") && text.contains("not-a-run"),
        "{text}"
    );
    let others = ledger
        .update(|others| (vec![gpu("0"), gpu("1"), gpu("2")], others.to_vec()))
        .expect("updated");
    assert!(others.is_empty(), "forged entries hold nothing: {others:?}");
    let text = fs::read_to_string(&path).expect("the ledger");
    for forged in ["pid-1", "someone-elses-pid", "not-a-run"] {
        assert!(!text.contains(forged), "{forged} is dropped: {text}");
    }
    // A real run of the other user, by contrast, holds what it records.
    ledger.release().expect("released");
    mallory.finish();
    let honest = Actor::start("hold", &path, Some(MALLORY), &[]);
    assert_eq!(honest.next(), "held");
    assert_eq!(runs(&path), [("held".to_owned(), MALLORY)]);
    honest.finish();
}

/// Opens the per-user ledger of this (root) user with the temporary directory `tmp`, the
/// home `home` and no `XDG_RUNTIME_DIR`: the actor's answer.
fn open_default(tmp: &Path, home: &Path) -> String {
    let victim = Actor::start(
        "open-default",
        Path::new("unused"),
        None,
        &[
            ("TMPDIR", tmp.as_os_str()),
            ("HOME", home.as_os_str()),
            ("XDG_RUNTIME_DIR", OsStr::new("")),
        ],
    );
    let said = victim.next();
    victim.finish();
    said
}

/// The directory of the per-user ledger under `home`.
fn per_user_dir(home: &Path) -> PathBuf {
    let host = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("a UTF-8 hostname");
    home.join(".cache/trainyard").join(host)
}

#[test]
fn a_directory_another_user_made_in_the_temporary_directory_stops_no_run() {
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o1777)).expect("chmod");
    let home = tempfile::tempdir().expect("temp dir");
    // Where the ledger used to fall back to without XDG_RUNTIME_DIR, made first by another
    // user, who can neither be made to remove it nor be removed from a sticky directory.
    let squatted = tmp.path().join("trainyard-0");
    let squatter = Actor::start("mkdir", &squatted, Some(MALLORY), &[]);
    assert_eq!(squatter.next(), "made");
    squatter.finish();
    assert_eq!(fs::metadata(&squatted).expect("made").uid(), MALLORY);

    assert_eq!(open_default(tmp.path(), home.path()), "opened");
    let dir = per_user_dir(home.path());
    let meta = fs::symlink_metadata(&dir).expect("the ledger's directory");
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o700, 0));
    assert!(
        fs::read_dir(&squatted).expect("list").next().is_none(),
        "nothing of this user's is in the squatted directory"
    );
}

#[test]
fn a_squatted_per_user_directory_is_refused() {
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    // A home others may write to (as a careless one is).
    let home = tempfile::tempdir().expect("temp dir");
    let mine = per_user_dir(home.path());
    let above = mine.parent().expect("above");
    fs::create_dir_all(above).expect("dir");
    fs::set_permissions(above, fs::Permissions::from_mode(0o1777)).expect("chmod");

    // A link put in its place by another user, to a directory of this user's.
    let target = above.join("target");
    fs::create_dir(&target).expect("dir");
    let squatter = Actor::start("squat", &mine, Some(MALLORY), &[]);
    assert_eq!(squatter.next(), "squatted");
    squatter.finish();
    let said = open_default(tmp.path(), home.path());
    assert!(
        said.contains(&format!("{:?}", DirectoryProblem::Symlink))
            && said.contains(&mine.display().to_string()),
        "{said}"
    );
    assert!(
        fs::read_dir(&target).expect("target").next().is_none(),
        "nothing was made through the link"
    );
    fs::remove_file(&mine).expect("unlink");

    // A directory of this user's that others may enter.
    fs::create_dir(&mine).expect("dir");
    fs::set_permissions(&mine, fs::Permissions::from_mode(0o755)).expect("chmod");
    let said = open_default(tmp.path(), home.path());
    assert!(
        said.contains("open to other users (mode 0755, not 0700)") && said.contains("remove it"),
        "{said}"
    );

    // A directory of another user's.
    std::os::unix::fs::chown(&mine, Some(MALLORY), Some(MALLORY)).expect("chown");
    fs::set_permissions(&mine, fs::Permissions::from_mode(0o700)).expect("chmod");
    let said = open_default(tmp.path(), home.path());
    assert!(
        said.contains(&format!("owned by uid {MALLORY}, not by this user (uid 0)")),
        "{said}"
    );

    // Its own, as it should be, is used.
    std::os::unix::fs::chown(&mine, Some(0), Some(0)).expect("chown");
    assert_eq!(open_default(tmp.path(), home.path()), "opened");
}
