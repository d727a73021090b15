//! The driver side of trainyard's agents, shared by every agent-based runtime (the local,
//! Ray and Slurm runtimes).
//!
//! An agent is the worker process a runtime starts for each actor (`trainyard-agent`). It
//! connects back to the driver's [`AgentHub`] over TCP, and each proves to the other that it
//! holds the run's secret token without sending it: a challenge-response over fresh nonces
//! (HMAC-SHA256, `trainyard_wire::auth`), so that a recorded handshake is worth nothing and
//! an agent runs nothing for a peer that cannot answer its challenge. Only then does the hub
//! serve the agent's requests, route its replies and events, and turn its end into a death
//! with a cause. The hub listens on the address agents are told
//! ([`HubConfig::bind`]); what the connection carries after the handshake is not encrypted.
//!
//! How an agent process is started, and where, is the runtime's business: the local runtime
//! starts a child process; the Ray runtime asks a Ray actor to start one on its node. Either
//! hands the hub an [`AgentProcess`], the handle through which the hub sees the process end
//! and ends it.
//!
//! ```no_run
//! use trainyard_hub::{AgentHub, HubConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // `release` frees what an actor held, once it is gone.
//! let hub = AgentHub::start(HubConfig::new("my-run"), |_actor, _cause| {}).await?;
//! let arrival = hub.expect("worker-0")?; // an actor id, and a place for its agent's hello
//! // ... start an agent for `arrival.actor()` that connects to `hub.driver_address()` with
//! // `hub.token()`, then `hub.attach(arrival, "worker-0".into(), Box::new(process)).await?`
//! # drop(arrival);
//! hub.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Main items
//!
//! - [`AgentHub`], started from a [`HubConfig`]; [`AgentHub::expect`] hands out an
//!   [`Arrival`], which [`AgentHub::attach`] turns into a served actor.
//! - [`AgentProcess`]: what a runtime's agent process offers the hub; its end is an
//!   [`AgentExit`] (an exit code, a signal, or a death its runtime tells), and a runtime
//!   that can kill a task's processes from the driver's side offers a [`TaskKiller`].
//! - [`AgentCommand`]: the program agents are started with.
//! - [`AgentRuntime`]: the one [`ActorRuntime`](trainyard_runtime::ActorRuntime) of every
//!   agent-based runtime, started from a runtime's [`Setup`] (its configuration). A runtime
//!   implements only a [`Placer`] (the cluster, placement groups, what an actor holds) and a
//!   [`Launcher`] (how an agent process starts on the node it was placed on); spawning
//!   (expect → launch → attach), calls, kills and event streams are the hub's.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod calls;
mod config;
mod death;
mod dropped;
mod error;
mod hello;
mod hub;
mod process;
mod registry;
mod runtime;
mod supervisor;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use config::{
    AGENT_BIN_VAR, AgentCommand, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_STOP_GRACE, DRIVER_LOST, HubConfig,
};
pub use error::HubError;
pub use hub::{AgentHub, Arrival};
pub use process::{AgentExit, AgentProcess, TaskKiller, TaskProcess};
pub use runtime::{AgentRuntime, Launcher, Parts, Placer, Setup};
pub use supervisor::REAP_TIMEOUT;

/// Locks shared bookkeeping; every update under it is finished before it is let go, so a
/// lock poisoned by a panic elsewhere is used as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
