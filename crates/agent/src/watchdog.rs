//! The agent's watchdog: a small process of its own (this very binary, started again) that
//! SIGKILLs the process groups of the agent's tasks once the agent is gone, however it went.
//!
//! The agent kills its task's group itself when it exits normally, and a task's own process
//! dies with the agent (parent-death signal), but a task's children would outlive an agent
//! killed by SIGKILL: the OOM killer, or Ray, which kills an actor's children so when the
//! actor's job ends. The watchdog closes that gap. The agent tells it each task group as it
//! starts (`+PGID`) and once it is reaped (`-PGID`), one line each on the watchdog's stdin,
//! and its private directory (`=PATH`, see [`crate::workdir`]), which the watchdog deletes
//! after the kill, as the agent itself would have; end of file means the agent is gone. The
//! watchdog leads its own process group (a kill of the agent's group does not reach it) and
//! inherits nothing of the agent's environment.

use std::collections::BTreeSet;
use std::io::{BufRead as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::config::{ROLE, ROLE_WATCHDOG};

/// The running agent's watchdog, once started.
static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

/// The agent's end of the watchdog.
#[derive(Debug)]
struct Watchdog {
    stdin: Mutex<ChildStdin>,
    /// Kept so that the watchdog is not reaped by anyone else; it exits on its own.
    _child: Child,
}

/// Starts the watchdog of this agent. Without one (it cannot be started), tasks still end
/// with the agent in every case but a SIGKILL of the agent; the agent says so and goes on.
pub(crate) fn start() {
    let started = crate::process::trampoline().and_then(|(exe, args)| {
        let mut child = Command::new(exe)
            .args(args)
            .env_clear()
            .env(ROLE, ROLE_WATCHDOG)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("the watchdog has no stdin"))?;
        Ok(Watchdog {
            stdin: Mutex::new(stdin),
            _child: child,
        })
    });
    match started {
        Ok(watchdog) => {
            let _ = WATCHDOG.set(watchdog);
        }
        Err(error) => {
            eprintln!("trainyard agent: cannot start its watchdog: {error}");
        }
    }
}

/// Tells the watchdog about a task's process group (`started`) or that it is reaped.
pub(crate) fn tell(group: u32, started: bool) {
    send(&format!("{}{group}\n", if started { '+' } else { '-' }));
}

/// Asks the watchdog to delete `dir`, the agent's private directory, once the agent is gone.
/// A path that cannot be one line of text is not sent (the agent deletes it itself when it
/// exits normally).
pub(crate) fn remove_at_end(dir: &std::path::Path) {
    match dir.to_str() {
        Some(dir) if dir.starts_with('/') && !dir.contains('\n') => send(&format!("={dir}\n")),
        _ => {}
    }
}

fn send(line: &str) {
    let Some(watchdog) = WATCHDOG.get() else {
        return;
    };
    let mut stdin = watchdog
        .stdin
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    // A watchdog that is gone can do nothing more; the agent goes on without it.
    let _ = stdin.write_all(line.as_bytes());
}

/// One line from the agent.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A task's process group to kill once the agent is gone.
    Watch(i32),
    /// A process group that is reaped: not to be killed.
    Forget(i32),
    /// A directory to delete once the agent is gone (and its tasks killed).
    Remove(PathBuf),
}

fn parse(line: &str) -> Option<Line> {
    if let Some(dir) = line.trim_end_matches(['\n', '\r']).strip_prefix('=') {
        // Only an absolute path below the root: never `/` itself.
        let path = PathBuf::from(dir);
        return (path.is_absolute() && path.parent().is_some()).then_some(Line::Remove(path));
    }
    let (sign, group) = line.trim().split_at_checked(1)?;
    let group: i32 = group.parse().ok().filter(|g| *g > 1)?;
    match sign {
        "+" => Some(Line::Watch(group)),
        "-" => Some(Line::Forget(group)),
        _ => None,
    }
}

/// The watchdog's `main`: follows the agent's lines until end of file, then SIGKILLs every
/// group still watched and deletes the directories it was given.
pub(crate) fn run() -> ExitCode {
    let mut groups = BTreeSet::new();
    let mut dirs = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else {
            break;
        };
        match parse(&line) {
            Some(Line::Watch(group)) => {
                groups.insert(group);
            }
            Some(Line::Forget(group)) => {
                groups.remove(&group);
            }
            Some(Line::Remove(dir)) => dirs.push(dir),
            None => {}
        }
    }
    for group in groups {
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
    }
    for dir in dirs {
        // Gone already when the agent exited normally: it deletes its directory itself.
        let _ = std::fs::remove_dir_all(dir);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_a_group_to_watch_or_forget_and_nothing_else_counts() {
        assert_eq!(parse("+4242\n"), Some(Line::Watch(4242)));
        assert_eq!(parse("-4242"), Some(Line::Forget(4242)));
        assert_eq!(parse("+1"), None, "never the init process's group");
        assert_eq!(parse("+0"), None, "never the caller's own group");
        assert_eq!(parse("+-5"), None);
        assert_eq!(parse("4242"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("+x"), None);
    }

    #[test]
    fn a_directory_to_delete_is_an_absolute_path_below_the_root() {
        assert_eq!(
            parse("=/tmp/trainyard-agent-x1 y\n"),
            Some(Line::Remove(PathBuf::from("/tmp/trainyard-agent-x1 y")))
        );
        assert_eq!(parse("=/"), None, "never the root");
        assert_eq!(parse("="), None);
        assert_eq!(parse("=relative/dir"), None);
    }
}
