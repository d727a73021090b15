//! The trainyard worker agent: the process a runtime starts for each worker.
//!
//! A real runtime (such as `trainyard-runtime-local`) starts one agent process per worker. The
//! agent connects back to the driver; each proves to the other that it holds the run's secret
//! without sending it (the protocol is the `trainyard-wire` crate's), and the agent serves
//! [`Request`](trainyard_runtime::Request)s: where it runs, free ports, environment, and tasks
//! (a command in its own process group and memory cgroup, or a function of a
//! [`FunctionRegistry`] on threads of its own, so that a busy function never holds up the
//! agent's replies and heartbeats), whose events it pushes to the driver as they happen, as
//! fast as the driver's credit allows.
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
//! environment says `TRAINYARD_ERROR_FILE_VAR=NAME`
//! ([`ERROR_FILE_VAR`](trainyard_runtime::root_cause::ERROR_FILE_VAR)) gets `NAME` set to a
//! fresh error file (torch's `@record` writes the exception that ended `main` there, given
//! `NAME=TORCHELASTIC_ERROR_FILE`), unless it sets `NAME` itself.
//!
//! A command task whose program is the interpreter of the run's warm Python
//! ([`AgentConfig::warm_python`](trainyard_wire::config::AgentConfig::warm_python)), in a
//! worker with a cgroup, starts as a fork of that Python, set up as an executed task is.
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
//! # Main items
//!
//! - [`run_if_agent`]: serve as an agent (or an agent's watchdog) when started as one
//!   (`trainyard_wire::config::skipped_run_if_agent`: whether a process started as one
//!   forgot to).
//! - The protocol, the agent's configuration and the variables of its environment are the
//!   `trainyard-wire` crate's; what it asks of Linux (`/proc`, process groups, cgroups) the
//!   `trainyard-sys` crate's. This crate is the agent process alone: link it only into the
//!   binary that hosts agents.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod agent;
mod descendants;
mod diagnostics;
mod double_spawn;
mod handin;
mod lines;
mod output;
mod process;
mod python;
mod report;
mod root_cause;
mod scheduler;
mod stacks;
mod warm;
mod watchdog;
mod workdir;

use std::process::ExitCode;

pub use lines::MAX_LINE;
pub use report::{MAX_REPORT, REPORT_ADDR, REPORT_TOKEN};
pub use stacks::PY_SPY;
use trainyard_runtime::FunctionRegistry;
use trainyard_wire::config;

use double_spawn::SelfExec;

/// Runs this process as an agent, or as an agent's watchdog, when it was started as
/// one ([`config::ROLE`] in its environment), serving the functions of `functions` (the
/// built-ins are always there); returns the exit code then. Returns `None` in a process the
/// user started: it goes on as itself.
#[must_use]
pub fn run_if_agent(functions: FunctionRegistry) -> Option<ExitCode> {
    config::entered_run_if_agent();
    Some(match SelfExec::of_this_process()? {
        SelfExec::Agent => agent::main(FunctionRegistry::with_builtins().merge(functions)),
        SelfExec::Watchdog => watchdog::run(),
    })
}
