//! PyTorch's process-group environment for trainyard workers.
//!
//! [`TorchBackend`] gives every worker what `torch.distributed.init_process_group` and
//! `torchrun` scripts read — `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `LOCAL_RANK`,
//! `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `NODE_RANK`, `GROUP_RANK`, `ROLE_RANK`,
//! `ROLE_WORLD_SIZE`, `TORCHELASTIC_RESTART_COUNT`, `TORCHELASTIC_MAX_RESTARTS` — so a script
//! written for `torchrun` runs unchanged. The master is rank 0's node and a port found free
//! there.

mod config;

pub use config::{
    BACKEND_VAR, INIT_METHOD_VAR, InitMethod, ProcessGroupBackend, TIMEOUT_VAR, TorchBackend,
    TorchConfig, UnknownChoice, torchrun_env,
};
