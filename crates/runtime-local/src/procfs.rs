//! What `/proc/<pid>/stat` says about a process, as the agent's crate reads it.

pub(crate) use trainyard_agent::procfs::{parse_stat, read_stat};
