//! The Slurm runtime of trainyard: the same workers as on this machine or on Ray, as job
//! steps of a Slurm allocation, with Slurm's cgroups holding each to its CPUs, memory and
//! GPUs.
//!
//! [`SlurmRuntime`] is an [`ActorRuntime`](trainyard_runtime::ActorRuntime) on the agent hub
//! (`trainyard-hub`), like the local and Ray runtimes:
//!
//! - **Inside an allocation** (`$SLURM_JOB_ID`, under `sbatch` or `salloc`): placement groups
//!   are laid over the allocation's nodes, each with what the job holds there.
//! - **Outside one**: the first placement group requests an allocation that fits it
//!   (`salloc`, shaped by the group's strategy: see [`request`]), after checking against
//!   Slurm's node table that some set of the partition's nodes can ever hold it; the
//!   allocation lives as long as the runtime, and is released however the driver ends
//!   ([`allocation`] says how, SIGKILL included). While Slurm queues it,
//!   [`SlurmPlacer::queued`] has the job id and Slurm's pending reason.
//! - **Workers**: each actor's agent is started as its own job step on its bundle's node,
//!   `srun --jobid J --nodes 1 --ntasks 1 --exact --nodelist NODE --cpus-per-task C
//!   [--mem M] [--gpus-per-task G]`; the run's token reaches it on its stdin, and it
//!   connects back to the driver over TCP. A worker that asked for memory is held to it by
//!   Slurm; one that did not shares the job's memory on its node.
//! - **Ends**: an OOM kill in the step is the worker's memory limit; a cancellation
//!   (`scancel`), a time limit, a preemption and a node failure are each their own
//!   [`DeathCause`](trainyard_runtime::DeathCause), read from what Slurm prints on `srun`'s
//!   stderr and from the job's state. A `SIGUSR1` from Slurm (`--signal=USR1@90`, `scancel
//!   --signal=USR1`) reaches the agents, which hand it on to their tasks.
//!
//! Slurm hands out whole CPUs and memory in MiB, so bundles are rounded up to them (a bundle
//! without CPUs gets one: every step runs on at least one).
//!
//! ```no_run
//! use trainyard_runtime_slurm::{SlurmConfig, SlurmRuntime};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let slurm = SlurmRuntime::start(SlurmConfig::new("my-run")?).await?;
//! // ... a Trainer on `slurm` ...
//! slurm.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! ## Testing
//!
//! `scripts/slurm-env.sh` installs Debian's Slurm packages and starts a controller with four
//! fake nodes on this machine; with the `testing` feature, `testing` finds that cluster (as
//! root it runs the script itself) or says why the tests skip.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

pub mod allocation;
mod config;
mod error;
pub mod request;
mod runtime;
pub mod slurm;
mod step;
#[cfg(feature = "testing")]
pub mod testing;

pub use allocation::Queued;
pub use config::{AGENT_BIN_VAR, AllocationOptions, JOB_ID_VAR, SlurmConfig};
pub use error::SlurmError;
pub use runtime::{Placed, SlurmLauncher, SlurmPlacer, SlurmRuntime};
