//! Backends, ranks and the training run of trainyard.
//!
//! A [`BackendExecutor`] takes a [`ScalingConfig`](trainyard_config::ScalingConfig) to running
//! workers on any [`ActorRuntime`](trainyard_runtime::ActorRuntime): it reserves the placement
//! group, starts a [`WorkerGroup`](trainyard_worker_group::WorkerGroup) sorted by node and GPU,
//! assigns ranks, shares accelerator ids per node, lets a [`Backend`] set up its framework,
//! runs the training task everywhere, and restarts from scratch on failure as Ray Train v2
//! does. The scheduling maths are pure functions over plain data.
//!
//! # Train on a simulated cluster
//!
//! ```
//! use std::sync::Arc;
//! use trainyard_backend_executor::{BackendExecutor, TrainContext};
//! use trainyard_config::{FailureConfig, RunConfig, ScalingConfig};
//! use trainyard_runtime::sim::{SimNode, SimRuntime};
//! use trainyard_runtime::{FunctionRegistry, TaskSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // What every worker runs: it reads its ranks, reports, and returns its local rank.
//! let functions = FunctionRegistry::new().register("train", |task| async move {
//!     let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
//!     ctx.report(serde_json::json!({"loss": 0.5})).map_err(|e| e.to_string())?;
//!     Ok(ctx.local_rank().into())
//! });
//! let nodes = [SimNode::new("node-a").cpus(2), SimNode::new("node-b").cpus(2)];
//! let cluster = Arc::new(SimRuntime::new(nodes).with_functions(functions));
//! let scaling = ScalingConfig::default().num_workers(4);
//! # let results = tempfile::tempdir()?;
//! // The run keeps its folder under the storage path (`~/trainyard_results` by default).
//! let run = RunConfig::default()
//!     .name("demo")
//!     .storage_path(results.path().display().to_string())
//!     .failure_config(FailureConfig::restarts(1));
//! let executor = BackendExecutor { scaling, run, ..BackendExecutor::new(cluster) };
//!
//! let report = executor.fit(&TaskSpec::function("train", ().into())).await?;
//! assert!(report.attempts == 1 && report.metrics.iter().all(Option::is_some));
//! assert_eq!(report.returns, [0, 1, 0, 1].map(serde_json::Value::from));
//! # Ok(()) }
//! ```
//!
//! # Ranks without a cluster
//!
//! ```
//! use trainyard_backend_executor::{TrainContext, WorldRank, assign_ranks, rank_env, shared_ids};
//! use trainyard_runtime::TaskContext;
//!
//! // Four workers sorted by node; each GPU worker sees all the run's GPUs of its node.
//! let ranks = assign_ranks(&["a", "a", "b", "b"]);
//! assert_eq!((ranks[2].local_rank, ranks[2].node_rank), (0, 1));
//! let gpus = [("a", vec!["0"]), ("a", vec!["1"]), ("b", vec!["3"]), ("b", vec!["2"])];
//! assert_eq!(shared_ids(&gpus), ["0,1", "0,1", "2,3", "2,3"]);
//!
//! // A worker's task reads its ranks back from its environment.
//! let (events, _) = tokio::sync::mpsc::unbounded_channel();
//! let task = TaskContext::new(().into(), rank_env(&ranks[2], 0, "demo"), events);
//! assert_eq!(TrainContext::new(task)?.world_rank(), WorldRank(2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How a run goes
//!
//! [`BackendExecutor::fit`] opens the run's folder and hands the run to its loop, the one
//! place that owns the folder, the rank logs, the [`StopTrigger`], the [`StacksTrigger`] and
//! the listener of [`RunEvent`]s. For each attempt the loop asks its sizer how many workers
//! to start (the fixed number, or what fits for an elastic run), reserves the placement
//! group, and starts an attempt: the worker group, its ranks and environment, the task on
//! every worker. The attempt reports what its ranks do (reports, lines, root causes,
//! exits, deaths, hangs) and nothing else; the loop books reports towards checkpoints,
//! writes lines to the rank logs, passes both on, and decides when the attempt ends. What
//! follows an attempt is a pure function of the attempts so far and how the last one ended:
//! restart after a backoff, resize, finish or fail.
//!
//! # Main types
//!
//! - [`BackendExecutor`], with [`ExecutorOptions`], [`StopTrigger`] and [`StacksTrigger`]:
//!   what a run is made of; its `fit` runs it. [`FitReport`] and [`RunEvent`] tell what
//!   happened; [`ExecutorError`] and [`AttemptFailure`] what went wrong ([`classify`]).
//! - [`Backend`] and [`BackendConfig`]: framework hooks ([`NoBackend`] sets up nothing).
//! - [`TrainContext`]: a worker's ranks, reports and output, inside its task.
//! - [`assign_ranks`] ([`RankInfo`], [`WorldRank`]) and [`shared_ids`] ([`SharingRule`]).
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod attempt;
mod backend;
mod context;
mod crew;
mod elastic;
mod error;
mod executor;
mod failure;
mod hang;
mod history;
mod logs;
mod options;
mod params;
mod policy;
mod preflight;
mod ranks;
mod report;
mod reporter;
mod reporters;
mod run_folder;
mod run_loop;
mod setup;
mod sharing;
mod sink;
mod tally;
pub mod timings;
mod triggers;

/// The attribute that [`Backend`] implementations go under (from the `async-trait` crate).
pub use async_trait::async_trait;
pub use backend::{
    Backend, BackendConfig, BackendContext, BackendError, NoBackend, WorkerAddress, WorkerEnv,
};
pub use context::{
    ContextError, LOCAL_RANK, LOCAL_WORLD_SIZE, MetricsError, NODE_RANK, RESTART_COUNT, RUN_NAME,
    TrainContext, WORLD_RANK, WORLD_SIZE, rank_env,
};
pub use elastic::{ResizeReason, workers_that_fit};
pub use error::ExecutorError;
pub use executor::BackendExecutor;
pub use failure::{AttemptFailure, Backoff, Disposition, PreflightTarget, classify};
pub use hang::{RankStacks, STACKS_LIMIT, StacksReason, full_dump};
pub use options::{
    DEFAULT_PLACEMENT_TIMEOUT, DriverNote, ExecutorOptions, RESTARTS_TARGET, unique_run_name,
};
pub use ranks::{RankInfo, WorldRank, assign_ranks};
pub use report::{FitReport, RUN_EVENTS_VERSION, RunEvent, StartedWorker};
pub use reporter::{Finishing, Reporter};
#[allow(deprecated, reason = "kept for one release; it says what replaces it")]
pub use run_folder::set_driver_command;
pub use run_folder::{CheckpointResult, SLURM_DETACHED_VAR};
// Where they were before they moved to the checkpoint crate, beside the records they read.
pub use sharing::{
    AcceleratorView, MissingAcceleratorIds, SharingRule, accelerator_env, default_rules, shared_ids,
};
pub use tally::LAST_LINES;
pub use trainyard_checkpoint::{DriverLiveness, driver_liveness, driver_lock_holder, host_name};
pub use triggers::{StacksTrigger, StopTrigger};
