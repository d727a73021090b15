//! Placement semantics shared by every runtime, as pure functions over plain data.
//!
//! - [`check_feasible`] answers "can this group *ever* fit on the cluster as it is?" against
//!   the nodes' totals, and explains why not with a [`PlacementError`].
//! - [`place`] lays the bundles of a group over the nodes' *available* resources, all or
//!   nothing, following the group's [`PlacementStrategy`]:
//!   - `PACK`: as few nodes as possible, best effort. A node that can take every bundle is
//!     preferred; otherwise each bundle goes to the first node (in the order given) with room
//!     for it, so a node fills up before the next one is opened.
//!   - `SPREAD`: as many nodes as possible, best effort. Each bundle goes to the node holding
//!     the fewest bundles of this group that has room for it, ties broken by node order.
//!   - `STRICT_PACK`: every bundle on one node, or nothing.
//!   - `STRICT_SPREAD`: every bundle on a different node, or nothing (a maximum matching of
//!     bundles to nodes, so bundles of different sizes are placed whenever possible).
//!
//!   When the best-effort strategies find no room by their own rule, they fall back to
//!   first-fit in bundle order, first-fit with the largest bundles first and best-fit with
//!   the largest bundles first; for small groups (up to [`EXACT_SEARCH_BUNDLES`] bundles on
//!   up to [`EXACT_SEARCH_NODES`] nodes) an exhaustive search settles the question.
//! - [`AcceleratorPool`] chooses the device ids (GPU, neuron cores, ...) that a bundle or
//!   actor holds: whole free devices for amounts of 1 and more, and the lowest-numbered
//!   device with enough capacity left for fractions, so two 0.5-GPU bundles share device
//!   `"0"` as in Ray.
//!
//! Amounts are exact ([`ResourceAmount`]); an entry whose amount is zero never blocks.
//!
//! ```
//! use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
//! use trainyard_resources::Resources;
//! use trainyard_runtime::placement::{check_feasible, place};
//!
//! let nodes: Vec<Resources> = vec!["CPU=4".parse()?, "CPU=4".parse()?];
//! let factory = PlacementGroupFactory {
//!     bundles: vec!["CPU=1".parse()?; 3],
//!     strategy: PlacementStrategy::Spread,
//! };
//! check_feasible(&nodes, &factory)?;
//! assert_eq!(place(&nodes, &factory), Some(vec![0, 1, 0]));
//!
//! let too_big = PlacementGroupFactory { bundles: vec!["CPU=6".parse()?], ..factory };
//! let err = check_feasible(&nodes, &too_big).unwrap_err();
//! assert_eq!(err.to_string(), "bundle 0 needs CPU=6 but the most CPU any node has is 4");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`PlacementStrategy`]: trainyard_config::PlacementStrategy
//! [`ResourceAmount`]: trainyard_resources::ResourceAmount

mod devices;
mod error;
mod exhaustive;
mod feasibility;
mod layout;
mod matching;
mod problem;
mod room;

pub use devices::{AcceleratorPool, GiveBackError};
pub use error::PlacementError;
pub use feasibility::check_feasible;
pub use layout::{BundleSpot, EXACT_SEARCH_BUNDLES, EXACT_SEARCH_NODES, place, place_on_devices};
pub use problem::NodeRoom;

/// Shorthands for the unit tests of the placement modules.
#[cfg(test)]
mod fixtures {
    use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
    use trainyard_resources::Resources;

    pub(super) fn res(text: &str) -> Resources {
        text.parse().unwrap()
    }

    pub(super) fn factory(bundles: &[&str], strategy: PlacementStrategy) -> PlacementGroupFactory {
        PlacementGroupFactory {
            bundles: bundles.iter().map(|b| res(b)).collect(),
            strategy,
        }
    }

    pub(super) fn nodes(list: &[&str]) -> Vec<Resources> {
        list.iter().map(|n| res(n)).collect()
    }
}
