//! The embedded local runtime of trainyard: every worker is an agent process on this machine.
//!
//! [`LocalRuntime`] is an [`ActorRuntime`](trainyard_runtime::ActorRuntime) over one machine
//! split into virtual nodes. Its agents are by default the running binary, which must call
//! `trainyard_agent::run_if_agent` first thing in `main`; each connects back
//! over loopback with the run's secret token, and a dead agent becomes an actor death with its
//! cause (exit code or signal, memory limit, lost connection).
//!
//! # Describe the machine
//!
//! ```
//! use trainyard_resources::{CPU, ResourceAmount};
//! use trainyard_runtime_local::LocalConfig;
//! use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
//!
//! // `Machine::detect()` reads this machine; overrides replace parts of it (GPUs can be faked).
//! let (cpus, memory) = (ResourceAmount::from(8u32), 16 << 30);
//! let machine = Machine { hostname: "box".into(), cpus, memory, gpus: Vec::new() };
//! let overrides = Overrides { num_gpus: Some(2), ..Overrides::default() };
//! let nodes = plan_nodes(&machine, &overrides, 2)?;
//! assert_eq!(nodes[1].resources.amount(CPU), ResourceAmount::from(4u32));
//! assert_eq!(nodes[1].gpu_ids, ["1"]);
//! let config = LocalConfig::new(nodes, "my-run")?.enforce_memory(true); // `memory` is a limit
//! assert_eq!(config.nodes[0].id.as_str(), "local-0");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Start it and run a command on a worker
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use std::process::ExitCode;
//! use futures::StreamExt;
//! use trainyard_runtime::events::ActorEvent;
//! use trainyard_runtime::{ActorRuntime, ActorRuntimeExt, ActorSpec, FunctionRegistry, TaskSpec};
//! use trainyard_runtime_local::{LocalConfig, LocalRuntime};
//!
//! fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
//!     if let Some(code) = trainyard_agent::run_if_agent(FunctionRegistry::new()) {
//!         return Ok(code); // this process was started as an agent
//!     }
//!     tokio::runtime::Runtime::new()?.block_on(driver())?;
//!     Ok(ExitCode::SUCCESS)
//! }
//!
//! async fn driver() -> Result<(), Box<dyn std::error::Error>> {
//!     let local = LocalRuntime::start(LocalConfig::detect("my-run")?).await?;
//!     let options = Default::default(); // no resources: the worker fits anywhere
//!     let spec = ActorSpec { name: "w-0".into(), options, placement: None, env: BTreeMap::new() };
//!     let actor = local.spawn(spec).await?;
//!     let mut events = local.task_events(actor).await?.ok_or("no event stream")?;
//!     let args = vec!["hello".into()];
//!     let echo = TaskSpec::Command { program: "echo".into(), args, env: BTreeMap::new() };
//!     local.run_task(actor, echo).await?;
//!     while let Some(event) = events.next().await {
//!         println!("{event:?}"); // the line `hello`, then the task's exit
//!         if matches!(event, ActorEvent::TaskExited { exit: _, .. }) { break; }
//!     }
//!     local.shutdown().await;
//!     Ok(())
//! }
//! ```
//!
//! # Main types
//!
//! - [`LocalRuntime`], started from a [`LocalConfig`]; agents run an [`AgentCommand`]. It is
//!   the hub's [`AgentRuntime`](trainyard_hub::AgentRuntime) over a [`LocalPlacer`] (the
//!   machine's nodes, shared with other runs through the ledger) and a [`LocalLauncher`]
//!   (agents as child processes).
//! - [`detect`]: what the machine offers, the user's overrides, and the split into
//!   [`LocalNode`]s; [`LocalError`]: why the runtime cannot be configured or started.
//! - [`ledger`]: the machine-wide record through which concurrent runs share this machine.
//! - [`hub`]: the agent hub (the `trainyard-hub` crate), which serves this runtime's agents
//!   as it serves those of every agent-based runtime.
//! - [`WarmPythonSpec`] ([`LocalConfig::warm_python`]): the run's warm Python, which imports
//!   the heavy modules once and outlives attempts; agents start the Python tasks of its
//!   interpreter as forks of it, so that a restarted rank does not import them again.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod config;
pub mod detect;
mod error;
pub mod ledger;
mod memory;
mod process;
mod runtime;
mod warm;

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use config::{LocalConfig, WhenBusy};
pub use detect::LocalNode;
pub use error::LocalError;
pub use runtime::{LocalLauncher, LocalPlacer, LocalRuntime};
/// The agent hub, which this runtime shares with the other agent-based runtimes; its own
/// crate, `trainyard-hub`, re-exported here under the path it had.
#[doc(no_inline)]
pub use trainyard_hub as hub;
#[doc(no_inline)]
pub use trainyard_hub::{
    AgentCommand, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_STOP_GRACE,
};
pub use warm::WarmPythonSpec;

/// Locks shared bookkeeping; every update under it is finished before it is let go, so a
/// lock poisoned by a panic elsewhere is used as it is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `work`, which blocks (it removes cgroups, waits for a file lock, scans `/proc`),
/// where it holds up no async task: on the blocking threads of the tokio runtime this is
/// called within (which waits for them when it shuts down), else right here, on a thread
/// that may block. For `Drop` and other code that cannot wait.
fn off_async_threads(work: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(work)),
        Err(_) => work(),
    }
}
