//! What a running attempt's ranks came to so far: what each returned, each rank's last
//! lines and root cause, and the failed ranks, the first to fail by time first.

use std::collections::VecDeque;

use trainyard_runtime::TaskFailure;
use trainyard_runtime::root_cause::TaskError;

use crate::ranks::rank_of;
use crate::{AttemptFailure, WorldRank};

/// How many of a rank's last output lines a failure keeps.
pub const LAST_LINES: usize = 20;

/// A rank's failed task, with when it ended, as a candidate for the attempt's first failure.
#[derive(Debug)]
struct Failed {
    rank: usize,
    ended_ms: u64,
    failure: AttemptFailure,
}

/// The ranks' returns, last lines, root causes and failures in one attempt.
#[derive(Debug)]
pub(crate) struct Tally {
    returns: Vec<Option<serde_json::Value>>,
    /// How many ranks have not returned yet: counted, so that each return costs the same
    /// however many ranks there are.
    unreturned: usize,
    /// Each rank's last lines.
    tails: Vec<VecDeque<String>>,
    /// Each failed rank's root cause (when its task ended, and the exception it left), as its
    /// worker sent it just before the exit.
    causes: Vec<Option<(u64, Option<TaskError>)>>,
    /// The failed ranks heard of.
    failed: Vec<Failed>,
}

impl Tally {
    /// An attempt of `n` ranks.
    pub(crate) fn new(n: usize) -> Self {
        Self {
            returns: vec![None; n],
            unreturned: n,
            tails: vec![VecDeque::new(); n],
            causes: vec![None; n],
            failed: Vec::new(),
        }
    }

    /// Rank `i` printed `line`.
    pub(crate) fn line(&mut self, i: usize, line: &str) {
        let tail = &mut self.tails[i];
        if tail.len() == LAST_LINES {
            tail.pop_front();
        }
        tail.push_back(line.to_owned());
    }

    /// Rank `i`'s task is about to fail: when it ended, and the exception it left.
    pub(crate) fn root_cause(&mut self, i: usize, ended_ms: u64, error: Option<TaskError>) {
        self.causes[i] = Some((ended_ms, error));
    }

    /// Rank `i` returned `value`; whether every rank has returned now.
    pub(crate) fn returned(&mut self, i: usize, value: serde_json::Value) -> bool {
        if self.returns[i].replace(value).is_none() {
            self.unreturned -= 1;
        }
        self.unreturned == 0
    }

    /// What every rank returned, in world-rank order.
    pub(crate) fn returns(&mut self) -> Vec<serde_json::Value> {
        std::mem::take(&mut self.returns)
            .into_iter()
            .flatten()
            .collect()
    }

    /// Rank `i`'s task failed, after the ranks that returned had returned; its failure, with
    /// its last lines and the root cause its worker sent just before.
    pub(crate) fn failed(&mut self, i: usize, failure: TaskFailure) -> AttemptFailure {
        let (ended_ms, error) = self.causes[i].take().unwrap_or((u64::MAX, None));
        let failure = AttemptFailure::TaskFailed {
            rank: rank_of(i),
            failure,
            last_lines: std::mem::take(&mut self.tails[i]).into(),
            error: error.map(Box::new),
            left_before: self.left_before(i),
        };
        self.failed.push(Failed {
            rank: i,
            ended_ms,
            failure: failure.clone(),
        });
        failure
    }

    /// The ranks other than `i` that have returned.
    fn left_before(&self, i: usize) -> Vec<WorldRank> {
        (0..self.returns.len())
            .filter(|&j| j != i && self.returns[j].is_some())
            .map(rank_of)
            .collect()
    }

    /// Of the ranks that failed, the first by the time its task ended (the first heard of
    /// among equals): the others often fail because it did (a collective whose peer is
    /// gone).
    pub(crate) fn first_failure(self) -> Option<AttemptFailure> {
        self.failed
            .into_iter()
            .enumerate()
            .min_by_key(|(heard, f)| (f.ended_ms, *heard, f.rank))
            .map(|(_, f)| f.failure)
    }
}
