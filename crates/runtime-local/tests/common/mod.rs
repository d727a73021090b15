//! What the runtime's integration tests share.

use std::path::Path;

use trainyard_runtime_local::AgentCommand;

/// The stand-alone agent of `examples/agent.rs`, built beside the test binary: its task
/// trampolines print nothing of their own, unlike a test harness.
pub(crate) fn agent() -> AgentCommand {
    let exe = std::env::current_exe().expect("the test binary's path");
    let example = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("examples").join("agent"))
        .filter(|path| path.exists())
        .expect("examples/agent is built with the tests (cargo test builds examples)");
    AgentCommand::new(example, Vec::<String>::new())
}
