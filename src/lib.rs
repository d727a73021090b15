//! trainyard runs the workers of distributed training jobs.
//!
//! A [`ScalingConfig`](config::ScalingConfig) ("4 workers, each 1 CPU, 1 GPU and 10 GB of
//! memory, spread over nodes") becomes a placement group with one worker per bundle; each
//! worker gets its rank and the environment its framework needs, runs the training task,
//! and streams its reports and logs back; failed runs restart from scratch as configured.
//!
//! This crate is the facade over the layers underneath: [`resources`] → [`config`] →
//! [`runtime`] → [`worker_group`] → [`backend`] → [`torch`].
//!
//! ```
//! use trainyard::prelude::*;
//!
//! let config = ScalingConfig::default()
//!     .num_workers(4)
//!     .use_gpu(true)
//!     .resources_per_worker("CPU=1,GPU=1,memory=10GB".parse()?)
//!     .placement_strategy(PlacementStrategy::Spread);
//! let plan = config.plan()?;
//! assert_eq!(plan.workers.len(), 4);
//! assert_eq!(plan.workers[0].actor_options.memory, 10_000_000_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Training runs through a [`Trainer`] (any backend) or a [`TorchTrainer`] on a pluggable
//! runtime; see [`Trainer::fit`].

mod error;
mod trainer;

pub use error::{Error, Result};
#[cfg(feature = "torch")]
pub use trainer::TorchTrainer;
pub use trainer::{TrainResult, Trainer, command_task, function_task};
#[cfg(feature = "local")]
pub use trainyard_agent::run_if_agent;

#[cfg(feature = "local")]
#[doc(inline)]
pub use trainyard_agent as agent;
#[doc(inline)]
pub use trainyard_backend_executor as backend;
#[doc(inline)]
pub use trainyard_config as config;
#[doc(inline)]
pub use trainyard_resources as resources;
#[doc(inline)]
pub use trainyard_runtime as runtime;
#[cfg(feature = "local")]
#[doc(inline)]
pub use trainyard_runtime_local as local;
#[cfg(feature = "torch")]
#[doc(inline)]
pub use trainyard_torch_backend as torch;
#[doc(inline)]
pub use trainyard_worker_group as worker_group;

/// The names most programs need.
pub mod prelude {
    pub use trainyard_backend_executor::{
        Backend, BackendConfig, ExecutorOptions, NoBackend, RunEvent, TrainContext, WorldRank,
    };
    pub use trainyard_config::{
        FailureConfig, PlacementGroupFactory, PlacementStrategy, Plan, RunConfig, ScalingConfig,
    };
    pub use trainyard_resources::{ActorOptions, ByteSize, ResourceAmount, Resources};
    pub use trainyard_runtime::{ActorRuntime, FunctionRegistry, TaskContext, TaskSpec};
    #[cfg(feature = "torch")]
    pub use trainyard_torch_backend::{InitMethod, ProcessGroupBackend, TorchConfig};

    #[cfg(feature = "torch")]
    pub use crate::TorchTrainer;
    #[cfg(feature = "local")]
    pub use crate::run_if_agent;
    pub use crate::{Error, Result, TrainResult, Trainer, command_task, function_task};
    #[cfg(feature = "local")]
    pub use trainyard_runtime_local::{LocalConfig, LocalRuntime};
}
