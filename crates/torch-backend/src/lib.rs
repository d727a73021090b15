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
//! let backend = TorchConfig::default().build();
//! let executor = BackendExecutor { backend, scaling, ..BackendExecutor::new(cluster) };
//! // `trainyard.env`, a built-in function, returns the environment its task got.
//! let task = TaskSpec::function("trainyard.env", ().into());
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
//! let env = torchrun_env(&ranks, "resnet", 0, -1); // first attempt, unlimited restarts
//! assert_eq!((env[2]["RANK"].as_str(), env[2]["GROUP_RANK"].as_str()), ("2", "1"));
//! assert_eq!(env[2]["GROUP_WORLD_SIZE"], "2"); // two nodes
//! assert_eq!(env[2]["TORCHELASTIC_RUN_ID"], "resnet");
//! assert_eq!(env[2]["TORCHELASTIC_MAX_RESTARTS"], "-1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Compared with torchrun
//!
//! torchrun 2.x (`LocalElasticAgent._start_workers`) gives each worker `RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `GROUP_WORLD_SIZE`,
//! `ROLE_RANK`, `ROLE_WORLD_SIZE`, `ROLE_NAME`, `MASTER_ADDR`, `MASTER_PORT`,
//! `TORCHELASTIC_RESTART_COUNT`, `TORCHELASTIC_MAX_RESTARTS`, `TORCHELASTIC_RUN_ID`,
//! `TORCHELASTIC_USE_AGENT_STORE`, `TORCHELASTIC_ERROR_FILE` and
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING`. Every worker here gets the same names, with one
//! node as torchrun's worker group (`GROUP_RANK` is the node's index, `GROUP_WORLD_SIZE`
//! the number of nodes the run's workers are on) and one role, `default` (`ROLE_RANK` is
//! `RANK`, `ROLE_WORLD_SIZE` is `WORLD_SIZE`). Where the values differ, on purpose:
//!
//! - `LOCAL_WORLD_SIZE` is the number of the run's workers on the worker's node. torchrun
//!   starts `--nproc-per-node` on every node; a placement strategy may put 3 workers on
//!   one node and 1 on another, and then the nodes' sizes differ (`RANK` is still
//!   contiguous per node, but not `GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK`).
//! - `TORCHELASTIC_RUN_ID` is the run's name as its `RunConfig` gives it (`trainyard run
//!   --name`, or the generated name), in place of torchrun's `--rdzv-id`; torchrun's
//!   default, `none`, where the run config names no run. A run started afresh in a folder
//!   whose name was taken (`--resume never`) keeps the name it was given here;
//!   `TRAINYARD_RUN_NAME` has the folder's.
//! - `TORCHELASTIC_MAX_RESTARTS` is `-1` for unlimited restarts, which torchrun cannot
//!   express.
//! - `TORCHELASTIC_USE_AGENT_STORE` is `False`: no agent hosts a rendezvous store, rank 0
//!   creates it at `MASTER_ADDR:MASTER_PORT` (with `True`, every rank would wait for a
//!   store nobody hosts).
//! - `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` only when the process group is `nccl`, and not
//!   when the run's environment sets it or one of the older names (`NCCL_ASYNC_ERROR_HANDLING`,
//!   `TORCH_NCCL_BLOCKING_WAIT`, `NCCL_BLOCKING_WAIT`); torchrun sets it for `gloo` too.
//! - `OMP_NUM_THREADS` is the worker's whole CPUs (at least 1) unless the run's environment
//!   sets it; torchrun sets `1` with more than one process per node, and passes its own
//!   environment's value (here, give it with the run's environment: `trainyard run --env
//!   OMP_NUM_THREADS=4`).
//! - `CUDA_VISIBLE_DEVICES` is the union of the GPU ids of the run's workers on the node (as
//!   Ray Train does), not torchrun's own environment's value.
//!
//! Added: `NODE_RANK` (`GROUP_RANK`, as Lightning reads it), the process-group settings
//! ([`BACKEND_VAR`], [`INIT_METHOD_VAR`], [`TIMEOUT_VAR`]) and the executor's
//! `TRAINYARD_*` rank variables. Not set: `PYTHON_EXEC` (torchrun reads it, it does not
//! set it). Every variable the backend sets is in
//! [`Backend::owned_env`](trainyard_backend_executor::Backend::owned_env) (a run that set
//! one in its own environment would have it replaced), but for `OMP_NUM_THREADS` and
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING`, which the run's environment may set.
//!
//! # Main types
//!
//! - [`TorchConfig`] ([`ProcessGroupBackend`], [`InitMethod`]) builds a [`TorchBackend`]
//!   through [`BackendConfig`](trainyard_backend_executor::BackendConfig).
//! - [`torchrun_env`]: the variables of every rank; [`BACKEND_VAR`], [`INIT_METHOD_VAR`]
//!   and [`TIMEOUT_VAR`]: the process-group settings every worker gets.
//! - [`UnknownChoice`]: a backend or init method that does not exist.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod config;

pub use config::{
    BACKEND_VAR, INIT_METHOD_VAR, InitMethod, ProcessGroupBackend, TIMEOUT_VAR, TorchBackend,
    TorchConfig, UnknownChoice, torchrun_env,
};
