//! Backends, rank assignment and the training run of trainyard.
//!
//! A [`BackendExecutor`] takes a scaling config to running workers: it reserves the
//! placement group, starts one worker per bundle, sorts them by node and GPU, assigns ranks
//! ([`assign_ranks`]), shares accelerator ids per node ([`shared_ids`]), lets the
//! [`Backend`] set up its framework, runs the training task, streams reports and logs, and
//! restarts from scratch on failure as Ray Train v2 does.
//!
//! The scheduling maths are pure functions over plain data; the executor only moves data
//! between them and the runtime.

mod backend;
mod context;
mod error;
mod executor;
mod failure;
mod ranks;
mod sharing;

/// The attribute that [`Backend`] implementations go under (from the `async-trait` crate).
pub use async_trait::async_trait;
pub use backend::{
    Backend, BackendConfig, BackendContext, BackendError, NoBackend, WorkerAddress, WorkerEnv,
};
pub use context::{
    ContextError, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, RESTART_COUNT, RUN_NAME, TrainContext,
    WORLD_RANK, WORLD_SIZE, rank_env,
};
pub use error::ExecutorError;
pub use executor::{
    BackendExecutor, DEFAULT_PLACEMENT_TIMEOUT, ExecutorOptions, FitReport, LAST_LINES, RunEvent,
    StartedWorker, unique_run_name,
};
pub use failure::{AttemptFailure, Backoff, Disposition, classify};
pub use ranks::{RankInfo, WorldRank, assign_ranks};
pub use sharing::{
    AcceleratorView, MissingAcceleratorIds, SharingRule, accelerator_env, default_rules, shared_ids,
};
