//! The actor runtime seam of trainyard: the one interface to whatever runs the workers.
//!
//! Every layer above talks to an [`ActorRuntime`], held as `Arc<dyn ActorRuntime>`. It
//! reserves placement groups of resource bundles (all or nothing), starts actors pinned to
//! bundles, and sends them a closed set of [`Request`]s; [`ActorRuntimeExt`] types the answers.
//! Actors run tasks (a command, or a Rust function of a [`FunctionRegistry`]) and push their
//! [`events`] back. The placement rules all runtimes share are pure functions in [`placement`].
//!
//! # Place bundles without a cluster
//!
//! ```
//! use trainyard_resources::Resources;
//! use trainyard_runtime::placement::{check_feasible, place};
//! use trainyard_runtime::{PlacementGroupFactory, PlacementStrategy};
//!
//! let nodes: [Resources; 2] = ["CPU=4,GPU=2".parse()?, "CPU=4,GPU=2".parse()?];
//! let bundles = vec!["CPU=1,GPU=1".parse()?; 3];
//! let mut group = PlacementGroupFactory { bundles, strategy: PlacementStrategy::StrictPack };
//! // Three GPUs on one two-GPU node can never fit: refused at once, with the reason.
//! assert!(check_feasible(&nodes, &group).is_err());
//! group.strategy = PlacementStrategy::Spread;
//! assert_eq!(place(&nodes, &group), Some(vec![0, 1, 0]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Run a task on the simulated cluster (feature `sim`)
//!
//! ```
//! # #[cfg(not(feature = "sim"))] fn main() {}
//! # #[cfg(feature = "sim")] #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use futures::StreamExt;
//! use trainyard_runtime::events::{self, ActorEvent};
//! use trainyard_runtime::sim::{SimNode, SimRuntime};
//! use trainyard_runtime::{ActorRuntime, ActorRuntimeExt, ActorSpec, FunctionRegistry};
//! use trainyard_runtime::{TaskExit, TaskSpec};
//!
//! let functions = FunctionRegistry::new().register("square", |task| async move {
//!     let n = task.arg().as_u64().ok_or("expected a number")?;
//!     Ok((n * n).into())
//! });
//! let runtime: Arc<dyn ActorRuntime> =
//!     Arc::new(SimRuntime::new([SimNode::new("node-a").cpus(2)]).with_functions(functions));
//! let options = trainyard_resources::ActorOptions::try_from(&"CPU=1".parse()?)?;
//! let (name, env) = ("worker-0".to_owned(), Default::default());
//! let actor = runtime.spawn(ActorSpec { name, options, placement: None, env }).await?;
//! let mut events = events::subscribe(&runtime, actor, Duration::from_millis(10)).await?;
//! let task = TaskSpec::Function { name: "square".into(), arg: 7.into(), env: Default::default() };
//! runtime.run_task(actor, task).await?;
//! while let Some(event) = events.next().await {
//!     if let ActorEvent::TaskExited { exit, .. } = event {
//!         assert_eq!(exit, TaskExit::Succeeded { value: 49.into() });
//!         break;
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # Main types
//!
//! - [`ActorRuntime`] and [`ActorRuntimeExt`]; [`ActorSpec`], [`Request`], [`Response`] and
//!   [`TaskSpec`]; [`TaskExit`] and [`DeathCause`], how tasks and actors end; [`RuntimeError`].
//! - [`FunctionRegistry`] and [`TaskContext`]: Rust functions that actors run by name.
//! - Doubles, behind features: `sim` (an in-memory cluster that really schedules), `mocks`
//!   (mockall's `MockActorRuntime`) and `conformance` (checks every runtime passes).
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]
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
mod reach;
pub mod reservations;
pub mod root_cause;
mod runtime;
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;
pub mod stacks;
mod task;
pub mod timings;

pub use cluster::{ACCELERATOR_RESOURCES, ClusterSnapshot, Holder, NodeInfo, Shortage};
pub use error::RuntimeError;
pub use ids::{ActorId, AttemptNumber, NodeId, PlacementGroupId};
pub use outcome::{DeathCause, TaskExit, TaskFailure, TaskRejection, signal_name};
pub use protocol::{
    PREFLIGHT_PROBE, PollResult, RESTORE_PATIENCE, Request, Response, STOP_PERSIST_PATIENCE,
    Stream, TaskEvent, TaskSpec, TaskStatus, WorkerInfo,
};
pub use reach::{Endpoint, Reach, Unreachable};
#[cfg(any(test, feature = "mocks"))]
#[cfg_attr(docsrs, doc(cfg(feature = "mocks")))]
pub use runtime::MockActorRuntime;
pub use runtime::{ActorRuntime, ActorRuntimeExt, ActorSpec, PlacementInfo};
pub use task::{FunctionRegistry, TaskContext, TaskResult, builtins, drive};
pub use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
