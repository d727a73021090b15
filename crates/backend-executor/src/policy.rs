//! What the run does after an attempt: a pure function of the attempts so far
//! ([`History`]) and how the last one ended ([`Outcome`]), as kube-rs's error policy returns
//! an `Action`. Ray Train v2's rules: a failed attempt restarts everything from scratch while
//! `max_failures` allows; a preemption restarts without using up that budget; a failure
//! [`classify`] calls fatal ends the run at once; room for more workers restarts an elastic
//! run at the larger size, not as a failure.
//!
//! # The wait before a restart
//!
//! Ray Train and torchrun restart at once, and so does a run here after an attempt that made
//! [progress](Policy::made_progress): it committed a checkpoint (the next attempt resumes
//! from a later one), or its tasks ran at least as long as the back-off's longest wait (a
//! program that keeps its checkpoints itself). Only a crash loop waits: the failures in a row
//! of attempts that made none, since the run began or since the last attempt that did. The
//! first of them restarts at once too (one failure is no loop); from the second on the
//! [`Backoff`] grows with the failures among them that `max_failures` counts (1 s, 2 s, 4 s,
//! ... up to 30 s by default). An attempt that makes progress ends the loop, and a loop after
//! it backs off from the start again. What `max_failures` counts does not depend on progress.

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

/// What an attempt got done, as far as the run can tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Whether it committed a checkpoint.
    pub(crate) committed: bool,
    /// How long its tasks ran before the attempt's end was decided (zero: they never started).
    pub(crate) trained: Duration,
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
    /// Where in `failures` the crash loop begins: after the last attempt that made progress.
    stalled_from: usize,
    /// Attempts stopped to resize the run, which are not failures either.
    pub(crate) resizes: u32,
    /// Each attempt's world size.
    pub(crate) world_sizes: Vec<u32>,
}

/// How many of `failures` count against `max_failures` (preemptions do not).
fn counted(failures: &[AttemptFailure]) -> u32 {
    let n = failures
        .iter()
        .filter(|failure| classify(failure) != Disposition::Requeue)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
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
        counted(&self.failures)
    }

    /// The failures of the attempts that made no progress since the last one that did (or
    /// since the run began): the crash loop the back-off slows down.
    fn stalled(&self) -> &[AttemptFailure] {
        &self.failures[self.stalled_from..]
    }

    /// Books how the last attempt ended, and whether it made progress.
    pub(crate) fn record(&mut self, outcome: &Outcome, progressed: bool) {
        match outcome {
            Outcome::Succeeded => {}
            Outcome::Failed(failure) => self.failures.push(failure.clone()),
            Outcome::RoomFor(_) => self.resizes += 1,
        }
        if progressed {
            self.stalled_from = self.failures.len();
        }
    }
}

/// The run's rules for what follows an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    /// How many failures the run survives.
    pub(crate) failures: FailureConfig,
    /// The wait before a restart in a crash loop.
    pub(crate) backoff: Backoff,
}

impl Policy {
    /// Whether an attempt that got `progress` done made progress: it committed a checkpoint,
    /// or its tasks ran at least as long as the longest wait (a loop that slow is not one
    /// the back-off would slow down much more).
    pub(crate) fn made_progress(&self, progress: Progress) -> bool {
        progress.committed || progress.trained >= self.backoff.max
    }

    /// What follows `outcome`, given the `history` that already records it.
    pub(crate) fn next(&self, history: &History, outcome: &Outcome) -> Action {
        match outcome {
            Outcome::Succeeded => Action::Finish,
            Outcome::RoomFor(to) => Action::Resize { to: *to },
            Outcome::Failed(failure) => {
                let disposition = classify(failure);
                if disposition == Disposition::Fatal
                    || (disposition == Disposition::Restart
                        && !self.failures.should_restart(history.counted_failures()))
                {
                    return Action::Fail;
                }
                // A failure after progress is no crash loop, and neither is one failure: at
                // once. From a loop's second failure on, the wait grows with those counted.
                let stalled = history.stalled();
                let after = if stalled.len() <= 1 {
                    Duration::ZERO
                } else {
                    self.backoff
                        .delay(counted(stalled).saturating_sub(1).max(1))
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

    /// Plays `outcomes` of attempts that made no progress in order through a fresh history;
    /// the action after each.
    fn play(policy: &Policy, outcomes: &[Outcome]) -> Vec<Action> {
        let attempts: Vec<_> = outcomes.iter().map(|o| (o.clone(), false)).collect();
        play_progress(policy, &attempts)
    }

    /// Plays `attempts` (each outcome, and whether the attempt made progress) in order
    /// through a fresh history; the action after each.
    fn play_progress(policy: &Policy, attempts: &[(Outcome, bool)]) -> Vec<Action> {
        let mut history = History::default();
        attempts
            .iter()
            .map(|(outcome, progressed)| {
                history.record(outcome, *progressed);
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
            history.record(&outcome, false);
        }
        assert_eq!(history.restarts(), 3);
        assert_eq!(history.counted_failures(), 1);
        assert_eq!(history.resizes, 1);
    }

    /// An attempt's failure, and whether it made progress.
    fn failed(progressed: bool) -> (Outcome, bool) {
        (Outcome::Failed(user_error()), progressed)
    }

    #[test]
    fn failures_after_progress_restart_at_once() {
        let policy = Policy {
            failures: FailureConfig::unlimited(),
            backoff: Backoff::default(),
        };
        let attempts = vec![failed(true); 12];
        let actions = play_progress(&policy, &attempts);
        assert_eq!(
            actions,
            vec![
                Action::Restart {
                    after: Duration::ZERO
                };
                12
            ]
        );
    }

    #[test]
    fn a_crash_loop_after_progress_backs_off_from_the_start_again() {
        let second = Duration::from_secs(1);
        let zero = Duration::ZERO;
        let policy = Policy {
            failures: FailureConfig::restarts(8),
            backoff: Backoff::default(),
        };
        let attempts = [
            failed(false),
            failed(false),
            failed(false),
            failed(true),
            failed(false),
            failed(false),
            failed(false),
            (Outcome::Failed(preempted()), false),
            failed(false),
            failed(false),
        ];
        let restart = |after| Action::Restart { after };
        assert_eq!(
            play_progress(&policy, &attempts),
            vec![
                restart(zero),
                restart(second),
                restart(2 * second),
                // Progress: no loop, and the next one starts from the beginning.
                restart(zero),
                restart(zero),
                restart(second),
                restart(2 * second),
                // A preemption waits as before, and is not counted.
                restart(2 * second),
                restart(4 * second),
                // `max_failures` counts every failure but the preemption, progress or not.
                Action::Fail,
            ]
        );
    }

    #[test]
    fn progress_is_a_committed_checkpoint_or_training_as_long_as_the_longest_wait() {
        let policy = Policy {
            failures: FailureConfig::unlimited(),
            backoff: Backoff::default(),
        };
        let progress = |committed, trained| Progress { committed, trained };
        let max = Backoff::default().max;
        assert!(policy.made_progress(progress(true, Duration::ZERO)));
        assert!(policy.made_progress(progress(false, max)));
        assert!(!policy.made_progress(progress(false, max - Duration::from_millis(1))));
        assert!(!policy.made_progress(Progress::default()));
        let none = Policy {
            backoff: Backoff::NONE,
            ..policy
        };
        assert!(none.made_progress(Progress::default()));
    }
}
