//! The names under which a launch's phases are traced, so that every layer that does part of
//! a launch marks it the same way and one subscriber can tell where the time went.
//!
//! Each phase is a `tracing` span of target [`TARGET`] at level INFO, named by one of the
//! constants below. A phase done once per worker (an agent's spawn, its handshake, its task's
//! start, its first output line) is one span per worker; the others are one span each, with an
//! `attempt` field (the restart count) where the attempt is known. Spans of a worker's phase
//! take the attempt of the phase they run inside. `trainyard_backend_executor::timings` turns
//! them into a table.
//!
//! ```
//! use tracing::Instrument as _;
//! use trainyard_runtime::timings;
//!
//! # async fn spawn_agent() {}
//! # async fn example() {
//! spawn_agent()
//!     .instrument(tracing::info_span!(target: timings::TARGET, timings::SPAWN))
//!     .await;
//! # }
//! ```

/// The target of every phase span.
pub const TARGET: &str = "trainyard::timings";

/// Reading the cluster: starting the runtime (detecting this machine, connecting to a
/// cluster), and an elastic run's look at what is free.
pub const CLUSTER: &str = "cluster";
/// Opening the run folder: `run.json`, the attempt's record, its log files.
pub const RUN_FOLDER: &str = "run_folder";
/// Reserving the placement group, until every bundle is placed.
pub const RESERVE: &str = "reserve";
/// Starting the workers: every agent spawned and answering, their metadata fetched.
pub const AGENTS: &str = "agents";
/// One worker's agent process started (its cgroup, the process, its ledger entry, its token).
pub const SPAWN: &str = "spawn";
/// One worker's agent connecting back and proving it holds the run's secret.
pub const HANDSHAKE: &str = "handshake";
/// One worker's metadata (node, pid, accelerator ids) fetched.
pub const WORKER_INFO: &str = "worker_info";
/// The environment prepared: ranks, accelerator ids, the backend's hooks, event streams.
pub const SETUP: &str = "setup";
/// One worker's task started.
pub const TASK_START: &str = "task_start";
/// One rank's first line of output, from the moment every task has started. A span that ends
/// without the field `output` recorded as `true` (the rank printed nothing) is no phase.
pub const FIRST_OUTPUT: &str = "first_output";
/// Stopping the workers, releasing the placement group and the runtime.
pub const SHUTDOWN: &str = "shutdown";
