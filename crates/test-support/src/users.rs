//! Two real Unix users for the tests of what one user of a machine can do to another's runs:
//! `trainyard-t1` and `trainyard-t2`, system users without a home, made (once, under a lock)
//! when missing. Commands run as one of them with its uid and gid and no supplementary groups.
//!
//! Changing uid needs root. Elsewhere [`two_users`] says `SKIP:` with the reason and the test
//! passes; under `CI=true` (where the tests run as root) it fails instead, unless
//! [`TWO_USERS_SKIP`] says why the users cannot be had there.
//!
//! ```no_run
//! use trainyard_test_support::users::two_users;
//!
//! let Some(users) = two_users() else { return };
//! let out = users.second.command("cat", &["/root/secret"]).output().expect("cat starts");
//! assert!(!out.status.success(), "another user cannot read it");
//! ```

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

/// Why the two-user tests may skip under `CI=true`.
pub const TWO_USERS_SKIP: &str = "TRAINYARD_TWO_USERS_SKIP";

/// The users' names.
const NAMES: [&str; 2] = ["trainyard-t1", "trainyard-t2"];

/// One of the two users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Its name.
    pub name: &'static str,
    /// Its user id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
}

impl User {
    /// `program args...` to be run as this user (stdin closed).
    #[must_use]
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command
            .args(args)
            .uid(self.uid)
            .gid(self.gid)
            .env_remove("XDG_RUNTIME_DIR")
            .env("HOME", "/nonexistent")
            .stdin(Stdio::null());
        command
    }

    /// Runs `sh -c script` as this user; whether it succeeded, with what it printed
    /// (stdout, then stderr).
    #[must_use]
    pub fn sh(&self, script: &str) -> (bool, String) {
        let out = self
            .command("sh", &["-c", script])
            .output()
            .expect("sh starts");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }
}

/// The two users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwoUsers {
    /// The first (a victim, say).
    pub first: User,
    /// The second (another user of the machine).
    pub second: User,
}

/// The two users, made when missing; `None` (after a `SKIP:` line) when this process cannot
/// act as other users. Panics under `CI=true` unless [`TWO_USERS_SKIP`] says why they cannot
/// be had.
#[must_use]
pub fn two_users() -> Option<TwoUsers> {
    make().map_err(skip).ok()
}

/// Whether this process may act as other users (it is root), for tests that bring users of
/// their own; as [`two_users`], `false` only after a `SKIP:` line, and never under `CI=true`
/// unless [`TWO_USERS_SKIP`] says why.
#[must_use]
pub fn can_act_as_others() -> bool {
    root().map_err(skip).is_ok()
}

/// Says why the two-user tests skip; fails under `CI=true` unless CI said why.
fn skip(reason: String) {
    let known = std::env::var(TWO_USERS_SKIP)
        .ok()
        .filter(|why| !why.is_empty());
    let under_ci = std::env::var("CI").is_ok_and(|ci| ci == "true");
    assert!(
        known.is_some() || !under_ci,
        "under CI=true the two-user tests run unless CI said why not ({TWO_USERS_SKIP}): {reason}"
    );
    eprintln!(
        "SKIP: two real users are needed: {}",
        known.unwrap_or(reason)
    );
}

fn root() -> Result<(), String> {
    if std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0) {
        Ok(())
    } else {
        Err("acting as other users needs root".to_owned())
    }
}

fn make() -> Result<TwoUsers, String> {
    root()?;
    // One `useradd` at a time: test processes run side by side and `useradd` refuses to
    // work while another holds `/etc/passwd`'s lock.
    let file = File::create(std::env::temp_dir().join("trainyard-test-users.lock"))
        .map_err(|e| format!("cannot make the users' lock file: {e}"))?;
    let mut lock = fd_lock::RwLock::new(file);
    let _held = lock
        .write()
        .map_err(|e| format!("cannot lock the users' lock file: {e}"))?;
    let mut users = Vec::new();
    for name in NAMES {
        if lookup(name).is_none() {
            let out = Command::new("useradd")
                .args(["--system", "--no-create-home", "--user-group"])
                .args(["--shell", "/usr/sbin/nologin", name])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("useradd cannot run: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "useradd {name} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        let (uid, gid) = lookup(name).ok_or_else(|| format!("user {name} is not known"))?;
        users.push(User { name, uid, gid });
    }
    let second = users.pop().ok_or("no second user")?;
    let first = users.pop().ok_or("no first user")?;
    Ok(TwoUsers { first, second })
}

/// The uid and gid of user `name`, from `/etc/passwd`.
fn lookup(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 4 && fields[0] == name)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}
