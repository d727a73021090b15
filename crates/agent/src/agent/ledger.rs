//! The run's ledger lock: the agent holds it while it lives, so that a ledger keeps the
//! run's entry while an agent of the run is alive, even once the driver is gone.

use trainyard_wire::config::LEDGER_LIVE;

use crate::diagnostics::Diagnostics;

/// Takes a shared lock on the ledger's liveness file that [`LEDGER_LIVE`] names, if any, and
/// keeps it while this process lives (it is not inherited: tasks never hold it). A ledger
/// keeps a run's entry after its driver is gone only while an agent of the run holds it.
/// Says through `diagnostics` when it cannot.
pub(super) fn hold_ledger_lock(diagnostics: &Diagnostics) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let Some(path) = std::env::var_os(LEDGER_LIVE).filter(|path| !path.is_empty()) else {
        return;
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(&path);
    let held = file.map_err(|error| error.to_string()).and_then(|file| {
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock)
            .map_err(|(_, errno)| errno.to_string())
    });
    match held {
        // Held until the process ends: the lock goes with its last descriptor.
        Ok(lock) => std::mem::forget(lock),
        Err(error) => diagnostics.diagnose(format_args!(
            "trainyard agent: cannot lock the ledger's liveness file {}: {error}; the run's \
             entry ends with its driver",
            std::path::Path::new(&path).display()
        )),
    }
}
