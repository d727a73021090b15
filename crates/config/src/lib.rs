//! The configuration of a trainyard run: how many workers, what each needs, how they are laid
//! over nodes, and how failures are handled.
//!
//! A [`ScalingConfig`] is plain data, built with setters or read from TOML or JSON. It
//! normalises the per-worker resource dictionary exactly as Ray Train does and resolves to a
//! [`Plan`]: the [`PlacementGroupFactory`] a runtime reserves, and the
//! [`ActorOptions`](trainyard_resources::ActorOptions) each worker is started with. A
//! [`RunConfig`] names the run, sets its workers' environment and its restart policy.
//!
//! # Build a scaling config and plan it
//!
//! ```
//! use trainyard_config::{PlacementStrategy, ScalingConfig};
//!
//! let config = ScalingConfig::default()
//!     .num_workers(4)
//!     .use_gpu(true) // adds `GPU: 1` to each worker's dictionary
//!     .resources_per_worker("CPU=2,memory=10GB".parse()?)
//!     .placement_strategy(PlacementStrategy::Spread);
//! let plan = config.plan()?;
//! assert_eq!(plan.placement_group_factory.bundles.len(), 4);
//! assert_eq!(plan.total_resources.to_string(), "CPU=8,GPU=4,memory=40000000000");
//! assert_eq!(plan.workers[3].actor_options.num_gpus.to_string(), "1");
//! println!("{plan}"); // the table `trainyard plan` prints
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Read it from a file, and set up the run
//!
//! ```
//! use trainyard_config::{ConfigError, FailureConfig, RunConfig, ScalingConfig};
//!
//! // `ScalingConfig::from_path` reads a `.toml` or `.json` file the same way.
//! let config = ScalingConfig::from_toml_str(
//!     r#"
//!     num_workers = 2
//!     resources_per_worker = { CPU = 1, memory = "1GiB" }
//!     "#,
//! )?;
//! assert_eq!(config.worker_resources()?.to_string(), "CPU=1,memory=1073741824");
//! // Unknown fields are errors that name the field.
//! let typo = ScalingConfig::from_toml_str("num_worker = 2");
//! assert!(matches!(typo, Err(ConfigError::Parse { .. })));
//!
//! let run = RunConfig::default()
//!     .name("mnist")
//!     .failure_config(FailureConfig::restarts(2))
//!     .env("OMP_NUM_THREADS", "4");
//! run.validate()?;
//! assert!(run.failure_config.should_restart(2) && !run.failure_config.should_restart(3));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Main types
//!
//! - [`ScalingConfig`]: workers, their resources, strategy and accelerator type.
//! - [`Plan`] and [`WorkerPlan`]: what a scaling config resolves to, before anything starts.
//! - [`PlacementGroupFactory`] and [`PlacementStrategy`]: the bundles a runtime reserves.
//! - [`RunConfig`] and [`FailureConfig`]: the run's name, environment and restarts.
//! - [`ConfigError`]: what is wrong, naming the field; [`resources`] re-exports
//!   [`trainyard_resources`].
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod error;
mod load;
mod plan;
mod run;
mod scaling;
mod strategy;
mod workers;

pub use error::ConfigError;
pub use load::Format;
pub use plan::{Plan, WorkerPlan};
pub use run::{
    CheckpointConfig, FailureConfig, ProgressSource, ResumePolicy, RunConfig, ScoreOrder,
    check_run_name, parse_hang_timeout, parse_resize_interval,
};
pub use scaling::{
    ACCELERATOR_TYPE_AMOUNT, ACCELERATOR_TYPE_PREFIX, MAX_WORKERS, PlacementGroupFactory,
    ScalingConfig, checked_num_workers,
};
pub use strategy::{PlacementStrategy, UnknownStrategy};
pub use trainyard_resources as resources;
pub use workers::{DEFAULT_RESIZE_INTERVAL, NumWorkers};
