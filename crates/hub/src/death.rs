//! Why an agent is gone, from what the driver knows when its connection ends.

use std::os::unix::process::ExitStatusExt as _;

use trainyard_runtime::DeathCause;

use crate::AgentExit;

/// What the driver saw of an agent's end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// What the driver did to it (killed, stopped, removed its group), if anything.
    pub(crate) by_driver: Option<DeathCause>,
    /// How the agent ended, when that was seen in time.
    pub(crate) exit: Option<AgentExit>,
    /// How many processes the OOM killer killed in the worker's cgroup.
    pub(crate) oom_kills: u64,
    /// The worker's hard memory limit, in bytes, when it has one.
    pub(crate) memory_limit: Option<u64>,
}

/// The cause of the death: what the driver did; else the memory limit when the OOM killer
/// struck the worker's cgroup; else how the process ended; else a lost connection.
pub(crate) fn cause_of_death(seen: &Seen) -> DeathCause {
    if let Some(cause) = &seen.by_driver {
        return cause.clone();
    }
    if let (true, Some(limit)) = (seen.oom_kills > 0, seen.memory_limit) {
        return DeathCause::MemoryLimit { limit };
    }
    match &seen.exit {
        Some(AgentExit::Status(status)) => DeathCause::ProcessExited {
            code: status.code(),
            signal: status.signal(),
        },
        Some(AgentExit::Died(cause)) => cause.clone(),
        None => DeathCause::ConnectionLost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::process::ExitStatus;

    /// A wait status as the kernel reports it: `code << 8`, or the signal number.
    fn exited(code: i32) -> Option<AgentExit> {
        Some(AgentExit::Status(ExitStatus::from_raw(code << 8)))
    }

    fn signalled(signal: i32) -> Option<AgentExit> {
        Some(AgentExit::Status(ExitStatus::from_raw(signal)))
    }

    #[test]
    fn what_the_driver_did_wins_over_how_the_process_ended() {
        let seen = Seen {
            by_driver: Some(DeathCause::Killed),
            exit: signalled(9),
            oom_kills: 1,
            memory_limit: Some(1 << 30),
        };
        assert_eq!(cause_of_death(&seen), DeathCause::Killed);
    }

    #[test]
    fn an_oom_kill_in_the_cgroup_is_told_apart_from_a_plain_sigkill() {
        let oom = Seen {
            exit: signalled(9),
            oom_kills: 2,
            memory_limit: Some(1 << 30),
            ..Seen::default()
        };
        assert_eq!(
            cause_of_death(&oom),
            DeathCause::MemoryLimit { limit: 1 << 30 }
        );
        let plain = Seen {
            oom_kills: 0,
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
}
