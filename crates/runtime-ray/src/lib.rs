//! The Ray runtime of trainyard, starting with its foundation: a thin Python bridge to a Ray
//! cluster, driven from Rust.
//!
//! Ray has no Rust API, so [`Bridge`] runs a small Python script (shipped in this crate) with a
//! configurable interpreter (`$TRAINYARD_RAY_PYTHON`) and speaks line-delimited JSON with it.
//! The bridge only translates: node lists, placement groups, actors that run the trainyard
//! agent, and the events of their end. Every decision — feasibility, placement, retries —
//! stays in Rust.
//!
//! ## What the bridge does, and what it costs
//!
//! - **Start-up**: for an explicit address the GCS port is probed first (nothing listening
//!   would make `ray.init` hang for minutes); the bridge then connects in about 0.05 s, or
//!   about 0.3–0.5 s with the interpreter's start and `import ray` (the first driver on a
//!   freshly started cluster waits 2–3 s for the head to register). With no address it starts
//!   a throwaway local head: 2–4 s on a 2-core machine, stopped with the bridge; it gets a
//!   random token so that Ray does not write `~/.ray/auth_token`.
//! - **Ray version**: the bridge reports `ray.__version__` once connected; a release of
//!   another minor series than [`RAY_VERSION`] is refused with [`BridgeError::RayVersion`]
//!   (the bridge reads Ray internals that change between them), another patch release is
//!   accepted with a warning.
//! - **Token auth**: see [`auth`]. A wrong or missing token fails in about 0.3–3 s with
//!   [`BridgeError::Auth`], naming where the token was looked for.
//! - **Actors** run the agent as a child in the actor's own process group; `actor_ended`
//!   reports its exit status, or the actor's death ([`DeathKind`], taken from the typed
//!   death cause Ray's GCS records, never from message text). A lost node is reported
//!   as `node_died` once Ray declares the node dead (about 15 s), or as `unavailable` after
//!   [`BridgeConfig::unavailable_grace`].
//! - **Cleanup**: EOF on the bridge's stdin or [`Bridge::shutdown`] kills its actors and
//!   removes its groups; if the driver is killed, the bridge dies with it (parent-death
//!   signal) and Ray removes the job's non-detached actors and groups. The bridge runs in its
//!   own process group, which the client kills once the bridge exits.
//!
//! ## Testing
//!
//! The end-to-end tests start real Ray clusters with the interpreter named by
//! `TRAINYARD_RAY_PYTHON`. They are ignored unless asked for, so that a run without Ray
//! shows them as skipped, never as passed; asked for without the variable, they fail:
//!
//! ```text
//! export TRAINYARD_RAY_PYTHON="$(scripts/ray-env.sh)"
//! cargo nextest run -p trainyard-runtime-ray --run-ignored all
//! ```
//!
//! With the `testing` feature, `testing::RayCluster` starts such a cluster (two nodes, each in
//! a process group of its own and on a test host with an address of its own, a network
//! namespace of `scripts/netns-env.sh`) for tests here and in the crates above, and stops
//! exactly its own processes on drop.
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
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

pub mod auth;
pub mod bridge;
mod error;
pub mod protocol;
mod runtime;
#[cfg(feature = "testing")]
pub mod testing;

pub use auth::{AuthLookup, TokenSource};
pub use bridge::{ActorLaunch, BRIDGE_SCRIPT, Bridge, BridgeConfig, PYTHON_VAR, RAY_VERSION};
pub use error::{BridgeError, RayError, StderrTail};
pub use protocol::{
    ActorDeath, ActorEnded, ActorEntry, ClusterActor, ClusterGroup, ClusterView, DeathKind,
    GroupReadiness, GroupState, GroupStatus, Holdings, RayFailure, RayNodeInfo,
    RayPlacementGroupId, ReadyInfo, SchedulingState, Started,
};
pub use runtime::{AGENT_BIN_VAR, RayConfig, RayLauncher, RayPlacer, RayRuntime};
