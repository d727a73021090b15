//! The trampoline: the agent's own binary, started with [`ROLE_EXEC`](trainyard_wire::config::ROLE_EXEC),
//! sets up the task's process and then becomes the task's program.
//!
//! Everything here runs in a freshly started process before `exec`, so it may allocate and
//! log freely (no `pre_exec`, which the workspace forbids): it joins the worker's cgroup (or
//! caps its address space), starts a session of its own (`setsid`: so its process group is
//! its own too, and no process of the task can join the agent's group, which is in another
//! session), asks for SIGKILL when the agent dies, checks the agent is still its parent, and
//! executes the program. Just before it does, it writes one byte ([`READY`]) to its standard
//! output: the agent takes the task as started once it has read it (the first byte of the
//! pipe, before any of the program's), and then knows whether the task is in the worker's
//! cgroup; session, group and cgroup survive `exec`.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode};

use nix::sys::signal::Signal;

use trainyard_sys::cgroup;
use trainyard_wire::config::{EXEC, ExecSpec, MemoryLimit, PRIVATE};

/// The exit code of a trampoline that could not execute its program (as shells use).
pub const CANNOT_EXECUTE: u8 = 127;

/// The byte the trampoline writes to its standard output, before anything of the task's,
/// once it is set up and about to execute the program.
pub(crate) const READY: u8 = 0;

/// Sets up this process as `spec` says and executes its program; returns only on failure.
pub(crate) fn run() -> ExitCode {
    let spec: ExecSpec = match std::env::var(EXEC)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(spec) => spec,
        Err(error) => {
            eprintln!("trainyard: the task's trampoline has no valid {EXEC}: {error}");
            return ExitCode::from(CANNOT_EXECUTE);
        }
    };
    match &spec.memory {
        Some(MemoryLimit::Cgroup { path, .. }) => {
            if let Err(error) = cgroup::join_self(&path.join("cgroup.procs")) {
                eprintln!("trainyard: cannot enter the worker's memory cgroup: {error}");
                return ExitCode::from(CANNOT_EXECUTE);
            }
        }
        // No limit hangs on it: the task runs all the same, and its agent alone ends what
        // it leaves.
        Some(MemoryLimit::Unlimited { path }) => {
            if let Err(error) = cgroup::join_self(&path.join("cgroup.procs")) {
                eprintln!("trainyard: the task runs outside the worker's cgroup: {error}");
            }
        }
        Some(MemoryLimit::AddressSpace { limit }) => {
            if let Err(error) = cgroup::limit_address_space(*limit) {
                eprintln!("trainyard: cannot limit the task's memory: {error}");
                return ExitCode::from(CANNOT_EXECUTE);
            }
        }
        // The scheduler's cgroup holds the agent, so the task too already.
        Some(MemoryLimit::Scheduler { .. }) | None => {}
    }
    if let Err(error) = nix::unistd::setsid() {
        eprintln!("trainyard: cannot start the task in a session of its own: {error}");
        return ExitCode::from(CANNOT_EXECUTE);
    }
    // The parent may have died before the signal was asked for: then nobody would send it.
    if let Err(error) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        eprintln!("trainyard: cannot tie the task to its agent: {error}");
        return ExitCode::from(CANNOT_EXECUTE);
    }
    if nix::unistd::getppid().as_raw() != i32::try_from(spec.parent).unwrap_or(-1) {
        eprintln!("trainyard: the task's agent is gone; not starting it");
        return ExitCode::from(CANNOT_EXECUTE);
    }
    let mut command = Command::new(&spec.program);
    command.args(&spec.args);
    for private in PRIVATE {
        command.env_remove(private);
    }
    // The first byte the agent reads from the task's output: everything above is done.
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(&[READY])
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::from(CANNOT_EXECUTE);
    }
    drop(stdout);
    let error = command.exec();
    eprintln!(
        "trainyard: cannot execute {}: {error}",
        spec.program.display()
    );
    ExitCode::from(CANNOT_EXECUTE)
}
