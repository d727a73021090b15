//! A group of worker actors pinned to the bundles of a placement group.
//!
//! A [`WorkerGroup`] takes one resource dictionary per worker. It converts each into the
//! actor options the worker is started with (`ActorOptions::try_from`, the one conversion
//! of the `resources` crate), starts actor `i` in bundle `i` of a placement group that its
//! owner created, and learns where every worker runs ([`WorkerMetadata`]). Requests then go
//! to every worker at once, answers coming back in worker order; workers can be removed
//! and added; [`WorkerGroup::shutdown`] stops them, gracefully first.
//!
//! Workers can be reordered so that those of one node are contiguous and sorted by GPU id
//! ([`WorkerGroup::sort_workers_by_node_and_gpu`]), which is how ranks are laid out; the
//! ordering itself is the pure function [`node_and_gpu_order`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use trainyard_resources::Resources;
//! use trainyard_runtime::{ActorRuntime, PlacementGroupId, Request};
//! use trainyard_worker_group::{WorkerGroup, WorkerGroupError};
//!
//! async fn run(
//!     runtime: Arc<dyn ActorRuntime>,
//!     pg: PlacementGroupId,
//! ) -> Result<(), Box<dyn std::error::Error>> {
//!     let per_worker: Resources = "CPU=1,memory=1GB".parse()?;
//!     let mut group = WorkerGroup::new(runtime, pg, vec![per_worker; 4])?;
//!     group.start().await?;
//!     group.sort_workers_by_node_and_gpu(None);
//!     let answers = group.execute(Request::NodeInfo).await?;
//!     assert_eq!(answers.len(), 4);
//!     group.shutdown(Duration::from_secs(5)).await?;
//!     assert!(matches!(
//!         group.execute(Request::NodeInfo).await,
//!         Err(WorkerGroupError::NotActive)
//!     ));
//!     Ok(())
//! }
//! ```

mod error;
mod group;
mod order;

pub use error::WorkerGroupError;
pub use group::{DEFAULT_NAME_PREFIX, KILL_TIMEOUT, Worker, WorkerGroup, WorkerMetadata};
pub use order::node_and_gpu_order;
