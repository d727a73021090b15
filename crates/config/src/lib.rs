//! Configuration of a trainyard run: how many workers, what each needs, where they go, and
//! how failures are handled.
//!
//! [`ScalingConfig`] normalises a user's resource dictionary exactly as Ray Train does and
//! produces the [`PlacementGroupFactory`] that the runtime reserves:
//!
//! ```
//! use trainyard_config::{PlacementStrategy, ScalingConfig};
//!
//! let config = ScalingConfig::from_toml_str(
//!     r#"
//!     num_workers = 4
//!     use_gpu = true
//!     resources_per_worker = { CPU = 1, GPU = 1, memory = "10GB" }
//!     placement_strategy = "SPREAD"
//!     "#,
//! )?;
//! let factory = config.placement_group_factory()?;
//! assert_eq!(factory.bundles.len(), 4);
//! assert_eq!(factory.strategy, PlacementStrategy::Spread);
//! assert_eq!(config.total_resources()?.to_string(), "CPU=4,GPU=4,memory=40000000000");
//! # Ok::<(), trainyard_config::ConfigError>(())
//! ```

mod error;
mod load;
mod plan;
mod run;
mod scaling;
mod strategy;

pub use error::ConfigError;
pub use load::Format;
pub use plan::{Plan, WorkerPlan};
pub use run::{FailureConfig, RunConfig};
pub use scaling::{
    ACCELERATOR_TYPE_AMOUNT, ACCELERATOR_TYPE_PREFIX, MAX_WORKERS, PlacementGroupFactory,
    ScalingConfig, checked_num_workers,
};
pub use strategy::{PlacementStrategy, UnknownStrategy};
pub use trainyard_resources as resources;
