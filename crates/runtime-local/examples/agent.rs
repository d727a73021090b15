//! A program that only hosts trainyard agents, for command tasks: give it to the local
//! runtime as `AgentCommand::new("path/to/agent", [])` when the driver's own binary cannot
//! serve as the agent (it does not call `run_if_agent` first thing in `main`).
//!
//! Started by hand it explains itself and exits with code 2.

use std::process::ExitCode;

use trainyard_runtime::FunctionRegistry;

fn main() -> ExitCode {
    trainyard_agent::run_if_agent(FunctionRegistry::new()).unwrap_or_else(|| {
        eprintln!("this program is started by the trainyard local runtime as a worker's agent");
        ExitCode::from(2)
    })
}
