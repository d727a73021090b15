//! Why an agent is gone, from what the driver knows when its connection ends.

use trainyard_runtime::DeathCause;

use crate::AgentExit;

/// What the driver saw of an agent's end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// What the driver did to it (killed, stopped, removed its group), if anything.
    pub(crate) by_driver: Option<DeathCause>,
    /// How the agent ended, when that was seen in time.
    pub(crate) exit: Option<AgentExit>,
    /// The memory limit under which the OOM killer struck the worker, when it did.
    pub(crate) memory_kill: Option<u64>,
}

/// The cause of the death: what the driver did; else the memory limit when the OOM killer
/// struck the worker under it; else how the process ended; else a lost connection.
pub(crate) fn cause_of_death(seen: &Seen) -> DeathCause {
    if let Some(cause) = &seen.by_driver {
        return cause.clone();
    }
    if let Some(limit) = seen.memory_kill {
        return DeathCause::MemoryLimit { limit };
    }
    seen.exit
        .as_ref()
        .map_or(DeathCause::ConnectionLost, AgentExit::death_cause)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::unix::process::ExitStatusExt as _;
    use std::process::ExitStatus;

    fn exited(code: i32) -> Option<AgentExit> {
        Some(AgentExit::Exited { code })
    }

    fn signalled(signal: i32) -> Option<AgentExit> {
        Some(AgentExit::Signalled { signal })
    }

    #[test]
    fn what_the_driver_did_wins_over_how_the_process_ended() {
        let seen = Seen {
            by_driver: Some(DeathCause::Killed),
            exit: signalled(9),
            memory_kill: Some(1 << 30),
        };
        assert_eq!(cause_of_death(&seen), DeathCause::Killed);
    }

    #[test]
    fn an_oom_kill_in_the_cgroup_is_told_apart_from_a_plain_sigkill() {
        let oom = Seen {
            exit: signalled(9),
            memory_kill: Some(1 << 30),
            ..Seen::default()
        };
        assert_eq!(
            cause_of_death(&oom),
            DeathCause::MemoryLimit { limit: 1 << 30 }
        );
        let plain = Seen {
            memory_kill: None,
            ..oom
        };
        assert_eq!(
            cause_of_death(&plain),
            DeathCause::ProcessExited {
                code: None,
                signal: Some(9)
            }
        );
    }

    #[test]
    fn an_exit_code_is_kept_and_no_status_means_a_lost_connection() {
        let seen = Seen {
            exit: exited(3),
            ..Seen::default()
        };
        assert_eq!(
            cause_of_death(&seen),
            DeathCause::ProcessExited {
                code: Some(3),
                signal: None
            }
        );
        assert_eq!(cause_of_death(&Seen::default()), DeathCause::ConnectionLost);
    }

    #[test]
    fn a_cause_the_starting_runtime_reports_is_kept_as_it_is() {
        let lost = DeathCause::NodeLost {
            node: "node-1".into(),
        };
        let seen = Seen {
            exit: Some(AgentExit::Died(lost.clone())),
            ..Seen::default()
        };
        assert_eq!(cause_of_death(&seen), lost);
    }

    #[test]
    fn a_reaped_childs_wait_status_becomes_its_code_or_its_signal() {
        // As the kernel reports them: `code << 8`, or the signal number.
        assert_eq!(
            AgentExit::from(ExitStatus::from_raw(3 << 8)),
            AgentExit::Exited { code: 3 }
        );
        assert_eq!(
            AgentExit::from(ExitStatus::from_raw(9)),
            AgentExit::Signalled { signal: 9 }
        );
        assert_eq!(AgentExit::Exited { code: 7 }.to_string(), "exit status: 7");
        assert_eq!(
            AgentExit::Signalled { signal: 9 }.to_string(),
            "signal: 9 (SIGKILL)"
        );
    }
}
