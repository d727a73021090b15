//! The agent's integration tests, as one test binary. The tests that drive a real agent start
//! this binary again to run only their module's `agent_entry`, by its full name
//! (`agent::agent_entry`, `handshake::agent_entry`).
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod agent;
mod handshake;
mod python;
