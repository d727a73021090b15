//! The actor runtime seam of trainyard.
//!
//! [`ActorRuntime`] is what every layer above talks to: it reserves placement groups,
//! starts actors pinned to bundles, and sends them a closed set of [`Request`]s. The
//! placement rules shared by every runtime live in [`placement`] as pure functions.
//!
//! Doubles for tests, behind features: `sim` (an in-memory cluster that really schedules,
//! with fault injection by wrapping), `mocks` (mockall's `MockActorRuntime`) and
//! `conformance` (checks every runtime must pass).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod cluster;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod error;
pub mod events;
mod ids;
mod outcome;
pub mod placement;
mod protocol;
pub mod reservations;
mod runtime;
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;
mod task;

pub use cluster::{ACCELERATOR_RESOURCES, ClusterSnapshot, NodeInfo};
pub use error::RuntimeError;
pub use ids::{ActorId, NodeId, PlacementGroupId};
pub use outcome::{DeathCause, TaskExit, TaskFailure, TaskRejection, signal_name};
pub use protocol::{
    PollResult, Request, Response, Stream, TaskEvent, TaskSpec, TaskStatus, WorkerInfo,
};
#[cfg(any(test, feature = "mocks"))]
#[cfg_attr(docsrs, doc(cfg(feature = "mocks")))]
pub use runtime::MockActorRuntime;
pub use runtime::{ActorRuntime, ActorRuntimeExt, ActorSpec, PlacementInfo};
pub use task::{FunctionRegistry, TaskContext, TaskResult, builtins, drive};
pub use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
