//! The trainyard worker agent and the driver⇄agent protocol.
//!
//! A real runtime starts one agent process per worker. The agent connects back to the
//! driver ([`wire`]), proves it belongs to the run with the run's token, and serves the
//! request set of [`trainyard_runtime::Request`]: where it runs, free ports, environment,
//! and tasks — a command started through a trampoline in its own process group, or a Rust
//! function registered in the user's binary. Task events are pushed to the driver as they
//! happen.
//!
//! A binary becomes able to host agents by calling [`run_if_agent`] first thing in `main`:
//!
//! ```no_run
//! use trainyard_runtime::FunctionRegistry;
//!
//! fn main() -> std::process::ExitCode {
//!     let functions = FunctionRegistry::with_builtins();
//!     if let Some(code) = trainyard_agent::run_if_agent(functions) {
//!         return code;
//!     }
//!     // ... the program itself: the driver.
//!     std::process::ExitCode::SUCCESS
//! }
//! ```

mod agent;
pub mod cgroup;
pub mod config;
mod exec;
mod process;
mod report;
pub mod wire;

use std::process::ExitCode;

pub use agent::AGENT_FAILED;
pub use exec::CANNOT_EXECUTE;
pub use process::MAX_LINE;
pub use report::{MAX_REPORT, REPORT_ADDR, REPORT_TOKEN};
use trainyard_runtime::FunctionRegistry;

/// Runs this process as an agent, or as a task's trampoline, when the runtime started it as
/// one ([`config::ROLE`] in its environment), serving the functions of `functions` (the
/// built-ins are always there); returns the exit code then. Returns `None` in a process the
/// user started: it goes on as itself.
#[must_use]
pub fn run_if_agent(functions: FunctionRegistry) -> Option<ExitCode> {
    match std::env::var(config::ROLE).as_deref() {
        Ok(config::ROLE_AGENT) => Some(agent::main(
            FunctionRegistry::with_builtins().merge(functions),
        )),
        Ok(config::ROLE_EXEC) => Some(exec::run()),
        _ => None,
    }
}
