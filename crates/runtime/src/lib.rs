//! The actor runtime seam of trainyard.
//!
//! [`ActorRuntime`] is what every layer above talks to: it reserves placement groups,
//! starts actors pinned to bundles, and sends them a closed set of [`Request`]s. The
//! placement rules shared by every runtime live in [`placement`] as pure functions.
//!
//! Doubles for tests, behind features: `sim` (an in-memory cluster that really schedules,
//! with fault injection by wrapping), `mocks` (mockall's `MockActorRuntime`) and
//! `conformance` (checks every runtime must pass).

mod cluster;
#[cfg(feature = "conformance")]
pub mod conformance;
mod error;
mod ids;
pub mod placement;
mod protocol;
mod runtime;
#[cfg(feature = "sim")]
pub mod sim;
mod task;

pub use cluster::{ACCELERATOR_RESOURCES, ClusterSnapshot, NodeInfo};
pub use error::RuntimeError;
pub use ids::{ActorId, NodeId, PlacementGroupId};
pub use protocol::{
    PollResult, Request, Response, Stream, TaskEvent, TaskSpec, TaskStatus, WorkerInfo,
};
#[cfg(any(test, feature = "mocks"))]
pub use runtime::MockActorRuntime;
pub use runtime::{ActorRuntime, ActorRuntimeExt, ActorSpec, PlacementInfo};
pub use task::{FunctionRegistry, TaskContext, TaskResult, builtins};
pub use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
