//! How tasks and actors end, kept as data: what a process exited with, which signal killed
//! it, that it ran out of memory, or why an actor is gone. Runtimes fill these in; the
//! executor classifies them and the command line turns them into words.

use std::fmt;

use serde::{Deserialize, Serialize};
use trainyard_resources::ByteSize;

use crate::NodeId;

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum TaskExit {
    /// The task finished: a function's return value, or a command's exit code `0`.
    Succeeded {
        /// What it returned.
        value: serde_json::Value,
    },
    /// The task failed.
    Failed {
        /// How.
        failure: TaskFailure,
    },
}

impl TaskExit {
    /// A command that exited with `code` (success for `0`).
    #[must_use]
    pub fn from_code(code: i32) -> Self {
        if code == 0 {
            Self::Succeeded { value: code.into() }
        } else {
            Self::Failed {
                failure: TaskFailure::ExitCode { code },
            }
        }
    }
}

/// How a task failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskFailure {
    /// A function task returned an error or panicked.
    Error {
        /// The user's error text.
        message: String,
    },
    /// A command exited with a non-zero code.
    ExitCode {
        /// The exit code.
        code: i32,
    },
    /// A command was killed by a signal.
    Signal {
        /// The signal's number.
        signal: i32,
        /// Whether it dumped core.
        core_dumped: bool,
    },
    /// The task was killed for using more memory than its limit.
    MemoryLimit {
        /// The limit, in bytes.
        limit: u64,
    },
}

impl fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error { message } => write!(f, "failed: {message}"),
            Self::ExitCode { code } => write!(f, "exited with code {code}"),
            Self::Signal {
                signal,
                core_dumped,
            } => {
                write!(f, "was killed by signal {signal}")?;
                if let Some(name) = signal_name(*signal) {
                    write!(f, " ({name})")?;
                }
                if *core_dumped {
                    f.write_str(", core dumped")?;
                }
                Ok(())
            }
            Self::MemoryLimit { limit } => {
                write!(f, "exceeded its memory limit of {}", human_bytes(*limit))
            }
        }
    }
}

/// Why a task could not be started. Unlike a [`TaskFailure`], starting it again would meet
/// the same refusal, except for [`TaskRejection::SpawnFailed`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rejection", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskRejection {
    /// The program is not on the worker's `PATH` (or not at the path given).
    ProgramNotFound {
        /// The program as given.
        program: String,
    },
    /// The program exists but cannot be executed.
    NotExecutable {
        /// The program as given.
        program: String,
        /// The operating system's reason.
        error: String,
    },
    /// No function is registered under the name.
    UnknownFunction {
        /// The name asked for.
        name: String,
        /// The names that are registered.
        registered: Vec<String>,
    },
    /// This runtime cannot run this kind of task.
    Unsupported {
        /// The kind of task (`command`, `function`).
        kind: String,
        /// Why.
        reason: String,
    },
    /// The actor is still running its previous task.
    AlreadyRunning,
    /// Starting the process failed for a reason that may pass (out of processes, say).
    SpawnFailed {
        /// The program.
        program: String,
        /// The operating system's reason.
        error: String,
    },
}

impl fmt::Display for TaskRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ProgramNotFound { program } => {
                write!(f, "program `{program}` was not found")
            }
            Self::NotExecutable { program, error } => {
                write!(f, "program `{program}` cannot be executed: {error}")
            }
            Self::UnknownFunction { name, registered } => {
                write!(f, "no function is registered as `{name}`; registered: ")?;
                if registered.is_empty() {
                    f.write_str("none")
                } else {
                    f.write_str(&registered.join(", "))
                }
            }
            Self::Unsupported { kind, reason } => {
                write!(f, "{kind} tasks are not supported here: {reason}")
            }
            Self::AlreadyRunning => f.write_str("the worker is already running a task"),
            Self::SpawnFailed { program, error } => {
                write!(f, "starting `{program}` failed: {error}")
            }
        }
    }
}

/// Why an actor is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeathCause {
    /// The connection to the worker's process was lost.
    ConnectionLost,
    /// The worker's process exited.
    ProcessExited {
        /// Its exit code, when it exited normally.
        code: Option<i32>,
        /// The signal that killed it, if one did.
        signal: Option<i32>,
    },
    /// The worker was killed for using more memory than its limit.
    MemoryLimit {
        /// The limit, in bytes.
        limit: u64,
    },
    /// Its node was lost.
    NodeLost {
        /// The node.
        node: NodeId,
    },
    /// The driver killed it.
    Killed,
    /// It was asked to stop and did.
    Stopped,
    /// Its placement group was removed.
    PlacementGroupRemoved,
    /// It stopped answering.
    Unresponsive {
        /// For how long, in milliseconds.
        after_ms: u64,
    },
    /// It could not be reached for another reason.
    Unreachable {
        /// What went wrong.
        error: String,
    },
    /// Its scheduler cancelled it from outside the run (Slurm's `scancel`).
    Cancelled,
    /// Its scheduler ended it when its job reached its time limit.
    TimeLimit,
    /// Its scheduler took its resources back for other work (a preemption): not the
    /// worker's fault.
    Preempted,
}

impl DeathCause {
    /// Whether the worker may have gone with its host: its node was lost, or it stopped
    /// answering (a host cut off from the driver looks the same until it comes back). A new
    /// worker on that host would wait on it too.
    #[must_use]
    pub const fn went_with_its_host(&self) -> bool {
        matches!(self, Self::NodeLost { .. } | Self::Unresponsive { .. })
    }
}

impl fmt::Display for DeathCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ConnectionLost => f.write_str("the connection to its process was lost"),
            Self::ProcessExited {
                code: Some(code), ..
            } => write!(f, "its process exited with code {code}"),
            Self::ProcessExited {
                signal: Some(signal),
                ..
            } => {
                write!(f, "its process was killed by signal {signal}")?;
                match signal_name(*signal) {
                    Some(name) => write!(f, " ({name})"),
                    None => Ok(()),
                }
            }
            Self::ProcessExited { .. } => f.write_str("its process exited"),
            Self::MemoryLimit { limit } => {
                write!(f, "it exceeded its memory limit of {}", human_bytes(*limit))
            }
            Self::NodeLost { node } => write!(f, "node {node} was lost"),
            Self::Killed => f.write_str("it was killed"),
            Self::Stopped => f.write_str("it was stopped"),
            Self::PlacementGroupRemoved => f.write_str("its placement group was removed"),
            Self::Unresponsive { after_ms } => {
                write!(f, "it did not answer for {}s", *after_ms as f64 / 1000.0)
            }
            Self::Unreachable { error } => write!(f, "it cannot be reached: {error}"),
            Self::Cancelled => f.write_str("its scheduler cancelled it (scancel)"),
            Self::TimeLimit => f.write_str("its job reached its time limit"),
            Self::Preempted => f.write_str("its scheduler preempted it"),
        }
    }
}

/// The name of a Linux signal number (`9` → `SIGKILL`).
#[must_use]
pub fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        _ => return None,
    })
}

/// A byte count with its unit, exact when it can be (`1GiB`, `10GB`).
fn human_bytes(bytes: u64) -> String {
    ByteSize::new(bytes).human().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_what_happened() {
        let cases = [
            (TaskFailure::ExitCode { code: 3 }, "exited with code 3"),
            (
                TaskFailure::Signal {
                    signal: 9,
                    core_dumped: false,
                },
                "was killed by signal 9 (SIGKILL)",
            ),
            (
                TaskFailure::MemoryLimit { limit: 1 << 30 },
                "exceeded its memory limit of 1GiB",
            ),
            (
                TaskFailure::Error {
                    message: "boom".into(),
                },
                "failed: boom",
            ),
        ];
        for (failure, text) in cases {
            assert_eq!(failure.to_string(), text);
        }
    }

    #[test]
    fn outcomes_cross_the_wire_as_tagged_data() {
        let exit = TaskExit::Failed {
            failure: TaskFailure::Signal {
                signal: 15,
                core_dumped: false,
            },
        };
        let json = serde_json::to_value(&exit).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"outcome": "failed", "failure": {"kind": "signal", "signal": 15, "core_dumped": false}})
        );
        assert_eq!(serde_json::from_value::<TaskExit>(json).unwrap(), exit);
        let cause = DeathCause::ProcessExited {
            code: None,
            signal: Some(9),
        };
        let back: DeathCause =
            serde_json::from_str(&serde_json::to_string(&cause).unwrap()).unwrap();
        assert_eq!(back, cause);
        assert_eq!(
            cause.to_string(),
            "its process was killed by signal 9 (SIGKILL)"
        );
    }

    #[test]
    fn exit_code_zero_is_success() {
        assert_eq!(
            TaskExit::from_code(0),
            TaskExit::Succeeded { value: 0.into() }
        );
        assert_eq!(
            TaskExit::from_code(2),
            TaskExit::Failed {
                failure: TaskFailure::ExitCode { code: 2 }
            }
        );
    }
}
