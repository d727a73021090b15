use trainyard_resources::ResourceError;
use trainyard_runtime::RuntimeError;

/// Why a [`crate::WorkerGroup`] operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerGroupError {
    /// The group was asked for zero workers.
    #[error("a worker group needs at least one worker, got num_workers=0")]
    NoWorkers,
    /// A worker's resource dictionary cannot be turned into actor options.
    #[error("invalid resources for worker {worker}")]
    InvalidResources {
        /// The worker's index in the group.
        worker: usize,
        /// What is wrong with the dictionary.
        #[source]
        source: ResourceError,
    },
    /// `start` was called on a group whose workers are running.
    #[error("the worker group has already been started; shut it down before starting it again")]
    AlreadyStarted,
    /// The group has no running workers: it was never started, has been shut down, or all
    /// of its workers were removed.
    #[error("the worker group has no active workers: it was not started or has been shut down")]
    NotActive,
    /// A worker index beyond the group's workers.
    #[error("worker index {index} is out of range for a group of {len} workers")]
    InvalidWorkerIndex {
        /// The index asked for.
        index: usize,
        /// How many workers the group has.
        len: usize,
    },
    /// Fewer bundles of the placement group are free (hold no worker) than workers were
    /// asked for.
    #[error(
        "cannot add workers: {requested} asked for, but only {free} of the placement group's {bundles} bundles are free"
    )]
    NoFreeBundle {
        /// How many bundles the group's placement group has.
        bundles: usize,
        /// How many of them hold no worker.
        free: usize,
        /// How many workers were asked for.
        requested: usize,
    },
    /// The actor of a worker could not be started.
    #[error("cannot start worker {worker} in bundle {bundle_index}")]
    Start {
        /// The worker's index in the group.
        worker: usize,
        /// The bundle of the group's placement group it was pinned to.
        bundle_index: usize,
        /// What the runtime reported (boxed to keep the error small).
        #[source]
        source: Box<RuntimeError>,
    },
    /// A call on a worker failed.
    #[error("worker {worker} failed")]
    Worker {
        /// The worker's index in the group (its position in `workers()`).
        worker: usize,
        /// What the runtime reported.
        #[source]
        source: RuntimeError,
    },
}

impl WorkerGroupError {
    /// The index of the worker this error is about, if it is about one.
    #[must_use]
    pub const fn worker(&self) -> Option<usize> {
        match self {
            Self::InvalidResources { worker, .. }
            | Self::Start { worker, .. }
            | Self::Worker { worker, .. } => Some(*worker),
            _ => None,
        }
    }

    /// The runtime's error behind this one, if any.
    #[must_use]
    pub const fn runtime_error(&self) -> Option<&RuntimeError> {
        match self {
            Self::Start { source, .. } => Some(source),
            Self::Worker { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether a worker's actor died (a system failure that a restart may cure).
    #[must_use]
    pub fn is_actor_death(&self) -> bool {
        self.runtime_error()
            .is_some_and(RuntimeError::is_actor_death)
    }
}
