//! Exact resource quantities and resource dictionaries: the leaf crate of trainyard, types only.
//!
//! A worker asks for what it needs with one dictionary, such as
//! `{"CPU": 1, "GPU": 0.5, "memory": "10GB"}`. This crate parses and checks that dictionary
//! with exact arithmetic (`0.1 + 0.2` GPUs is `0.3`, and sums over many workers never drift),
//! and turns it, in one place, into the options a worker actor is started with.
//!
//! # Parse a dictionary and turn it into actor options
//!
//! ```
//! use trainyard_resources::{ActorOptions, Resources};
//!
//! // JSON or `NAME=AMOUNT` pairs; `memory` and `object_store_memory` take units.
//! let per_worker: Resources = r#"{"CPU": 1, "GPU": 0.5, "memory": "10GB", "ssd": 1}"#.parse()?;
//! assert_eq!(per_worker, "CPU=1,GPU=0.5,memory=10GB,ssd=1".parse()?);
//! assert_eq!(format!("{per_worker:#}"), "CPU=1,GPU=0.5,memory=10GB,ssd=1");
//!
//! // CPU, GPU and the memories become options of their own; the rest stays custom.
//! let options = ActorOptions::try_from(&per_worker)?;
//! assert_eq!(options.num_gpus.to_string(), "0.5");
//! assert_eq!(options.memory, 10_000_000_000);
//! assert_eq!(options.resources.to_string(), "ssd=1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Add up exactly, and say what is wrong
//!
//! ```
//! use trainyard_resources::{ErrorChain, ResourceAmount, Resources};
//!
//! let mut total = Resources::new();
//! for _ in 0..3 {
//!     total.checked_add_assign(&"GPU=0.1".parse()?)?;
//! }
//! assert_eq!(total.amount("GPU"), "0.3".parse::<ResourceAmount>()?);
//! assert!(total.covers(&"GPU=0.3".parse()?));
//!
//! // Errors keep their cause as `source()`; `ErrorChain` prints the chain on one line.
//! let error = "CPU=-1".parse::<Resources>().err().ok_or("a negative amount was accepted")?;
//! assert_eq!(
//!     ErrorChain(&error).to_string(),
//!     "invalid amount for resource `CPU`: amount must not be negative, got -1"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Main types
//!
//! - [`Resources`]: the dictionary, resource name → amount, parsed from JSON or `K=V` text.
//! - [`ResourceAmount`]: an exact, non-negative quantity with a precision of 0.0001.
//! - [`ByteSize`]: bytes, parsed from `10000`, `1e9`, `"10GB"` or `"1.5 GiB"`.
//! - [`ActorOptions`]: `num_cpus`, `num_gpus`, `memory`, `object_store_memory` and custom
//!   `resources`, built with `ActorOptions::try_from(&resources)`.
//! - [`ResourceError`], [`AmountError`] and [`ByteSizeError`] say what is wrong;
//!   [`ErrorChain`] shows an error with its causes.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod amount;
mod bytes;
mod chain;
mod decimal;
mod options;
mod resources;

pub use amount::{AmountError, ResourceAmount, STEPS_PER_UNIT};
pub use bytes::{BYTE_UNITS, ByteSize, ByteSizeError, HumanBytes};
pub use chain::{ErrorChain, chain_text};
pub use options::ActorOptions;
pub use resources::{
    CPU, GPU, HumanResources, MEMORY, OBJECT_STORE_MEMORY, RESERVED, ResourceError, Resources,
    WHOLE_ABOVE_ONE, is_byte_resource, is_reserved, near_reserved_name,
};
