//! The embedded local runtime: every worker is an agent process on this machine.
//!
//! [`LocalConfig`] says what the machine offers, split into virtual nodes by
//! [`detect::plan_nodes`], and how agents are started: by default the running binary, which
//! must call `trainyard_agent::run_if_agent` first thing in `main`. [`LocalRuntime::start`]
//! listens on loopback; each spawn reserves the actor's resources, starts its agent with the
//! run's secret token in its environment, and returns once the agent has connected back and
//! proved it holds the token. Calls travel over that connection; task events are pushed back
//! as they happen; a dead agent becomes an actor death with its cause (its exit code or
//! signal, its memory limit, a lost connection).
//!
//! With [`LocalConfig::enforce_memory`], an actor's `memory` option is a hard limit: a
//! memory cgroup per worker where the machine allows one, else an address-space limit on
//! each of its processes.

mod calls;
mod config;
mod death;
pub mod detect;
mod error;
mod hello;
mod memory;
mod process;
mod runtime;
mod supervisor;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use config::{
    AgentCommand, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_STOP_GRACE, LocalConfig,
};
pub use detect::LocalNode;
pub use error::LocalError;
pub use runtime::LocalRuntime;

/// Locks shared bookkeeping; every update under it is finished before it is let go, so a
/// lock poisoned by a panic elsewhere is used as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
