//! Resource quantities and dictionaries for trainyard — the leaf of the workspace.
//!
//! A worker asks for resources with one dictionary: `{"CPU": 1, "GPU": 1, "memory": "10GB"}`.
//! This crate owns the types of that dictionary and the single conversion from it into the
//! options a worker actor is started with:
//!
//! - [`ResourceAmount`]: an exact, non-negative quantity with a precision of 0.0001;
//! - [`ByteSize`]: bytes, parsed from `10000`, `1e9`, `"10GB"` or `"1.5 GiB"`;
//! - [`Resources`]: the dictionary, parsed from JSON or `K=V,K=V` text;
//! - [`ActorOptions`]: `num_cpus`, `num_gpus`, `memory`, `object_store_memory` and custom
//!   `resources`, built with `ActorOptions::try_from(&resources)`.
//!
//! ```
//! use trainyard_resources::{ActorOptions, Resources};
//!
//! let per_worker: Resources = "CPU=1,GPU=1,memory=10GB".parse()?;
//! let options = ActorOptions::try_from(&per_worker)?;
//! assert_eq!(options.memory, 10_000_000_000);
//! assert!(options.resources.is_empty());
//! # Ok::<(), trainyard_resources::ResourceError>(())
//! ```

mod amount;
mod bytes;
mod chain;
mod decimal;
mod options;
mod resources;

pub use amount::{AmountError, ResourceAmount, STEPS_PER_UNIT};
pub use bytes::{BYTE_UNITS, ByteSize, ByteSizeError};
pub use chain::ErrorChain;
pub use options::ActorOptions;
pub use resources::{
    CPU, GPU, MEMORY, OBJECT_STORE_MEMORY, RESERVED, ResourceError, Resources, WHOLE_ABOVE_ONE,
    is_byte_resource, is_reserved,
};
