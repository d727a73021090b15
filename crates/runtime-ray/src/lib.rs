//! The Ray runtime of trainyard, starting with its foundation: a thin Python bridge to a Ray
//! cluster, driven from Rust.
//!
//! Ray has no Rust API, so [`Bridge`] runs a small Python script (shipped in this crate) with a
//! configurable interpreter (`$TRAINYARD_RAY_PYTHON`) and speaks line-delimited JSON with it.
//! The bridge only translates: node lists, placement groups, actors that run the trainyard
//! agent, and the events of their end. Every decision — feasibility, placement, retries —
//! stays in Rust.
//!
//! ```no_run
//! use std::time::Duration;
//! use trainyard_runtime_ray::{Bridge, BridgeConfig};
//!
//! # async fn demo() -> Result<(), trainyard_runtime_ray::BridgeError> {
//! let (bridge, ready) = Bridge::start(BridgeConfig::default().address("10.0.0.1:6379")).await?;
//! println!("Ray {} at {}", ready.ray_version, ready.address);
//! for node in bridge.nodes().await? {
//!     println!("{} alive={} {:?}", node.node_id, node.alive, node.total);
//! }
//! bridge.shutdown(Duration::from_secs(10)).await?;
//! # Ok(())
//! # }
//! ```

pub mod auth;
pub mod bridge;
mod error;
pub mod protocol;

pub use auth::{AuthLookup, TokenSource};
pub use bridge::{ActorLaunch, BRIDGE_SCRIPT, Bridge, BridgeConfig, PYTHON_VAR};
pub use error::{BridgeError, StderrTail};
pub use protocol::{
    ActorDeath, ActorEnded, ActorEntry, ClusterActor, ClusterGroup, ClusterView, DeathKind,
    GroupReadiness, GroupState, GroupStatus, Holdings, NodeInfo, PlacementGroupId, RayFailure,
    ReadyInfo, SchedulingState, Started,
};
