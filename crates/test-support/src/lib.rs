//! What trainyard's end-to-end tests (`crates/cli/tests`) and `cargo xtask soak` share: a
//! marker in the environment of a run's processes and the search for the processes runs left
//! behind ([`processes`]), a process a test reads while it runs ([`running`]), the soak's
//! driver ([`soak`]); faults across the test clusters' hosts ([`hosts`]); and what a test
//! logs, read back ([`logs`]). Not part of trainyard's API.
#![allow(
    clippy::disallowed_methods,
    reason = "a library for tests: they make scratch files of their own"
)]

pub mod dashboard;
pub mod hosts;
pub mod logs;
pub mod processes;
pub mod running;
pub mod runs;
pub mod soak;
pub mod users;
