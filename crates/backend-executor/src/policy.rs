//! What the run does after an attempt: a pure function of the attempts so far
//! ([`History`]) and how the last one ended ([`Outcome`]), as kube-rs's error policy returns
//! an `Action`. Ray Train v2's rules: a failed attempt restarts everything from scratch while
//! `max_failures` allows (the run's first restart at once, the later ones after a backoff
//! that grows with the failures, so that a crash loop slows down); a preemption restarts without using up that
//! budget; a failure [`classify`] calls fatal ends the run at once; room for more workers
//! restarts an elastic run at the larger size, not as a failure.

use std::time::Duration;

use trainyard_config::FailureConfig;

use crate::{AttemptFailure, Backoff, Disposition, classify};

/// How an attempt that ran its course ended (a stop request and a run that cannot go on are
/// not for the policy to judge: they end the run).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// Every rank's task succeeded.
    Succeeded,
    /// The attempt failed.
    Failed(AttemptFailure),
    /// The attempt was stopped because room for `to` workers appeared.
    RoomFor(u32),
}

/// What the run does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Start the next attempt from scratch after waiting `after`.
    Restart { after: Duration },
    /// Start the next attempt at once, with `to` workers.
    Resize { to: u32 },
    /// The run succeeded.
    Finish,
    /// The run failed.
    Fail,
}

/// What the attempts of a run came to so far.
#[derive(Debug, Default)]
pub(crate) struct History {
    /// Attempts begun.
    pub(crate) attempts: u32,
    /// The failure of each failed attempt.
    pub(crate) failures: Vec<AttemptFailure>,
    /// How many of them were preemptions, which `max_failures` does not count.
    requeued: usize,
    /// Attempts stopped to resize the run, which are not failures either.
    pub(crate) resizes: u32,
    /// Each attempt's world size.
    pub(crate) world_sizes: Vec<u32>,
}

impl History {
    /// Restarts before the next attempt: one per failure and per resize.
    pub(crate) fn restarts(&self) -> u32 {
        u32::try_from(self.failures.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.resizes)
    }

    /// The failures that count against `max_failures`.
    fn counted_failures(&self) -> u32 {
        u32::try_from(self.failures.len() - self.requeued).unwrap_or(u32::MAX)
    }

    /// Books how the last attempt ended.
    pub(crate) fn record(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Succeeded => {}
            Outcome::Failed(failure) => {
                self.failures.push(failure.clone());
                if classify(failure) == Disposition::Requeue {
                    self.requeued += 1;
                }
            }
            Outcome::RoomFor(_) => self.resizes += 1,
        }
    }
}

/// The run's rules for what follows an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    /// How many failures the run survives.
    pub(crate) failures: FailureConfig,
    /// The wait before each restart.
    pub(crate) backoff: Backoff,
}

impl Policy {
    /// What follows `outcome`, given the `history` that already records it.
    pub(crate) fn next(&self, history: &History, outcome: &Outcome) -> Action {
        match outcome {
            Outcome::Succeeded => Action::Finish,
            Outcome::RoomFor(to) => Action::Resize { to: *to },
            Outcome::Failed(failure) => {
                let disposition = classify(failure);
                let count = history.counted_failures();
                if disposition == Disposition::Fatal
                    || (disposition == Disposition::Restart && !self.failures.should_restart(count))
                {
                    return Action::Fail;
                }
                // One failure is no crash loop: the run's first restart is at once, and the
                // backoff grows from the second on with the failures counted.
                let after = if history.failures.len() <= 1 {
                    Duration::ZERO
                } else {
                    self.backoff.delay(count.saturating_sub(1).max(1))
                };
                Action::Restart { after }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use trainyard_runtime::{DeathCause, TaskFailure};

    use super::*;
    use crate::WorldRank;

    fn user_error() -> AttemptFailure {
        AttemptFailure::TaskFailed {
            rank: WorldRank(0),
            failure: TaskFailure::Error {
                message: "boom".to_owned(),
            },
            last_lines: Vec::new(),
            error: None,
            left_before: Vec::new(),
        }
    }

    fn preempted() -> AttemptFailure {
        AttemptFailure::WorkerDied {
            rank: Some(WorldRank(0)),
            cause: DeathCause::Preempted,
        }
    }

    fn typo() -> AttemptFailure {
        AttemptFailure::TaskRejected {
            rank: WorldRank(0),
            rejection: trainyard_runtime::TaskRejection::ProgramNotFound {
                program: "pyhton".to_owned(),
            },
        }
    }

    /// Plays `outcomes` in order through a fresh history; the action after each.
    fn play(policy: &Policy, outcomes: &[Outcome]) -> Vec<Action> {
        let mut history = History::default();
        outcomes
            .iter()
            .map(|outcome| {
                history.record(outcome);
                policy.next(&history, outcome)
            })
            .collect()
    }

    #[test]
    fn each_outcome_leads_to_its_action_as_the_budget_allows() {
        let second = Duration::from_secs(1);
        let zero = Duration::ZERO;
        let backoff = Backoff::default();
        let restarts = |n| Policy {
            failures: FailureConfig::restarts(n),
            backoff,
        };
        let none = Policy {
            failures: FailureConfig::restarts(1),
            backoff: Backoff::NONE,
        };
        let table: Vec<(&str, Policy, Vec<Outcome>, Vec<Action>)> = vec![
            (
                "success finishes",
                restarts(0),
                vec![Outcome::Succeeded],
                vec![Action::Finish],
            ),
            (
                "a first failure within the budget restarts at once",
                restarts(1),
                vec![Outcome::Failed(user_error()), Outcome::Failed(user_error())],
                vec![Action::Restart { after: zero }, Action::Fail],
            ),
            (
                "the backoff starts with the second failure and doubles with those counted",
                restarts(3),
                vec![
                    Outcome::Failed(user_error()),
                    Outcome::Failed(user_error()),
                    Outcome::Failed(user_error()),
                ],
                vec![
                    Action::Restart { after: zero },
                    Action::Restart { after: second },
                    Action::Restart { after: 2 * second },
                ],
            ),
            (
                "no budget fails at once",
                restarts(0),
                vec![Outcome::Failed(user_error())],
                vec![Action::Fail],
            ),
            (
                "a preemption restarts without using up the budget",
                restarts(0),
                vec![
                    Outcome::Failed(preempted()),
                    Outcome::Failed(preempted()),
                    Outcome::Succeeded,
                ],
                vec![
                    Action::Restart { after: zero },
                    Action::Restart { after: second },
                    Action::Finish,
                ],
            ),
            (
                "a fatal failure ends the run whatever the budget",
                Policy {
                    failures: FailureConfig::unlimited(),
                    backoff,
                },
                vec![Outcome::Failed(typo())],
                vec![Action::Fail],
            ),
            (
                "room for more workers resizes and is no failure",
                restarts(0),
                vec![Outcome::RoomFor(4), Outcome::Failed(user_error())],
                vec![Action::Resize { to: 4 }, Action::Fail],
            ),
            (
                "without a backoff a restart is immediate",
                none,
                vec![Outcome::Failed(user_error())],
                vec![Action::Restart {
                    after: Duration::ZERO,
                }],
            ),
        ];
        for (name, policy, outcomes, expected) in table {
            assert_eq!(play(&policy, &outcomes), expected, "{name}");
        }
    }

    #[test]
    fn the_history_counts_restarts_and_resizes() {
        let mut history = History::default();
        for outcome in [
            Outcome::Failed(user_error()),
            Outcome::RoomFor(3),
            Outcome::Failed(preempted()),
        ] {
            history.record(&outcome);
        }
        assert_eq!(history.restarts(), 3);
        assert_eq!(history.counted_failures(), 1);
        assert_eq!(history.resizes, 1);
    }
}
