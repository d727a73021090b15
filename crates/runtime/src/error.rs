use std::sync::Arc;
use std::time::Duration;

use trainyard_resources::ResourceAmount;

use crate::placement::PlacementError;
use crate::{ActorId, DeathCause, PlacementGroupId, Shortage, TaskRejection};

/// Why a runtime operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The placement group can never fit on the cluster as it is (its message is the
    /// [`PlacementError`]'s: which bundle needs what, and the most any node has).
    #[error(transparent)]
    Infeasible(#[from] PlacementError),
    /// The placement group did not become ready in time.
    #[error("placement group {pg} was not ready after {waited:?}")]
    PlacementTimeout {
        /// The group.
        pg: PlacementGroupId,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The placement group fits the cluster but not what other runs leave free now, and the
    /// runtime was told not to wait.
    #[error("placement group {} cannot be reserved now: {}", .0.pg, .0)]
    Busy(Box<Shortage>),
    /// The cluster's scheduler refused the placement group outright (Slurm would never
    /// grant the allocation that holds it, say).
    #[error("{scheduler} refused the placement group: {reason}")]
    Refused {
        /// The scheduler (`Slurm`).
        scheduler: &'static str,
        /// What it said.
        reason: String,
    },
    /// The runtime's own machinery failed: the local runtime's machine-wide ledger, the Ray
    /// runtime's bridge to its cluster.
    #[error("cannot {action}")]
    Backend {
        /// What was being done.
        action: &'static str,
        /// Why it failed.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// No such placement group (never created, or removed).
    #[error("unknown placement group {0}")]
    UnknownPlacementGroup(PlacementGroupId),
    /// The placement group is not reserved (yet, or again after losing a node).
    #[error("placement group {0} is not ready")]
    PlacementGroupNotReady(PlacementGroupId),
    /// A bundle index beyond the group's bundles.
    #[error("placement group {pg} has {bundles} bundles; there is no bundle {index}")]
    NoSuchBundle {
        /// The group.
        pg: PlacementGroupId,
        /// The index asked for.
        index: usize,
        /// How many bundles the group has.
        bundles: usize,
    },
    /// An actor does not fit into what is left of its bundle.
    #[error("actor `{name}` needs {resource}={needed} but bundle {index} of {pg} has {left} left")]
    BundleTooSmall {
        /// The actor's name.
        name: String,
        /// The group.
        pg: PlacementGroupId,
        /// The bundle.
        index: usize,
        /// The resource that is short.
        resource: String,
        /// What the actor needs.
        needed: ResourceAmount,
        /// What the bundle has left.
        left: ResourceAmount,
    },
    /// The actor could not be started.
    #[error("cannot start actor `{name}`: {reason}")]
    SpawnFailed {
        /// The actor's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// No such actor (never spawned, or killed).
    #[error("unknown actor {0}")]
    UnknownActor(ActorId),
    /// The actor died (its process or node is gone): a system failure, not a user error.
    #[error("{actor} died: {cause}")]
    ActorDied {
        /// The actor.
        actor: ActorId,
        /// Why.
        cause: DeathCause,
    },
    /// The actor refused to start a task.
    #[error("{actor} cannot start the task: {rejection}")]
    TaskRejected {
        /// The actor.
        actor: ActorId,
        /// Why.
        rejection: TaskRejection,
    },
    /// The actor answered a request with the wrong kind of response.
    #[error("{actor} answered `{request}` with an unexpected response")]
    UnexpectedResponse {
        /// The actor.
        actor: ActorId,
        /// The request's name.
        request: &'static str,
    },
    /// The actor cannot run this request here.
    #[error("{actor} cannot serve `{request}`: {reason}")]
    Unsupported {
        /// The actor.
        actor: ActorId,
        /// The request's name.
        request: &'static str,
        /// Why.
        reason: String,
    },
}

impl RuntimeError {
    /// Whether this is a worker's or node's death (a system failure that a restart may cure).
    #[must_use]
    pub const fn is_actor_death(&self) -> bool {
        matches!(self, Self::ActorDied { .. } | Self::UnknownActor(_))
    }
}
