//! trainyard runs the workers of distributed training jobs.
//!
//! A scaling config ("4 workers, each 1 CPU, 1 GPU and 10 GB of memory, spread over nodes")
//! becomes a placement group, one worker per bundle, each with its rank and the environment
//! its framework needs.
//!
//! This crate is the facade: it re-exports the layers underneath.
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

#[doc(inline)]
pub use trainyard_config as config;
#[doc(inline)]
pub use trainyard_resources as resources;

/// The names most programs need.
pub mod prelude {
    pub use trainyard_config::{
        FailureConfig, PlacementGroupFactory, PlacementStrategy, Plan, RunConfig, ScalingConfig,
    };
    pub use trainyard_resources::{ActorOptions, ByteSize, ResourceAmount, Resources};
}
