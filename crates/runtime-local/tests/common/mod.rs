//! What the runtime's integration tests share.

use trainyard_runtime_local::AgentCommand;

/// The stand-alone agent of `examples/agent.rs`, built beside the test binary: it prints
/// nothing of its own, unlike a test harness, and forks its watchdog (it has one thread).
pub(crate) fn agent() -> AgentCommand {
    AgentCommand::new(
        trainyard_test_support::processes::example("agent"),
        Vec::<String>::new(),
    )
}
