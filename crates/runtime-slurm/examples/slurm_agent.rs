//! A program that only hosts trainyard agents: what a job step starts when the driver's own
//! binary cannot be the agent (it does not call `run_if_agent` first thing in `main`). Name
//! it in `TRAINYARD_AGENT_BIN`.
//!
//! Started by hand it explains itself and exits with code 2.

use std::process::ExitCode;

fn main() -> ExitCode {
    trainyard_agent::run_if_agent(trainyard_runtime::FunctionRegistry::new()).unwrap_or_else(|| {
        eprintln!("this program is started by a trainyard runtime as a worker's agent");
        ExitCode::from(2)
    })
}
