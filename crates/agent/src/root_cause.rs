//! Why a task failed, told to the driver just before the failed exit
//! ([`TaskEvent::RootCause`]): when it ended, and the exception it left — from torch's error
//! file when the task asked for one ([`ERROR_FILE_VAR`]), else from the last Python
//! traceback in its output.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use trainyard_runtime::events::EventSender;
use trainyard_runtime::root_cause::ERROR_FILE_VAR;
use trainyard_runtime::root_cause::{TaskError, Tracebacks};
use trainyard_runtime::{Stream, TaskEvent, TaskExit};

use crate::workdir::WorkDir;

/// The most of an error file that is read; a longer one is not a valid record.
const MAX_ERROR_FILE: u64 = 1024 * 1024;

/// Whether the task's environment asks for an error file that the agent provides (see
/// [`ERROR_FILE_VAR`]; one whose path the environment gives already needs no directory).
pub(crate) fn wants_error_file(env: &BTreeMap<String, String>) -> bool {
    env.get(ERROR_FILE_VAR)
        .filter(|name| !name.is_empty())
        .is_some_and(|name| env.get(name).is_none_or(String::is_empty))
}

/// The error file the task's environment names itself, if it asks for one (see
/// [`ERROR_FILE_VAR`]).
pub(crate) fn given_error_file(env: &BTreeMap<String, String>) -> Option<PathBuf> {
    let name = env.get(ERROR_FILE_VAR).filter(|name| !name.is_empty())?;
    env.get(name)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
}

/// Gives the task about to start its error file when its environment asks for one (see
/// [`ERROR_FILE_VAR`]); the file's path, to read once it has failed.
///
/// # Errors
/// When the file's folder cannot be made or a stale file cannot be removed.
pub(crate) fn prepare_error_file(
    env: &mut BTreeMap<String, String>,
    workdir: &WorkDir,
    task: u64,
) -> std::io::Result<Option<PathBuf>> {
    let Some(name) = env
        .get(ERROR_FILE_VAR)
        .filter(|name| !name.is_empty())
        .cloned()
    else {
        return Ok(None);
    };
    if let Some(own) = env.get(&name).filter(|path| !path.is_empty()) {
        return Ok(Some(PathBuf::from(own)));
    }
    let path = workdir.error_file(task)?;
    env.insert(name, path.to_string_lossy().into_owned());
    Ok(Some(path))
}

/// The last traceback of each of a task's output streams, fed line by line as they are read.
///
/// The streams are followed apart: lines of one stream inside the other's traceback would
/// cut it short. stderr's traceback wins (Python prints the exception that ends it there),
/// then stdout's.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutputTracebacks {
    stdout: Arc<Mutex<Tracebacks>>,
    stderr: Arc<Mutex<Tracebacks>>,
}

impl OutputTracebacks {
    /// Takes in one line of `stream`.
    pub(crate) fn push(&self, stream: Stream, line: &str) {
        let tracebacks = match stream {
            Stream::Stdout => &self.stdout,
            Stream::Stderr => &self.stderr,
        };
        // A panic while a line was pushed leaves a traceback half read, no worse.
        tracebacks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    /// The last complete traceback: stderr's, else stdout's.
    pub(crate) fn last(&self) -> Option<TaskError> {
        [&self.stderr, &self.stdout].into_iter().find_map(|t| {
            t.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last()
                .cloned()
        })
    }
}

/// The exception a failed command task left: its error file's record when there is a valid
/// one, else the last traceback of its output.
pub(crate) async fn command_error(
    error_file: Option<PathBuf>,
    output: &OutputTracebacks,
) -> Option<TaskError> {
    if let Some(path) = error_file {
        let read = tokio::task::spawn_blocking(move || read_error_file(&path)).await;
        if let Ok(Some(error)) = read {
            return Some(error);
        }
    }
    output.last()
}

/// The record of an error file, when it holds a valid one. Blocks: one small read.
fn read_error_file(path: &std::path::Path) -> Option<TaskError> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_ERROR_FILE)
        .read_to_string(&mut text)
        .ok()?;
    TaskError::from_error_file(&text)
}

/// Now, in milliseconds since the Unix epoch (0 on a clock set before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

/// Sends a task's end: a failed one after its root cause (it ended at `ended_ms`, leaving
/// `error`), so that the driver knows the cause when it learns of the failure.
pub(crate) async fn send_exit(
    events: &EventSender,
    exit: TaskExit,
    ended_ms: u64,
    error: Option<TaskError>,
) {
    if matches!(exit, TaskExit::Failed { .. }) {
        let cause = TaskEvent::RootCause { ended_ms, error };
        events.send(events.task_event(cause)).await;
    }
    events.task_exited(exit).await;
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use trainyard_runtime::AttemptNumber;
    use trainyard_runtime::TaskFailure;
    use trainyard_runtime::events::{ActorEvent, event_channel};
    use trainyard_runtime::root_cause::ErrorSource;

    use super::*;

    const TRACEBACK: [&str; 4] = [
        "Traceback (most recent call last):",
        "  File \"/w/train.py\", line 12, in <module>",
        "    raise ValueError(\"bad batch\")",
        "ValueError: bad batch",
    ];

    #[test]
    fn a_line_of_stdout_inside_a_stderr_traceback_does_not_cut_it() {
        let output = OutputTracebacks::default();
        output.push(Stream::Stderr, TRACEBACK[0]);
        output.push(Stream::Stdout, "step 7");
        for line in &TRACEBACK[1..] {
            output.push(Stream::Stderr, line);
        }
        let error = output.last().expect("a traceback");
        assert_eq!(error.to_string(), "ValueError: bad batch (/w/train.py:12)");
        assert_eq!(error.source, ErrorSource::Output);
    }

    #[test]
    fn the_tasks_own_error_file_path_is_kept_and_a_fresh_one_is_given_otherwise() {
        let workdir = WorkDir::create(&crate::watchdog::Watchdog::default()).expect("a workdir");
        let mut none = BTreeMap::new();
        assert_eq!(prepare_error_file(&mut none, &workdir, 1).ok(), Some(None));
        assert!(none.is_empty());

        let mut own = BTreeMap::from([
            (ERROR_FILE_VAR.to_owned(), "MY_ERRORS".to_owned()),
            ("MY_ERRORS".to_owned(), "/data/mine.json".to_owned()),
        ]);
        let path = prepare_error_file(&mut own, &workdir, 1).expect("prepared");
        assert_eq!(path, Some(PathBuf::from("/data/mine.json")));
        assert_eq!(own["MY_ERRORS"], "/data/mine.json");

        let mut fresh = BTreeMap::from([(
            ERROR_FILE_VAR.to_owned(),
            "TORCHELASTIC_ERROR_FILE".to_owned(),
        )]);
        let stale = workdir.error_file(2).expect("a path");
        std::fs::write(&stale, "{}").expect("an earlier file");
        let path = prepare_error_file(&mut fresh, &workdir, 2)
            .expect("prepared")
            .expect("a path");
        assert_eq!(fresh["TORCHELASTIC_ERROR_FILE"], path.to_string_lossy());
        assert!(path.starts_with(workdir.root()));
        assert!(path.parent().is_some_and(std::path::Path::is_dir));
        assert!(!path.exists(), "the stale file is gone");
    }

    #[tokio::test]
    async fn the_error_file_wins_over_the_output_and_a_bad_one_falls_back_to_it() {
        let output = OutputTracebacks::default();
        for line in TRACEBACK {
            output.push(Stream::Stderr, line);
        }
        let dir = tempfile::tempdir().expect("a temp dir");
        let file = dir.path().join("error.json");
        std::fs::write(
            &file,
            r#"{"message": {"message": "RuntimeError: from the file", "extraInfo": {}}}"#,
        )
        .expect("written");
        let error = command_error(Some(file.clone()), &output).await;
        assert_eq!(
            error.map(|e| (e.source, e.exception)),
            Some((ErrorSource::ErrorFile, "RuntimeError".to_owned()))
        );
        std::fs::write(&file, "not json").expect("written");
        let error = command_error(Some(file), &output).await;
        assert_eq!(error.map(|e| e.source), Some(ErrorSource::Output));
        let missing = command_error(Some(dir.path().join("none")), &output).await;
        assert_eq!(missing.map(|e| e.source), Some(ErrorSource::Output));
    }

    #[tokio::test]
    async fn a_failed_exit_goes_after_its_root_cause_and_a_success_alone() {
        let (events, stream) = event_channel(16);
        let failed = TaskExit::Failed {
            failure: TaskFailure::ExitCode { code: 1 },
        };
        send_exit(&events, failed.clone(), 42, None).await;
        send_exit(&events, TaskExit::from_code(0), 43, None).await;
        drop(events);
        let sent: Vec<ActorEvent> = stream.collect().await;
        let attempt = AttemptNumber::default();
        assert_eq!(
            sent,
            vec![
                ActorEvent::Task {
                    attempt,
                    event: TaskEvent::RootCause {
                        ended_ms: 42,
                        error: None
                    }
                },
                ActorEvent::TaskExited {
                    attempt,
                    exit: failed
                },
                ActorEvent::TaskExited {
                    attempt,
                    exit: TaskExit::from_code(0)
                },
            ]
        );
    }
}
