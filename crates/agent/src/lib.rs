//! The trainyard worker agent.
