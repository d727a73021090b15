//! What went wrong in an attempt, whether it is worth another one ([`classify`]), and how
//! long to wait before it ([`Backoff`]). Pure functions over plain data.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use trainyard_runtime::root_cause::TaskError;
use trainyard_runtime::{DeathCause, Reach, TaskFailure, TaskRejection};

use crate::WorldRank;

/// Why one attempt of a run failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptFailure {
    /// The user's task failed on this rank: an error, a panic, a non-zero exit, a signal, or
    /// its memory limit.
    TaskFailed {
        /// The rank whose task failed first.
        rank: WorldRank,
        /// How it failed.
        failure: TaskFailure,
        /// Its last lines of output, oldest first.
        last_lines: Vec<String>,
        /// The exception it left: from torch's error file (`@record`), else the last
        /// traceback in its output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Box<TaskError>>,
        /// The ranks whose task had already succeeded when this one failed: a rank that
        /// leaves while its peers still run collectives breaks them ("Connection closed by
        /// peer"), so the first failure may be their consequence.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        left_before: Vec<WorldRank>,
    },
    /// Ranks made no progress (no report, or with `progress: output` no line either) within
    /// the run's hang timeout; their stacks were captured before the attempt was stopped.
    Hung {
        /// The ranks past their deadline.
        ranks: Vec<WorldRank>,
        /// How long the longest of them went without progress, in milliseconds.
        idle_ms: u64,
        /// The file with every rank's full stacks, when it could be written.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stacks_file: Option<String>,
    },
    /// A worker refused the task (its program does not exist, say).
    TaskRejected {
        /// The rank that refused it.
        rank: WorldRank,
        /// Why.
        rejection: TaskRejection,
    },
    /// A worker died or stopped answering (its process or node is gone).
    WorkerDied {
        /// The rank of the worker, when the failure could be tied to one.
        rank: Option<WorldRank>,
        /// Why.
        cause: DeathCause,
    },
    /// Before the task started, a rank's host could not reach what its task would need (the
    /// preflight): the rendezvous, or the driver (no answer to the preflight in time).
    Unreachable {
        /// The rank.
        rank: WorldRank,
        /// Its host's name, as its worker reported it.
        host: String,
        /// Its node, as the runtime names it, and the node's address.
        node: String,
        /// What it could not reach.
        target: PreflightTarget,
        /// The endpoint, the address it resolved to, the interface of the host's route
        /// there, and why it was not reached.
        reach: Box<Reach>,
    },
    /// The workers could not be started or set up.
    StartFailed {
        /// What went wrong.
        reason: String,
    },
    /// A committed checkpoint could not be recorded in the run's storage.
    StorageFailed {
        /// What went wrong.
        reason: String,
    },
}

impl AttemptFailure {
    /// The rank the failure belongs to, when it belongs to one.
    #[must_use]
    pub fn rank(&self) -> Option<WorldRank> {
        match self {
            Self::TaskFailed { rank, .. } | Self::TaskRejected { rank, .. } => Some(*rank),
            Self::Hung { ranks, .. } => ranks.first().copied(),
            Self::WorkerDied { rank, .. } => *rank,
            Self::Unreachable { rank, .. } => Some(*rank),
            Self::StartFailed { .. } | Self::StorageFailed { .. } => None,
        }
    }

    /// The memory limit the failed rank exceeded, when that is what ended it.
    #[must_use]
    pub fn memory_limit(&self) -> Option<u64> {
        match self {
            Self::TaskFailed {
                failure: TaskFailure::MemoryLimit { limit },
                ..
            }
            | Self::WorkerDied {
                cause: DeathCause::MemoryLimit { limit },
                ..
            } => Some(*limit),
            _ => None,
        }
    }
}

/// `5 s`, `1.5 s`, `90 s`: a wait as the messages say it.
fn seconds(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs >= 10.0 || (secs - secs.round()).abs() < 0.05 {
        format!("{secs:.0} s")
    } else {
        format!("{secs:.1} s")
    }
}

impl fmt::Display for AttemptFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TaskFailed {
                rank,
                failure,
                error,
                left_before,
                ..
            } => {
                write!(f, "rank {rank} {failure}")?;
                if let Some(error) = error {
                    write!(f, ": {error}")?;
                }
                match left_before.as_slice() {
                    [] => Ok(()),
                    [one] => write!(
                        f,
                        " (after rank {one} had already exited with code 0, leaving its peers' collectives)"
                    ),
                    many => {
                        let names: Vec<String> = many.iter().map(ToString::to_string).collect();
                        write!(
                            f,
                            " (after ranks {} had already exited with code 0, leaving their peers' collectives)",
                            names.join(", ")
                        )
                    }
                }
            }
            Self::Hung { ranks, idle_ms, .. } => {
                let names: Vec<String> = ranks.iter().map(ToString::to_string).collect();
                let who = match names.as_slice() {
                    [one] => format!("rank {one}"),
                    many => format!("ranks {}", many.join(", ")),
                };
                write!(
                    f,
                    "{who} made no progress for {}",
                    seconds(Duration::from_millis(*idle_ms))
                )
            }
            Self::TaskRejected { rank, rejection } => {
                write!(f, "rank {rank} cannot start its task: {rejection}")
            }
            Self::WorkerDied {
                rank: Some(rank),
                cause,
            } => write!(f, "rank {rank} died: {cause}"),
            Self::WorkerDied { rank: None, cause } => write!(f, "a worker died: {cause}"),
            Self::Unreachable {
                rank,
                host,
                node,
                target,
                reach,
            } => {
                let why = reach
                    .unreachable
                    .as_ref()
                    .map_or_else(|| "no answer".to_owned(), ToString::to_string);
                let through = match &reach.interface {
                    Some(interface) => format!("interface {interface}"),
                    None => "no interface".to_owned(),
                };
                match target {
                    PreflightTarget::Rendezvous => {
                        write!(
                            f,
                            "rank {rank}'s host {host} ({node}) cannot reach the rendezvous {}",
                            reach.endpoint
                        )?;
                        match &reach.address {
                            Some(address) if *address != reach.endpoint.host => {
                                write!(f, " (address {address}, through {through})")?;
                            }
                            _ => write!(f, " (through {through})")?,
                        }
                        write!(f, ": {why}")
                    }
                    PreflightTarget::Driver => write!(
                        f,
                        "rank {rank}'s host {host} ({node}, {through}) and the driver at {} do not reach each other: {why} to the preflight",
                        reach.endpoint
                    ),
                }
            }
            Self::StartFailed { reason } => write!(f, "workers failed to start: {reason}"),
            Self::StorageFailed { reason } => {
                write!(f, "the run's storage failed: {reason}")
            }
        }
    }
}

/// What a rank's host could not reach before its task started
/// ([`AttemptFailure::Unreachable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PreflightTarget {
    /// Where the ranks meet once their tasks start (`MASTER_ADDR:MASTER_PORT`).
    Rendezvous,
    /// The driver: the host did not answer the preflight in time.
    Driver,
}

/// What to do about a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// Counts against `max_failures`; start again from scratch if the budget allows.
    Restart,
    /// Start again without counting it: the scheduler took the workers' resources back
    /// (a preemption), which says nothing about the training.
    Requeue,
    /// Another attempt would fail the same way: end the run now.
    Fatal,
}

/// Whether a failure counts against `max_failures` and restarts, or ends the run at once.
///
/// The user's code failing in any way (an error, a non-zero exit, a signal, its memory
/// limit) and a worker dying are worth a restart, as in Ray Train and torchrun. A program
/// that does not exist, a function nobody registered, or a task kind the runtime cannot run
/// would be refused again by every restart, so they are fatal. Infeasible placement and bad
/// configuration never reach here: they are errors before any attempt starts.
///
/// ```
/// use trainyard_backend_executor::{AttemptFailure, Disposition, WorldRank, classify};
/// use trainyard_runtime::{TaskFailure, TaskRejection};
///
/// let oom = AttemptFailure::TaskFailed {
///     rank: WorldRank(3),
///     failure: TaskFailure::MemoryLimit { limit: 1 << 30 },
///     last_lines: vec![],
///     error: None,
///     left_before: vec![],
/// };
/// assert_eq!(classify(&oom), Disposition::Restart);
/// let typo = AttemptFailure::TaskRejected {
///     rank: WorldRank(0),
///     rejection: TaskRejection::ProgramNotFound { program: "pyhton".into() },
/// };
/// assert_eq!(classify(&typo), Disposition::Fatal);
/// ```
#[must_use]
pub fn classify(failure: &AttemptFailure) -> Disposition {
    match failure {
        AttemptFailure::WorkerDied {
            cause: DeathCause::Preempted,
            ..
        } => Disposition::Requeue,
        // The user cancelled the job, or its time is up: another attempt in it cannot run.
        AttemptFailure::WorkerDied {
            cause: DeathCause::Cancelled | DeathCause::TimeLimit,
            ..
        } => Disposition::Fatal,
        AttemptFailure::TaskFailed { .. }
        | AttemptFailure::Hung { .. }
        | AttemptFailure::WorkerDied { .. }
        | AttemptFailure::Unreachable { .. }
        | AttemptFailure::StartFailed { .. }
        | AttemptFailure::StorageFailed { .. } => Disposition::Restart,
        AttemptFailure::TaskRejected { rejection, .. } => match rejection {
            TaskRejection::SpawnFailed { .. } | TaskRejection::AlreadyRunning => {
                Disposition::Restart
            }
            _ => Disposition::Fatal,
        },
    }
}

/// How long to wait before each restart of a crash loop: `initial`, doubling up to `max`.
/// Only failures in a row of attempts that made no progress wait (see
/// [`ExecutorOptions::restart_backoff`](crate::ExecutorOptions::restart_backoff)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backoff {
    /// The first wait: before a crash loop's second restart (its first is at once).
    pub initial: Duration,
    /// The longest wait; an attempt whose tasks ran this long made progress.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// No wait at all.
    pub const NONE: Self = Self {
        initial: Duration::ZERO,
        max: Duration::ZERO,
    };

    /// The wait before restart number `restart` (counting from 1).
    ///
    /// ```
    /// use std::time::Duration;
    /// use trainyard_backend_executor::Backoff;
    ///
    /// let b = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(5) };
    /// let waits: Vec<u64> = (1..=5).map(|n| b.delay(n).as_secs()).collect();
    /// assert_eq!(waits, [1, 2, 4, 5, 5]);
    /// ```
    #[must_use]
    pub fn delay(&self, restart: u32) -> Duration {
        let doublings = restart.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use trainyard_runtime::NodeId;

    use super::*;

    #[test]
    fn hangs_and_root_causes_read_as_one_line() {
        let hung = AttemptFailure::Hung {
            ranks: vec![WorldRank(1)],
            idle_ms: 90_000,
            stacks_file: None,
        };
        assert_eq!(hung.to_string(), "rank 1 made no progress for 90 s");
        let both = AttemptFailure::Hung {
            ranks: vec![WorldRank(0), WorldRank(1)],
            idle_ms: 5_020,
            stacks_file: None,
        };
        assert_eq!(both.to_string(), "ranks 0, 1 made no progress for 5 s");
        let error = trainyard_runtime::root_cause::TaskError {
            source: trainyard_runtime::root_cause::ErrorSource::ErrorFile,
            exception: "ValueError".into(),
            message: "bad batch".into(),
            file: Some("train.py".into()),
            line: Some(12),
            traceback: Vec::new(),
        };
        let failed = AttemptFailure::TaskFailed {
            rank: WorldRank(1),
            failure: TaskFailure::ExitCode { code: 1 },
            last_lines: Vec::new(),
            error: Some(Box::new(error)),
            left_before: Vec::new(),
        };
        assert_eq!(
            failed.to_string(),
            "rank 1 exited with code 1: ValueError: bad batch (train.py:12)"
        );
    }

    #[test]
    fn failures_are_classified_as_a_table() {
        let rank = WorldRank(1);
        let task = |failure| AttemptFailure::TaskFailed {
            rank,
            failure,
            last_lines: Vec::new(),
            error: None,
            left_before: Vec::new(),
        };
        let rejected = |rejection| AttemptFailure::TaskRejected { rank, rejection };
        let died = |cause| AttemptFailure::WorkerDied {
            rank: Some(rank),
            cause,
        };
        let table = [
            (
                task(TaskFailure::Error {
                    message: "boom".into(),
                }),
                Disposition::Restart,
            ),
            (
                task(TaskFailure::ExitCode { code: 1 }),
                Disposition::Restart,
            ),
            (
                task(TaskFailure::Signal {
                    signal: 9,
                    core_dumped: false,
                }),
                Disposition::Restart,
            ),
            (
                task(TaskFailure::MemoryLimit { limit: 1 << 30 }),
                Disposition::Restart,
            ),
            (died(DeathCause::ConnectionLost), Disposition::Restart),
            (
                AttemptFailure::Hung {
                    ranks: vec![rank],
                    idle_ms: 90_000,
                    stacks_file: None,
                },
                Disposition::Restart,
            ),
            (
                died(DeathCause::ProcessExited {
                    code: Some(1),
                    signal: None,
                }),
                Disposition::Restart,
            ),
            (
                died(DeathCause::MemoryLimit { limit: 1 << 30 }),
                Disposition::Restart,
            ),
            (
                died(DeathCause::NodeLost {
                    node: NodeId::from("a"),
                }),
                Disposition::Restart,
            ),
            (died(DeathCause::Preempted), Disposition::Requeue),
            (died(DeathCause::Cancelled), Disposition::Fatal),
            (died(DeathCause::TimeLimit), Disposition::Fatal),
            (
                AttemptFailure::StartFailed {
                    reason: "timeout".into(),
                },
                Disposition::Restart,
            ),
            (
                rejected(TaskRejection::ProgramNotFound {
                    program: "pyhton".into(),
                }),
                Disposition::Fatal,
            ),
            (
                rejected(TaskRejection::NotExecutable {
                    program: "./x".into(),
                    error: "permission denied".into(),
                }),
                Disposition::Fatal,
            ),
            (
                rejected(TaskRejection::UnknownFunction {
                    name: "f".into(),
                    registered: vec![],
                }),
                Disposition::Fatal,
            ),
            (
                rejected(TaskRejection::Unsupported {
                    kind: "command".into(),
                    reason: "sim".into(),
                }),
                Disposition::Fatal,
            ),
            (
                rejected(TaskRejection::SpawnFailed {
                    program: "python".into(),
                    error: "resource temporarily unavailable".into(),
                }),
                Disposition::Restart,
            ),
        ];
        for (failure, want) in table {
            assert_eq!(classify(&failure), want, "{failure}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_never_overflows() {
        let b = Backoff::default();
        assert_eq!(b.delay(1), Duration::from_secs(1));
        assert_eq!(b.delay(2), Duration::from_secs(2));
        assert_eq!(b.delay(6), Duration::from_secs(30));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(30));
        assert_eq!(Backoff::NONE.delay(7), Duration::ZERO);
    }

    #[test]
    fn failures_read_as_one_line_naming_the_rank() {
        let oom = AttemptFailure::TaskFailed {
            rank: WorldRank(3),
            failure: TaskFailure::MemoryLimit { limit: 1 << 30 },
            last_lines: vec!["allocating".into()],
            error: None,
            left_before: Vec::new(),
        };
        assert_eq!(oom.to_string(), "rank 3 exceeded its memory limit of 1GiB");
        let signal = AttemptFailure::TaskFailed {
            rank: WorldRank(1),
            failure: TaskFailure::Signal {
                signal: 11,
                core_dumped: true,
            },
            last_lines: vec![],
            error: None,
            left_before: Vec::new(),
        };
        assert_eq!(
            signal.to_string(),
            "rank 1 was killed by signal 11 (SIGSEGV), core dumped"
        );
    }
}
