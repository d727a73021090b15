//! Running a program with a deadline, for `nvidia-smi`, which can hang on a broken driver.

use std::io::{self, Read};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How often a running `nvidia-smi` is checked for exit.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Why a command gave no output.
#[derive(Debug, thiserror::Error)]
pub(super) enum CommandFailure {
    #[error("the program is not installed")]
    NotFound,
    #[error("cannot start the program")]
    Spawn(#[source] io::Error),
    #[error("cannot wait for the program")]
    Wait(#[source] io::Error),
    #[error("the program ran longer than {0:?} and was killed")]
    TimedOut(Duration),
    #[error("the program exited with {0}")]
    Status(ExitStatus),
    #[error("cannot read the program's output")]
    Read(#[source] io::Error),
}

/// Runs `command` and returns its standard output, killing it after `timeout`. The output
/// is drained by a thread so a chatty program cannot block on a full pipe.
pub(super) fn run_with_deadline(
    mut command: Command,
    timeout: Duration,
) -> Result<String, CommandFailure> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => CommandFailure::NotFound,
            _ => CommandFailure::Spawn(error),
        })?;
    let reader = child.stdout.take().map(|mut stdout| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            stdout.read_to_end(&mut bytes).map(|_| bytes)
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => thread::sleep(POLL_INTERVAL),
            outcome => {
                if let Err(error) = child.kill().and_then(|()| child.wait()) {
                    tracing::debug!(%error, "cannot kill a stuck command");
                }
                return Err(match outcome {
                    Err(error) => CommandFailure::Wait(error),
                    _ => CommandFailure::TimedOut(timeout),
                });
            }
        }
    };
    if !status.success() {
        return Err(CommandFailure::Status(status));
    }
    let bytes = match reader.map(thread::JoinHandle::join) {
        None => Vec::new(),
        Some(Ok(read)) => read.map_err(CommandFailure::Read)?,
        Some(Err(_panicked)) => {
            return Err(CommandFailure::Read(io::Error::other(
                "the output reader panicked",
            )));
        }
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_told_apart_from_a_failing_one() {
        let missing = run_with_deadline(
            Command::new("trainyard-no-such-program"),
            Duration::from_secs(5),
        );
        assert!(
            matches!(missing, Err(CommandFailure::NotFound)),
            "{missing:?}"
        );

        let mut echo = Command::new("sh");
        echo.args(["-c", "echo 0, GPU-a, X, 1"]);
        assert_eq!(
            run_with_deadline(echo, Duration::from_secs(5)).unwrap(),
            "0, GPU-a, X, 1\n"
        );

        let mut failing = Command::new("sh");
        failing.args(["-c", "exit 3"]);
        let failed = run_with_deadline(failing, Duration::from_secs(5));
        assert!(
            matches!(failed, Err(CommandFailure::Status(_))),
            "{failed:?}"
        );
    }

    #[test]
    fn a_stuck_program_is_killed_at_the_deadline() {
        let mut stuck = Command::new("sleep");
        stuck.arg("30");
        let started = Instant::now();
        let outcome = run_with_deadline(stuck, Duration::from_millis(200));
        assert!(
            matches!(outcome, Err(CommandFailure::TimedOut(_))),
            "{outcome:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
