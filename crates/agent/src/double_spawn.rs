//! This very program, started again in another part: what a runtime starts as an agent, and
//! what the agent starts as its watchdog when it cannot fork one (it has other threads: a
//! test harness serving as the agent), is the binary that called `run_if_agent`. [`SelfExec::of_this_process`] tells which part a
//! process was started as, and [`SelfExec::command`] starts one.

use std::collections::BTreeMap;
use std::process::Command;

use trainyard_wire::config::{ROLE, ROLE_AGENT, ROLE_WATCHDOG};

/// A part this program plays when started again ([`ROLE`] in its environment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SelfExec {
    /// A worker's agent, started by a runtime.
    Agent,
    /// The agent's watchdog, started by the agent.
    Watchdog,
}

impl SelfExec {
    /// The part this process was started as; `None` in a process the user started.
    pub(crate) fn of_this_process() -> Option<Self> {
        match std::env::var(ROLE).as_deref() {
            Ok(ROLE_AGENT) => Some(Self::Agent),
            Ok(ROLE_WATCHDOG) => Some(Self::Watchdog),
            _ => None,
        }
    }

    const fn role(self) -> &'static str {
        match self {
            Self::Agent => ROLE_AGENT,
            Self::Watchdog => ROLE_WATCHDOG,
        }
    }

    /// This program, with the agent's own arguments, to be started as this part, with
    /// nothing of this process's environment but `env` (and the part).
    ///
    /// # Errors
    /// When this program's path cannot be found.
    pub(crate) fn command(self, env: &BTreeMap<String, String>) -> std::io::Result<Command> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(std::env::args().skip(1))
            .env_clear()
            .envs(env)
            .env(ROLE, self.role());
        Ok(command)
    }
}
