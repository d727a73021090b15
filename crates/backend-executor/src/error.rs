use std::time::Duration;

use trainyard_config::ConfigError;
use trainyard_resources::Resources;
use trainyard_runtime::RuntimeError;

use crate::FitReport;

/// Why a backend executor could not run the job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// The scaling config is invalid.
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    /// The placement group can never fit on the cluster as it is.
    #[error("the workers cannot be scheduled")]
    Unschedulable(#[source] Box<RuntimeError>),
    /// The placement group did not become ready in time; it has been removed.
    #[error(
        "the placement group was not ready after {}s: the run asks for {} in total, the cluster has {} free; raise the placement timeout or free resources",
        waited.as_secs_f64(),
        requested.human(),
        available.human()
    )]
    PlacementTimeout {
        /// How long it was waited for.
        waited: Duration,
        /// Everything the group asks for.
        requested: Resources,
        /// What the cluster had free when the wait ended.
        available: Resources,
    },
    /// A runtime operation outside any worker did not answer in time.
    #[error("{operation} did not finish within {}s", after.as_secs_f64())]
    Timeout {
        /// What was being done.
        operation: &'static str,
        /// The limit.
        after: Duration,
    },
    /// The runtime failed outside any worker (creating or removing a group).
    #[error("the runtime failed")]
    Runtime(#[source] Box<RuntimeError>),
    /// A worker asks for an accelerator its runtime gives it no device ids of (not retried:
    /// every attempt would meet the same runtime).
    #[error("the workers' accelerators cannot be set up")]
    Accelerators(#[source] crate::MissingAcceleratorIds),
    /// A backend is misconfigured (not retried).
    #[error("backend setup failed")]
    Backend(#[source] Box<crate::BackendError>),
    /// The training failed more often than `max_failures` allows, or in a way no restart
    /// can cure ([`crate::classify`] says [`crate::Disposition::Fatal`]).
    #[error("training failed after {} attempt(s): {}", report.attempts, report.failures.last().map(ToString::to_string).unwrap_or_default())]
    TrainingFailed {
        /// What happened, including every attempt's failure.
        report: Box<FitReport>,
    },
    /// The run's storage cannot be used: unwritable or unreachable (found before any worker
    /// starts), or a committed checkpoint to resume from is gone.
    #[error("the run's storage cannot be used")]
    Storage(#[source] trainyard_checkpoint::StorageError),
    /// The run was asked to stop ([`crate::StopTrigger`]): its tasks were stopped, their last
    /// output streamed, and everything released. The run stays resumable.
    #[error("the run was interrupted; its workers were stopped")]
    Interrupted {
        /// What happened until then: attempts, failures, the last metrics, checkpoints.
        report: Box<FitReport>,
    },
    /// A run of this name in this storage has finished, and the resume policy
    /// ([`trainyard_config::ResumePolicy::Auto`]) does not run it again.
    #[error(
        "run `{name}` in `{path}` has already finished; train it further from its latest checkpoint with resume `always` (CLI: --resume always), start it afresh in a new folder with resume `never` (CLI: --resume never), or choose another name"
    )]
    RunFinished {
        /// The run's name.
        name: String,
        /// Its folder.
        path: String,
    },
    /// Another driver on this host runs the run of this name and storage: a second one
    /// would write over its record and checkpoints.
    #[error(
        "run `{name}` in `{path}` is being run by process {pid} on this host (since {since}); stop it first (Ctrl-C in its terminal, or kill -INT {pid}), or choose another name"
    )]
    RunInUse {
        /// The run's name.
        name: String,
        /// Its folder.
        path: String,
        /// The other driver's process id.
        pid: u32,
        /// When it opened the run (RFC 3339, UTC).
        since: String,
    },
    /// A driver on another host runs the run of this name and storage: its lease was renewed
    /// lately.
    #[error(
        "run `{name}` in `{path}` is being run by process {pid} on host {host} (its lease was renewed {renewed_s}s ago); stop it there (trainyard stop {name}), or choose another name"
    )]
    RunInUseElsewhere {
        /// The run's name.
        name: String,
        /// Its folder.
        path: String,
        /// The other driver's host.
        host: String,
        /// Its process id there.
        pid: u32,
        /// Seconds since it renewed its lease.
        renewed_s: u64,
    },
}

impl ExecutorError {
    /// What failed, without its cause: a run refused before anything was started says so,
    /// rather than that training failed.
    #[must_use]
    pub const fn what(&self) -> &'static str {
        match self {
            Self::Config(_) => "invalid configuration",
            Self::Unschedulable(_)
            | Self::PlacementTimeout { .. }
            | Self::Storage(_)
            | Self::RunFinished { .. }
            | Self::RunInUse { .. }
            | Self::RunInUseElsewhere { .. } => "the run cannot start",
            Self::Interrupted { .. } => "the run was interrupted",
            _ => "the training run failed",
        }
    }

    /// What failed and every cause, on one line (`the run cannot start: ...: ...`), as a
    /// program built on trainyard shows it.
    #[must_use]
    pub fn summary(&self) -> String {
        let cause: &(dyn std::error::Error + 'static) = match self {
            Self::Config(error) => error,
            other => other,
        };
        trainyard_resources::chain_text(self.what().to_owned(), Some(cause))
    }
}

/// An error and its sources on one line.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    trainyard_resources::ErrorChain(error).to_string()
}

/// The first runtime error in `error`'s chain, if any.
pub(crate) fn runtime_error_in<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a RuntimeError> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<RuntimeError>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// Whether a runtime error somewhere in `error`'s chain is an actor's death.
pub(crate) fn is_death(error: &(dyn std::error::Error + 'static)) -> bool {
    runtime_error_in(error).is_some_and(RuntimeError::is_actor_death)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_timeout_shows_sizes_as_people_read_them() {
        let error = ExecutorError::PlacementTimeout {
            waited: Duration::from_secs(100),
            requested: "CPU=1,memory=1GiB".parse().expect("resources"),
            available: "CPU=0,memory=25276063744".parse().expect("resources"),
        };
        let text = error.to_string();
        assert!(
            text.contains(
                "asks for CPU=1,memory=1GiB in total, the cluster has CPU=0,memory=23.5GiB free"
            ),
            "{text}"
        );
    }
}
