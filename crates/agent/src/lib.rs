//! The trainyard worker agent, and the protocol between it and the driver.
//!
//! A real runtime (such as `trainyard-runtime-local`) starts one agent process per worker. The
//! agent connects back to the driver; each proves to the other that it holds the run's secret
//! [`Token`](wire::Token) without sending it ([`auth`]: HMAC-SHA256 over fresh nonces), and
//! the agent serves [`Request`](trainyard_runtime::Request)s: where it runs,
//! free ports, environment, and tasks (a command in its own process group and memory
//! [`cgroup`], or a function of a [`FunctionRegistry`] on threads of its own, so that a busy
//! function never holds up the agent's replies and heartbeats), whose events it pushes to the
//! driver as they happen, as fast as the driver's credit allows.
//!
//! A task's output is its lines on stdout and stderr, as
//! [`TaskEvent::Log`](trainyard_runtime::TaskEvent::Log)s: a command's from pipes of its
//! own; a function's from what the agent process writes to its fds 1 and 2 while the
//! function runs (its `println!`, `eprintln!`, a panic's message, the processes it starts
//! without redirecting them), which the agent points at pipes of its own as it starts. The
//! agent's own messages, and what is printed while no function task runs, go to the
//! agent's original stderr: they are never task output.
//!
//! A command task reports through a loopback socket ([`REPORT_ADDR`]); with protocol 2 a
//! report hands in a checkpoint directory, which the agent persists into the run folder
//! before the report goes on to the driver and before it answers the task. Python scripts
//! need nothing installed for this: the agent carries the `trainyard` package
//! (`from trainyard import train`, Ray Train's worker API) and `trainyard_report`, and puts
//! them first on every command task's `PYTHONPATH`. A task whose environment names a remote
//! checkpoint to resume from (`TRAINYARD_CHECKPOINT_URI`) starts once the agent has
//! downloaded it and pointed `TRAINYARD_CHECKPOINT` at the local copy. A task whose
//! environment says `TRAINYARD_ERROR_FILE_VAR=NAME` ([`ERROR_FILE_VAR`]) gets `NAME` set to a
//! fresh error file (torch's `@record` writes the exception that ended `main` there, given
//! `NAME=TORCHELASTIC_ERROR_FILE`), unless it sets `NAME` itself.
//!
//! When a task fails, the agent sends its root cause
//! ([`TaskEvent::RootCause`](trainyard_runtime::TaskEvent::RootCause): when it ended, and the
//! exception from its error file, else the last Python traceback of its output) just before
//! its failed exit. Asked for the task's stacks
//! ([`Request::Stacks`](trainyard_runtime::Request::Stacks)), the agent answers within 3 s with
//! every thread of the task's processes, its state and kernel wait channel, and for Python
//! processes their frames, read by `py-spy` (found through [`PY_SPY`], beside the process's
//! Python, or on `PATH`).
//!
//! # Make a binary able to host agents
//!
//! ```no_run
//! use std::process::ExitCode;
//! use trainyard_runtime::FunctionRegistry;
//!
//! fn main() -> ExitCode {
//!     // What workers can run by name, besides the built-ins.
//!     let functions = FunctionRegistry::new().register("double", |task| async move {
//!         let n = task.arg().as_i64().ok_or("expected a number")?;
//!         Ok((2 * n).into())
//!     });
//!     // First thing in `main`: a process the runtime started as an agent serves, then ends.
//!     if let Some(code) = trainyard_agent::run_if_agent(functions) {
//!         return code;
//!     }
//!     // ... the program itself: the driver, which starts a runtime and its workers.
//!     ExitCode::SUCCESS
//! }
//! ```
//!
//! # Speak the wire protocol
//!
//! ```
//! use futures::{SinkExt, StreamExt};
//! use trainyard_agent::auth::{Handshake, Nonce, Role};
//! use trainyard_agent::wire::{self, AgentMessage, DriverMessage, PROTOCOL, Token};
//! use trainyard_runtime::{ActorId, Request};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let token = Token::random()?; // both sides hold it; it never crosses the wire
//! let (driver_end, agent_end) = tokio::io::duplex(64 * 1024); // a TCP stream, in real life
//! let (mut driver, mut agent) = (wire::framed(driver_end), wire::framed(agent_end));
//!
//! // The agent speaks first: which actor it serves, and a fresh nonce.
//! let (actor, pid, agent_nonce) = (ActorId(0), std::process::id(), Nonce::random()?);
//! let hello = AgentMessage::Hello { protocol: PROTOCOL, actor, pid, nonce: agent_nonce };
//! agent.send(wire::encode(&hello)?).await?;
//!
//! // The driver answers with a nonce of its own and its proof over both.
//! let frame = driver.next().await.ok_or("the agent hung up")??;
//! let AgentMessage::Hello { nonce, .. } = wire::decode(&frame)? else {
//!     return Err("expected a hello".into());
//! };
//! let handshake = Handshake { agent_nonce: nonce, driver_nonce: Nonce::random()?, actor, pid };
//! let proof = handshake.prove(&token, Role::Driver);
//! let challenge = DriverMessage::Challenge { nonce: handshake.driver_nonce, proof };
//! driver.send(wire::encode(&challenge)?).await?;
//!
//! // The agent checks the driver's proof, then proves itself.
//! let frame = agent.next().await.ok_or("the driver hung up")??;
//! let DriverMessage::Challenge { nonce, proof } = wire::decode(&frame)? else {
//!     return Err("expected a challenge".into());
//! };
//! let seen = Handshake { agent_nonce, driver_nonce: nonce, actor, pid };
//! seen.verify(&token, Role::Driver, &proof)?;
//! let answer = AgentMessage::Proof { proof: seen.prove(&token, Role::Agent) };
//! agent.send(wire::encode(&answer)?).await?;
//!
//! // The driver checks it before it accepts frames larger than a handshake's.
//! let frame = driver.next().await.ok_or("the agent hung up")??;
//! let AgentMessage::Proof { proof } = wire::decode(&frame)? else {
//!     return Err("expected a proof".into());
//! };
//! handshake.verify(&token, Role::Agent, &proof)?;
//! wire::authenticated(&mut driver, &handshake.session_key(&token), Role::Driver);
//! wire::authenticated(&mut agent, &seen.session_key(&token), Role::Agent);
//! let request = DriverMessage::Request { id: 1, request: Request::NodeInfo };
//! driver.send(wire::encode(&request)?).await?;
//! # Ok(()) }
//! ```
//!
//! # Main items
//!
//! - [`run_if_agent`]: serve as an agent (or a task's trampoline) when started as one;
//!   [`skipped_run_if_agent`]: whether a process started as one forgot to.
//! - [`wire`]: [`Token`](wire::Token), [`DriverMessage`](wire::DriverMessage) and
//!   [`AgentMessage`](wire::AgentMessage) in JSON frames; [`auth`]: the proofs of the
//!   handshake; [`config`]: how an agent is started;
//!   [`cgroup`]: how a task joins its worker's memory cgroup (made by the driver) and how
//!   its OOM kills are told apart.
//! - [`procfs`]: what `/proc` says of a process, and whether one still runs
//!   ([`procfs::is_alive`]: pid and start time); [`process_group`]: the one way a task's
//!   process group is signalled or killed.

pub mod admission;
mod agent;
pub mod auth;
pub mod cgroup;
pub mod config;
mod descendants;
mod exec;
mod handin;
mod output;
mod process;
pub mod process_group;
pub mod procfs;
mod python;
mod report;
mod root_cause;
pub mod seal;
mod stacks;
mod watchdog;
pub mod wire;
mod workdir;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

pub use agent::AGENT_FAILED;
pub use exec::CANNOT_EXECUTE;
pub use process::MAX_LINE;
pub use report::{MAX_REPORT, REPORT_ADDR, REPORT_TOKEN};
pub use root_cause::ERROR_FILE_VAR;
pub use stacks::PY_SPY;
use trainyard_runtime::FunctionRegistry;

/// Whether [`run_if_agent`] was called in this process.
static CALLED: AtomicBool = AtomicBool::new(false);

/// Runs this process as an agent, or as a task's trampoline, when the runtime started it as
/// one ([`config::ROLE`] in its environment), serving the functions of `functions` (the
/// built-ins are always there); returns the exit code then. Returns `None` in a process the
/// user started: it goes on as itself.
#[must_use]
pub fn run_if_agent(functions: FunctionRegistry) -> Option<ExitCode> {
    CALLED.store(true, Ordering::Relaxed);
    match std::env::var(config::ROLE).as_deref() {
        Ok(config::ROLE_AGENT) => Some(agent::main(
            FunctionRegistry::with_builtins().merge(functions),
        )),
        Ok(config::ROLE_EXEC) => Some(exec::run()),
        Ok(config::ROLE_WATCHDOG) => Some(watchdog::run()),
        _ => None,
    }
}

/// Whether a runtime started this process as an agent ([`config::ROLE`] in its environment)
/// and its program went on without calling [`run_if_agent`]: it runs the user's program
/// instead of serving, so it must not start workers of its own (each would do the same).
/// A function task that starts a run inside a real agent is not such a process.
#[must_use]
pub fn skipped_run_if_agent() -> bool {
    std::env::var_os(config::ROLE).is_some() && !CALLED.load(Ordering::Relaxed)
}
