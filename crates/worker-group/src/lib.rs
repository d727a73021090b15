//! A group of worker actors pinned to the bundles of a placement group.
//!
//! A [`WorkerGroup`] holds the actors of one training run. Its life has four steps, which
//! the example below walks through on the simulated cluster of `trainyard-runtime`:
//!
//! 1. **Build** it from one resource dictionary per worker and a placement group that its
//!    owner has reserved, one bundle per worker ([`WorkerGroup::new`]). Each dictionary is
//!    turned into the actor options the worker is started with (`ActorOptions::try_from`,
//!    the one conversion of the `resources` crate); nothing runs yet.
//! 2. **Start** it ([`WorkerGroup::start`]): actor `i` is spawned in bundle `i`, and the group
//!    learns where each worker runs and which devices it holds ([`WorkerMetadata`]).
//!    [`WorkerGroup::sort_workers_by_node_and_gpu`] then makes the workers of one node
//!    contiguous and sorted by GPU id, which is how ranks are laid out (the ordering itself
//!    is the pure function [`node_and_gpu_order`]).
//! 3. **Use** it: a request goes to every worker at once ([`WorkerGroup::execute`]), the
//!    answers coming back in worker order, or to one ([`WorkerGroup::execute_single`]).
//!    Workers can be removed, which frees their bundles, and added in the bundles that are
//!    free ([`WorkerGroup::remove_workers`], [`WorkerGroup::add_workers`]).
//! 4. **Shut it down** ([`WorkerGroup::shutdown`]): every actor is asked to stop, and killed
//!    if it does not within the patience. A shutdown cannot fail; a group that has been
//!    shut down can be started again. The placement group is left to its owner.
//!
//! Every error is a [`WorkerGroupError`] that says which worker failed, where one did.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use trainyard_resources::Resources;
//! use trainyard_runtime::sim::{SimNode, SimRuntime};
//! use trainyard_runtime::{ActorRuntime, PlacementGroupFactory, PlacementStrategy, Request};
//! use trainyard_worker_group::{WorkerGroup, WorkerGroupError};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A simulated cluster: two nodes with two GPUs each.
//! let runtime: Arc<dyn ActorRuntime> = Arc::new(SimRuntime::new([
//!     SimNode::new("node-a").cpus(4).gpus(2),
//!     SimNode::new("node-b").cpus(4).gpus(2),
//! ]));
//!
//! // The owner reserves one bundle per worker.
//! let per_worker: Resources = "CPU=1,GPU=1".parse()?;
//! let factory = PlacementGroupFactory {
//!     bundles: vec![per_worker.clone(); 4],
//!     strategy: PlacementStrategy::Spread,
//! };
//! let pg = runtime.create_placement_group(&factory).await?;
//! runtime.wait_placement_group_ready(pg, Duration::from_secs(10)).await?;
//!
//! // 1. Build: nothing runs yet.
//! let mut group = WorkerGroup::new(Arc::clone(&runtime), pg, vec![per_worker.clone(); 4])?;
//! assert!(group.is_empty());
//!
//! // 2. Start, then lay the workers out by node and GPU.
//! group.start().await?;
//! group.sort_workers_by_node_and_gpu(None);
//! for worker in group.workers() {
//!     println!("bundle {} on {}", worker.bundle_index, worker.metadata.node_id);
//! }
//!
//! // 3. Use: one request to every worker, answers in worker order.
//! let answers = group.execute(Request::NodeInfo).await?;
//! assert_eq!(answers.len(), 4);
//! // Replace the last worker: removing it frees its bundle, adding fills it again.
//! group.remove_workers(&[3]).await?;
//! group.add_workers(vec![per_worker]).await?;
//! assert_eq!(group.len(), 4);
//!
//! // 4. Shut down: the group takes no more requests.
//! group.shutdown(Duration::from_secs(5)).await;
//! assert!(matches!(
//!     group.execute(Request::NodeInfo).await,
//!     Err(WorkerGroupError::NotActive)
//! ));
//! runtime.remove_placement_group(pg).await?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod error;
mod group;
mod order;

pub use error::WorkerGroupError;
pub use group::{DEFAULT_NAME_PREFIX, KILL_TIMEOUT, Worker, WorkerGroup, WorkerMetadata};
pub use order::node_and_gpu_order;
