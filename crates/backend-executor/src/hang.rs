//! Hung ranks: a progress deadline per rank ([`Progress`]), and every rank's stacks captured
//! when one passes or when a user asks ([`StacksTrigger`](crate::StacksTrigger)).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use trainyard_runtime::stacks::TaskStacks;
use trainyard_runtime::{ActorId, ActorRuntime, ActorRuntimeExt as _};

use crate::WorldRank;
use crate::ranks::rank_of;

/// How long capturing every rank's stacks may take in all; a rank whose worker has not
/// answered by then is shown without them.
pub const STACKS_LIMIT: Duration = Duration::from_secs(4);

/// How many innermost frames a rank's line shows.
const SUMMARY_FRAMES: usize = 3;

/// Why stacks were captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StacksReason {
    /// A rank made no progress within the hang timeout; the attempt is stopped next.
    Hung,
    /// Someone asked ([`StacksTrigger`](crate::StacksTrigger), `SIGQUIT`); the run goes on.
    Requested,
}

/// One rank's stacks, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankStacks {
    /// Its world rank.
    pub rank: WorldRank,
    /// What its worker captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<TaskStacks>,
    /// Why nothing was captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RankStacks {
    /// `rank 1: pid 4242, S hrtimer_nanosleep: <module> (train.py:9)`.
    #[must_use]
    pub fn summary(&self) -> String {
        match (&self.stacks, &self.error) {
            (Some(stacks), _) => format!("rank {}: {}", self.rank, stacks.summary(SUMMARY_FRAMES)),
            (None, Some(error)) => format!("rank {}: no stacks: {error}", self.rank),
            (None, None) => format!("rank {}: no stacks", self.rank),
        }
    }
}

/// Every rank's stacks in full, as the dump file keeps them.
#[must_use]
pub fn full_dump(ranks: &[RankStacks]) -> String {
    let mut text = String::new();
    for rank in ranks {
        let _ = writeln!(text, "=== rank {} ===", rank.rank);
        match (&rank.stacks, &rank.error) {
            (Some(stacks), _) => {
                let _ = write!(text, "{stacks}");
            }
            (None, error) => {
                let _ = writeln!(text, "no stacks: {}", error.as_deref().unwrap_or("unknown"));
            }
        }
        text.push('\n');
    }
    text
}

/// When each rank last made progress, and which ranks are past their deadline.
#[derive(Debug)]
pub(crate) struct Progress {
    timeout: Option<Duration>,
    last: Vec<Instant>,
    done: Vec<bool>,
}

impl Progress {
    /// `n` ranks whose tasks started at `now`; without a timeout no rank is ever hung.
    pub(crate) fn new(n: usize, timeout: Option<Duration>, now: Instant) -> Self {
        Self {
            timeout,
            last: vec![now; n],
            done: vec![false; n],
        }
    }

    /// Rank `i` made progress at `now`.
    pub(crate) fn made(&mut self, i: usize, now: Instant) {
        if let Some(last) = self.last.get_mut(i) {
            *last = now;
        }
    }

    /// Rank `i`'s task has ended: it can no longer hang.
    pub(crate) fn finished(&mut self, i: usize) {
        if let Some(done) = self.done.get_mut(i) {
            *done = true;
        }
    }

    /// The earliest deadline of a running rank.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let timeout = self.timeout?;
        self.last
            .iter()
            .zip(&self.done)
            .filter(|(_, done)| !**done)
            .map(|(last, _)| *last + timeout)
            .min()
    }

    /// The running ranks past their deadline at `now`, and how long the longest of them
    /// went without progress.
    pub(crate) fn hung(&self, now: Instant) -> (Vec<usize>, Duration) {
        let Some(timeout) = self.timeout else {
            return (Vec::new(), Duration::ZERO);
        };
        let mut idle = Duration::ZERO;
        let hung = (0..self.last.len())
            .filter(|&i| !self.done[i] && now.duration_since(self.last[i]) >= timeout)
            .inspect(|&i| idle = idle.max(now.duration_since(self.last[i])))
            .collect();
        (hung, idle)
    }
}

/// Every rank's stacks (`actors` in world-rank order), asked of all workers at once; bounded
/// by [`STACKS_LIMIT`].
pub(crate) async fn capture_stacks(
    runtime: &Arc<dyn ActorRuntime>,
    actors: &[ActorId],
) -> Vec<RankStacks> {
    let calls = actors
        .iter()
        .map(|actor| tokio::time::timeout(STACKS_LIMIT, runtime.stacks(*actor)));
    join_all(calls)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, answer)| {
            let (stacks, error) = match answer {
                Ok(Ok(stacks)) => (Some(stacks), None),
                Ok(Err(error)) => (None, Some(error.to_string())),
                Err(_) => (
                    None,
                    Some(format!(
                        "its worker did not answer within {} s",
                        STACKS_LIMIT.as_secs()
                    )),
                ),
            };
            RankStacks {
                rank: rank_of(i),
                stacks,
                error,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_running_rank_sets_the_deadline() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut progress = Progress::new(3, Some(5 * second), start);
        assert_eq!(progress.deadline(), Some(start + 5 * second));
        progress.made(0, start + 2 * second);
        progress.made(1, start + 3 * second);
        // Rank 2 has made none: its deadline comes first.
        assert_eq!(progress.deadline(), Some(start + 5 * second));
        assert_eq!(progress.hung(start + 5 * second), (vec![2], 5 * second));
        progress.finished(2);
        assert_eq!(progress.deadline(), Some(start + 7 * second));
        assert_eq!(progress.hung(start + 6 * second).0, Vec::<usize>::new());
        let (hung, idle) = progress.hung(start + 9 * second);
        assert_eq!((hung, idle), (vec![0, 1], 7 * second));
    }

    #[test]
    fn without_a_timeout_nothing_hangs() {
        let start = Instant::now();
        let progress = Progress::new(2, None, start);
        assert_eq!(progress.deadline(), None);
        assert!(
            progress
                .hung(start + Duration::from_secs(86_400))
                .0
                .is_empty()
        );
    }

    #[test]
    fn a_rank_without_stacks_says_why() {
        let rank = RankStacks {
            rank: WorldRank(1),
            stacks: None,
            error: Some("its worker did not answer within 4 s".to_owned()),
        };
        assert_eq!(
            rank.summary(),
            "rank 1: no stacks: its worker did not answer within 4 s"
        );
        assert!(full_dump(&[rank]).starts_with("=== rank 1 ===\nno stacks: its worker"));
    }
}
