//! The embedded local runtime.

pub mod cgroup;
pub mod detect;
