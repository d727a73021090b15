//! What the runtime's integration tests share.

use trainyard_runtime_local::AgentCommand;

/// The stand-alone agent of `examples/agent.rs`, built beside the test binary: its task
/// trampolines print nothing of their own, unlike a test harness.
pub(crate) fn agent() -> AgentCommand {
    AgentCommand::new(
        trainyard_test_support::processes::example("agent"),
        Vec::<String>::new(),
    )
}
