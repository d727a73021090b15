//! PyTorch's process-group environment for trainyard workers.
//!
//! [`TorchBackend`] is a [`Backend`](trainyard_backend_executor::Backend) that gives every
//! worker what `torch.distributed.init_process_group` and `torchrun` scripts read —
//! `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//! `NODE_RANK`, `TORCHELASTIC_RESTART_COUNT`, ... — so a script written for `torchrun` runs
//! unchanged. The master is rank 0's node and a port found free there; the process group uses
//! `nccl` when the workers have GPUs and `gloo` otherwise, unless [`TorchConfig`] says which.
//!
//! # Run workers with the torchrun environment
//!
//! ```
//! use std::sync::Arc;
//! use trainyard_backend_executor::{BackendConfig, BackendExecutor};
//! use trainyard_config::ScalingConfig;
//! use trainyard_runtime::TaskSpec;
//! use trainyard_runtime::sim::{SimNode, SimRuntime};
//! use trainyard_torch_backend::{BACKEND_VAR, TorchConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = Arc::new(SimRuntime::new([
//!     SimNode::new("node-a").ip("10.0.0.1").cpus(2),
//!     SimNode::new("node-b").ip("10.0.0.2").cpus(2),
//! ]));
//! let scaling = ScalingConfig::default().num_workers(4);
//! let mut executor = BackendExecutor::new(cluster, TorchConfig::default().build(), scaling)?;
//! // `trainyard.env`, a built-in function, returns the environment its task got.
//! let env = Default::default();
//! let task = TaskSpec::Function { name: "trainyard.env".into(), arg: ().into(), env };
//! let report = executor.fit(&task).await?;
//! let rank_3 = &report.returns[3];
//! for (name, value) in [("RANK", "3"), ("LOCAL_RANK", "1"), (BACKEND_VAR, "gloo")] {
//!     assert_eq!(rank_3[name], value);
//! }
//! assert_eq!(rank_3["MASTER_ADDR"], "10.0.0.1"); // rank 0's node
//! # Ok(()) }
//! ```
//!
//! # Configure it, or compute the variables yourself
//!
//! ```
//! use trainyard_backend_executor::assign_ranks;
//! use trainyard_torch_backend::{ProcessGroupBackend, TorchConfig, torchrun_env};
//!
//! let config = TorchConfig { backend: "nccl".parse()?, timeout_s: 600, ..TorchConfig::default() };
//! assert_eq!(config.backend, ProcessGroupBackend::Nccl);
//!
//! let ranks = assign_ranks(&["node-a", "node-a", "node-b"]);
//! let env = torchrun_env(&ranks[2], 0, -1); // first attempt, unlimited restarts
//! assert_eq!((env["RANK"].as_str(), env["GROUP_RANK"].as_str()), ("2", "1"));
//! assert_eq!(env["TORCHELASTIC_MAX_RESTARTS"], "-1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Main types
//!
//! - [`TorchConfig`] ([`ProcessGroupBackend`], [`InitMethod`]) builds a [`TorchBackend`]
//!   through [`BackendConfig`](trainyard_backend_executor::BackendConfig).
//! - [`torchrun_env`]: the per-rank variables; [`BACKEND_VAR`], [`INIT_METHOD_VAR`] and
//!   [`TIMEOUT_VAR`]: the process-group settings every worker gets.
//! - [`UnknownChoice`]: a backend or init method that does not exist.

mod config;

pub use config::{
    BACKEND_VAR, INIT_METHOD_VAR, InitMethod, ProcessGroupBackend, TIMEOUT_VAR, TorchBackend,
    TorchConfig, UnknownChoice, torchrun_env,
};
