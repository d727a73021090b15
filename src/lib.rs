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
//! # 1. Plan
//!
//! A scaling config says what each worker needs; its plan is what will be asked of the
//! runtime, one bundle and one set of actor options per worker:
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
//! # 2. A task
//!
//! Every worker runs the same task: a command ([`TaskSpec::command`](runtime::TaskSpec::command),
//! such as `python train.py`) or a Rust function registered by name
//! ([`TaskSpec::function`](runtime::TaskSpec::function)). A function learns its place
//! in the run from a [`TrainContext`](backend::TrainContext) and reports metrics:
//!
//! ```
//! use trainyard::prelude::*;
//!
//! fn functions() -> FunctionRegistry {
//!     FunctionRegistry::new().register("train", |task| async move {
//!         let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
//!         let loss = 1.0 / f64::from(ctx.world_rank().0 + 1);
//!         ctx.report(serde_json::json!({"loss": loss})).map_err(|e| e.to_string())?;
//!         Ok(serde_json::json!(ctx.world_rank().0))
//!     })
//! }
//! let task = TaskSpec::function("train", serde_json::Value::Null);
//! ```
//!
//! # 3. Run it on the simulated cluster
//!
//! A [`Trainer`], built from [`Trainer::builder`], runs the task on a runtime. The in-memory `runtime::sim::SimRuntime`
//! (feature `sim`) places and runs workers as a real cluster does, without processes, which
//! makes it the place for tests:
//!
//! ```
//! # use trainyard::prelude::*;
//! # fn functions() -> FunctionRegistry {
//! #     FunctionRegistry::new().register("train", |task| async move {
//! #         let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
//! #         let loss = 1.0 / f64::from(ctx.world_rank().0 + 1);
//! #         ctx.report(serde_json::json!({"loss": loss})).map_err(|e| e.to_string())?;
//! #         Ok(serde_json::json!(ctx.world_rank().0))
//! #     })
//! # }
//! use std::sync::Arc;
//! use trainyard::runtime::sim::{SimNode, SimRuntime};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> trainyard::Result<()> {
//! let cluster = SimRuntime::new([
//!     SimNode::new("node-a").ip("10.0.0.1").cpus(2),
//!     SimNode::new("node-b").ip("10.0.0.2").cpus(2),
//! ])
//! .with_functions(functions());
//! let task = TaskSpec::function("train", serde_json::Value::Null);
//! let result = Trainer::builder(Arc::new(cluster))
//!     .scaling_config(ScalingConfig::default().num_workers(4))
//!     .fit(&task)
//!     .await?;
//! assert_eq!(result.returns.len(), 4);
//! assert!(result.metrics.iter().all(Option::is_some));
//! # Ok(()) }
//! ```
//!
//! # 4. Run it on this machine
//!
//! The [`LocalRuntime`](local::LocalRuntime) (feature `local`, on by default) starts every
//! worker as a process: your own binary, started again as the worker's agent. So
//! [`run_if_agent`] comes first thing in `main`: in a worker it serves the registered
//! functions and returns the exit code; in the program you started it returns `None`.
//! A `TorchConfig` backend gives the workers PyTorch's environment (`MASTER_ADDR`, `RANK`,
//! ...):
//!
//! ```no_run
//! use std::process::ExitCode;
//! use std::sync::Arc;
//! use trainyard::prelude::*;
//! # fn functions() -> FunctionRegistry { FunctionRegistry::new() }
//! # #[cfg(not(all(feature = "local", feature = "torch")))] fn main() {}
//!
//! # #[cfg(all(feature = "local", feature = "torch"))]
//! fn main() -> ExitCode {
//!     if let Some(code) = trainyard::run_if_agent(functions()) {
//!         return code;
//!     }
//!     let Ok(tokio) = tokio::runtime::Runtime::new() else {
//!         return ExitCode::FAILURE;
//!     };
//!     match tokio.block_on(train()) {
//!         Ok(()) => ExitCode::SUCCESS,
//!         Err(error) => {
//!             // `{:#}`: what failed and every cause, "the training run failed: ...: ..."
//!             eprintln!("error: {error:#}");
//!             ExitCode::FAILURE
//!         }
//!     }
//! }
//!
//! # #[cfg(all(feature = "local", feature = "torch"))]
//! async fn train() -> trainyard::Result<()> {
//!     let local = LocalRuntime::start(LocalConfig::detect("my-run")?).await?;
//!     let result = Trainer::builder(Arc::new(local.clone()))
//!         .backend(&TorchConfig::default())
//!         .scaling_config(ScalingConfig::default().num_workers(2))
//!         .fit(&TaskSpec::function("train", serde_json::Value::Null))
//!         .await;
//!     local.shutdown().await;
//!     println!("returns: {:?}", result?.returns);
//!     Ok(())
//! }
//! ```
//!
//! # 5. The result
//!
//! [`fit`](Trainer::fit) returns a [`FitReport`]: what each rank returned (`returns`), the
//! last metrics of each rank (`metrics`) and the last report of the run (`last_report`),
//! the attempts made and every failed attempt's failure. A run that fails more often than
//! its [`FailureConfig`](config::FailureConfig) allows is an [`Error::Executor`] whose
//! `TrainingFailed` carries the same report:
//!
//! ```
//! use std::sync::Arc;
//! use trainyard::backend::ExecutorError;
//! use trainyard::prelude::*;
//! use trainyard::runtime::sim::{SimNode, SimRuntime};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> trainyard::Result<()> {
//! let functions = FunctionRegistry::new().register("flaky", |_| async { Err("out of data".to_owned()) });
//! let cluster = SimRuntime::new([SimNode::new("node-a").cpus(2)]).with_functions(functions);
//! let error = Trainer::builder(Arc::new(cluster))
//!     .run_config(RunConfig::default().failure_config(FailureConfig::restarts(1)))
//!     .fit(&TaskSpec::function("flaky", serde_json::Value::Null))
//!     .await
//!     .expect_err("every attempt fails");
//! // `{error:#}` says what failed and every cause: what a program prints for its user.
//! let said = format!("{error:#}");
//! assert!(said.starts_with("the training run failed: ") && said.ends_with("out of data"), "{said}");
//! let Error::Executor(ExecutorError::TrainingFailed { report }) = error else {
//!     return Err(error);
//! };
//! assert_eq!(report.attempts, 2);
//! assert_eq!(report.failures.len(), 2);
//! # Ok(()) }
//! ```
//!
//! # 6. A backend of your own
//!
//! A [`Backend`](backend::Backend) sets up a framework around the workers' lifecycle and
//! gives them its environment. Implement it under [`#[async_trait]`](macro@async_trait);
//! the [`BackendContext`](backend::BackendContext) of each hook knows the workers and their
//! ranks, and finds free ports and addresses on them. A backend that is `Clone` is given to
//! [`Trainer::backend`] directly:
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//! use trainyard::async_trait;
//! use trainyard::backend::{Backend, BackendContext, BackendError, WorkerAddress, WorkerEnv};
//! use trainyard::prelude::*;
//! use trainyard::runtime::sim::{SimNode, SimRuntime};
//!
//! /// Tells every worker where rank 0 waits for the others.
//! #[derive(Debug, Clone)]
//! struct Coordinator;
//!
//! #[async_trait]
//! impl Backend for Coordinator {
//!     fn name(&self) -> &str {
//!         "coordinator"
//!     }
//!
//!     async fn on_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
//!         let rank_0 = WorkerAddress {
//!             ip: ctx.group.workers()[0].metadata.node_ip.clone(),
//!             port: ctx.free_port(0).await?,
//!         };
//!         let vars = BTreeMap::from([("COORDINATOR".to_owned(), rank_0.to_string())]);
//!         Ok(vec![vars; ctx.ranks.len()])
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> trainyard::Result<()> {
//! let functions = FunctionRegistry::new().register("where", |task| async move {
//!     Ok(serde_json::json!(task.var("COORDINATOR")))
//! });
//! let cluster = SimRuntime::new([SimNode::new("node-a").ip("10.0.0.1").cpus(2)]).with_functions(functions);
//! let result = Trainer::builder(Arc::new(cluster))
//!     .backend(&Coordinator)
//!     .scaling_config(ScalingConfig::default().num_workers(2))
//!     .fit(&TaskSpec::function("where", serde_json::Value::Null))
//!     .await?;
//! assert_eq!(result.returns[0], result.returns[1]);
//! assert!(result.returns[0].as_str().is_some_and(|a| a.starts_with("10.0.0.1:")));
//! # Ok(()) }
//! ```
//!
//! `examples/tensorflow_backend.rs` does the same for TensorFlow's `TF_CONFIG`, with
//! [`BackendContext::worker_addresses`](backend::BackendContext::worker_addresses).
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod error;
mod trainer;

pub use error::{Error, Result};
pub use trainer::Trainer;
#[cfg(feature = "local")]
pub use trainyard_agent::run_if_agent;
pub use trainyard_backend_executor::{FitReport, async_trait};

#[doc(inline)]
pub use trainyard_backend_executor as backend;
#[doc(inline)]
pub use trainyard_checkpoint as checkpoint;
#[doc(inline)]
pub use trainyard_config as config;
#[doc(inline)]
pub use trainyard_resources as resources;
#[doc(inline)]
pub use trainyard_runtime as runtime;
#[cfg(feature = "local")]
#[doc(inline)]
pub use trainyard_runtime_local as local;
#[cfg(feature = "ray")]
#[doc(inline)]
pub use trainyard_runtime_ray as ray;
#[cfg(feature = "slurm")]
#[doc(inline)]
pub use trainyard_runtime_slurm as slurm;
#[cfg(feature = "torch")]
#[doc(inline)]
pub use trainyard_torch_backend as torch;
#[doc(inline)]
pub use trainyard_worker_group as worker_group;

/// The names most programs need.
pub mod prelude {
    pub use trainyard_backend_executor::{
        Backend, BackendConfig, CheckpointResult, ExecutorOptions, FitReport, NoBackend, RunEvent,
        TrainContext, WorldRank,
    };
    pub use trainyard_config::{
        CheckpointConfig, FailureConfig, PlacementGroupFactory, PlacementStrategy, Plan,
        ResumePolicy, RunConfig, ScalingConfig, ScoreOrder,
    };
    pub use trainyard_resources::{ActorOptions, ByteSize, ResourceAmount, Resources};
    pub use trainyard_runtime::{ActorRuntime, FunctionRegistry, TaskContext, TaskSpec};
    #[cfg(feature = "torch")]
    pub use trainyard_torch_backend::{InitMethod, ProcessGroupBackend, TorchConfig};

    #[cfg(feature = "local")]
    pub use crate::run_if_agent;
    pub use crate::{Error, Result, Trainer};
    #[cfg(feature = "local")]
    pub use trainyard_runtime_local::{LocalConfig, LocalRuntime};
}
