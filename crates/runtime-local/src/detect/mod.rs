//! What this machine offers to workers, the user's overrides, and the split of the machine
//! into virtual nodes.
//!
//! [`Machine::detect`] reads the CPUs, memory and GPUs a worker may use: the affinity mask
//! bounded by the cgroup CPU quota (kept exact when fractional), `MemTotal` bounded by the
//! cgroup memory limit, and `CUDA_VISIBLE_DEVICES` or else `nvidia-smi`. [`plan_nodes`]
//! applies the command-line [`Overrides`] and deals the machine out to `--nodes`
//! [`LocalNode`]s. Every parser is a pure function over text and the split is a pure function
//! over plain data; only a thin layer reads files and runs commands.
//!
//! One module per concern: `cpu_memory` (the affinity mask, `MemTotal` and the cgroup limits),
//! `gpus` (`CUDA_VISIBLE_DEVICES` and `nvidia-smi`), `nodes` (the split) and `command` (running
//! a program with a deadline).
//!
//! ```
//! use trainyard_resources::{CPU, MEMORY, ResourceAmount};
//! use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
//!
//! let machine = Machine {
//!     hostname: "box".into(),
//!     cpus: "1.5".parse()?,
//!     memory: 1000,
//!     gpus: Vec::new(),
//! };
//! let overrides = Overrides { num_gpus: Some(2), ..Overrides::default() };
//! let nodes = plan_nodes(&machine, &overrides, 2)?;
//! assert_eq!(nodes[1].id.as_str(), "local-1");
//! assert_eq!(nodes[1].resources.amount(CPU), "0.75".parse()?);
//! assert_eq!(nodes[1].resources.amount(MEMORY), ResourceAmount::from(500u32));
//! assert_eq!(nodes[1].gpu_ids, ["1"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use trainyard_resources::{ResourceAmount, Resources};
use trainyard_runtime::NodeId;

mod command;
mod cpu_memory;
mod gpus;
mod nodes;

pub use nodes::plan_nodes;

/// The most virtual nodes [`plan_nodes`] makes.
pub const MAX_NODES: u32 = 1024;

/// The most GPUs `--num-gpus` may ask for (real or made up).
pub const MAX_GPUS: u32 = 4096;

/// One GPU of this machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gpu {
    /// What a worker's `CUDA_VISIBLE_DEVICES` names it by: an index (`0`), a `GPU-<uuid>` or
    /// a `MIG-<uuid>`. GPUs found by `nvidia-smi` are named by UUID, which unlike an index
    /// does not depend on `CUDA_DEVICE_ORDER`.
    pub id: String,
    /// The product name (`NVIDIA H200`), when known.
    pub name: Option<String>,
    /// Total memory in bytes, when known.
    pub memory: Option<u64>,
}

/// What this machine offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// The host name; `localhost` when it cannot be read.
    pub hostname: String,
    /// Usable CPUs: the affinity mask bounded by the cgroup CPU quota, which may be fractional.
    pub cpus: ResourceAmount,
    /// Usable memory in bytes: `MemTotal` bounded by the cgroup memory limit.
    pub memory: u64,
    /// The GPUs workers may use, in the order they are handed out.
    pub gpus: Vec<Gpu>,
}

impl Machine {
    /// Detects what this machine offers. Never fails: what cannot be read falls back (to
    /// `available_parallelism`, to no cgroup limit, to no GPU) and is logged.
    ///
    /// Call it before pinning the calling thread, whose affinity mask bounds the CPU count.
    /// It blocks while `nvidia-smi` runs (a few seconds at most); from async code call it
    /// inside `spawn_blocking`.
    #[must_use]
    pub fn detect() -> Self {
        Self {
            hostname: detect_hostname(),
            cpus: cpu_memory::detect_cpus(),
            memory: cpu_memory::detect_memory(),
            gpus: gpus::detect_gpus(),
        }
    }
}

/// What the user set on the command line (`--num-cpus`, `--num-gpus`, `--memory`,
/// `--resources`); each set field replaces what was detected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--num-cpus`: the CPUs of the whole machine.
    pub num_cpus: Option<ResourceAmount>,
    /// `--num-gpus`: the first N detected GPUs; when fewer were detected, the missing ones are
    /// made up with the next unused indexes (`0`, `1`, ...), so GPUs can be faked.
    pub num_gpus: Option<u32>,
    /// `--memory`: the bytes of the whole machine.
    pub memory: Option<u64>,
    /// `--resources`: custom resources of the whole machine; `CPU`, `GPU` and `memory` have
    /// their own options and are refused here.
    pub resources: Resources,
}

/// One (virtual) node of the local runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalNode {
    /// `local-0`, `local-1`, ...
    pub id: NodeId,
    /// What the node offers: `CPU`, `memory` (bytes), `GPU` (a count) and custom resources.
    /// A resource the node has none of is absent, never zero.
    pub resources: Resources,
    /// The `CUDA_VISIBLE_DEVICES` entries of the node's GPUs, as many as its `GPU` amount.
    pub gpu_ids: Vec<String>,
}

/// Why the machine cannot be split into nodes as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DetectError {
    /// `--nodes` is zero or above [`MAX_NODES`].
    #[error("--nodes must be between 1 and {max}, got {nodes}", max = MAX_NODES)]
    NodeCount {
        /// The number of nodes asked for.
        nodes: u32,
    },
    /// `--num-gpus` is above [`MAX_GPUS`].
    #[error("--num-gpus must be at most {max}, got {gpus}", max = MAX_GPUS)]
    GpuCount {
        /// The number of GPUs asked for.
        gpus: u32,
    },
    /// `--resources` names a resource that has its own option.
    #[error("resource `{name}` cannot be set with --resources, use {option} instead")]
    ReservedInResources {
        /// The resource named.
        name: String,
        /// The option to use instead (`--num-cpus`, `--num-gpus` or `--memory`).
        option: &'static str,
    },
}

fn detect_hostname() -> String {
    match nix::unistd::gethostname().map(std::ffi::OsString::into_string) {
        Ok(Ok(name)) if !name.is_empty() => name,
        Ok(name) => {
            tracing::warn!(
                ?name,
                "the host name is empty or not UTF-8; using localhost"
            );
            "localhost".to_owned()
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read the host name; using localhost");
            "localhost".to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_offers_at_least_one_cpu_and_some_memory() {
        let machine = Machine::detect();
        assert!(machine.cpus >= ResourceAmount::ONE, "{machine:?}");
        assert!(machine.memory > 0, "{machine:?}");
        assert!(!machine.hostname.is_empty());
    }
}
