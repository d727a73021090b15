//! Why a cgroup operation of the driver failed.

use std::io;
use std::path::PathBuf;

use super::setup::MAX_NAME_LEN;

/// Why a cgroup operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// The probe found no usable memory cgroup.
    #[error("memory cgroups are not available: {why}")]
    Unavailable {
        /// The probe's reason.
        why: String,
    },
    /// A run or worker name that is not a safe single directory name.
    #[error(
        "invalid cgroup name {name:?}: use 1 to {MAX_NAME_LEN} ASCII letters, digits, '-', '_' or '.', not starting with '.'"
    )]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// A memory limit of zero bytes.
    #[error("invalid memory limit {limit}: it must be at least one byte")]
    InvalidLimit {
        /// The rejected limit.
        limit: u64,
    },
    /// `mkdir` of a cgroup failed.
    #[error("cannot create cgroup {}", path.display())]
    Create {
        /// The directory that could not be created.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading a cgroup file failed.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Writing a cgroup file failed (a limit below current usage gives EBUSY).
    #[error("cannot write {value:?} to {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// On cgroup v2, `+memory` cannot be enabled in a cgroup that holds processes: other
    /// processes than the driver (which moved into a leaf of its own) are there.
    #[error(
        "cannot enable the memory controller in {}: it holds {others} other process(es) besides the driver (cgroup v2 allows no processes in a cgroup whose children use a controller; run the driver in a cgroup of its own)",
        path.display()
    )]
    ControllerBusy {
        /// The cgroup directory whose `cgroup.subtree_control` refused `+memory`.
        path: PathBuf,
        /// How many processes other than the driver it holds.
        others: usize,
        /// The cause (EBUSY).
        #[source]
        source: io::Error,
    },
}
