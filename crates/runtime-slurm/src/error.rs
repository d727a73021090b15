//! [`SlurmError`]: what can go wrong between the driver and Slurm.

use std::path::PathBuf;

/// A failure of the Slurm runtime or of one of Slurm's commands.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SlurmError {
    /// One of Slurm's commands is not on `PATH`.
    #[error(
        "Slurm's `{program}` is not on PATH: run trainyard on a node of a Slurm cluster (a login node, or inside an allocation)"
    )]
    Missing {
        /// The command.
        program: String,
    },
    /// One of Slurm's commands failed, or did not answer in time.
    #[error("`{command}` failed: {message}")]
    Command {
        /// The command line.
        command: String,
        /// What it said last on stderr, or how it ended.
        message: String,
    },
    /// The partition does not exist.
    #[error("partition `{partition}` does not exist; the cluster has {}", if known.is_empty() { "none".to_owned() } else { known.join(", ") })]
    NoPartition {
        /// The partition asked for.
        partition: String,
        /// The partitions there are.
        known: Vec<String>,
    },
    /// The allocation named by `SLURM_JOB_ID` (or given) is not running.
    #[error("Slurm job {job} is {state}, not RUNNING: it cannot host workers")]
    NotRunning {
        /// The job id.
        job: String,
        /// Its state.
        state: String,
    },
    /// The agent program cannot be found.
    #[error("the agent program {} cannot be found", path.display())]
    AgentBinary {
        /// The path tried.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The hub the agents connect to could not start.
    #[error(transparent)]
    Hub(#[from] trainyard_hub::HubError),
}
