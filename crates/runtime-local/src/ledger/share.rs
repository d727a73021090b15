//! The local runtime's side of the ledger: its book is reserved only under the ledger's
//! lock, against what the other runs leave free, and what it then holds is written back in
//! the same step — a group is reserved whole, or not at all, machine-wide; and its agents
//! are members of its entry from their start until they are reaped, so that what it holds
//! outlasts its driver while they run.

use std::sync::Arc;
use std::time::Duration;

use trainyard_resources::Resources;
use trainyard_runtime::{Holder, PlacementGroupId, PlacementInfo, RuntimeError, Shortage};
use trainyard_sys::procfs::ProcessHandle;

use super::{Ledger, LedgerError, Member, RunEntry};
use crate::config::WhenBusy;
use crate::runtime::Core;

/// How often a waiting run looks at the ledger again: other runs' releases reach it only
/// through the file.
const POLL: Duration = Duration::from_millis(100);

fn bookkeeping(source: LedgerError) -> RuntimeError {
    RuntimeError::Backend {
        action: "update the machine's reservation ledger",
        source: Arc::new(source),
    }
}

/// Under the ledger's lock: takes what the other runs hold out of the book, reserves the
/// pending groups that fit, and records what the run holds. Returns the other runs. Without
/// a ledger, reserves what fits and returns nothing.
pub(crate) async fn settle(core: &Arc<Core>) -> Result<Vec<RunEntry>, RuntimeError> {
    let Some(ledger) = core.ledger.clone() else {
        core.book().schedule();
        return Ok(Vec::new());
    };
    let core = Arc::clone(core);
    let settled = tokio::task::spawn_blocking(move || {
        ledger.update(|others| {
            let mut book = core.book();
            book.set_held_elsewhere(others.iter().flat_map(|run| &run.bundles));
            book.schedule();
            (book.held_bundles(), others.to_vec())
        })
    })
    .await;
    match settled {
        Ok(result) => result.map_err(bookkeeping),
        Err(join) => Err(RuntimeError::Backend {
            action: "update the machine's reservation ledger",
            source: Arc::new(join),
        }),
    }
}

/// Removes the run's entry from the ledger (a warning when it cannot).
pub(crate) fn release_now(core: &Core) {
    if let Some(ledger) = &core.ledger {
        if let Err(error) = ledger.release() {
            tracing::warn!(error = %trainyard_resources::ErrorChain(&error), "cannot remove the run from the ledger");
        }
    }
}

/// [`release_now`] off the async threads.
pub(crate) async fn release(core: &Arc<Core>) {
    let core = Arc::clone(core);
    let _ = tokio::task::spawn_blocking(move || release_now(&core)).await;
}

/// An agent of the run, a member of the run's ledger entry until [`Membership::end`].
#[derive(Debug)]
pub(crate) struct Membership {
    ledger: Arc<Ledger>,
    member: Member,
}

/// Records `agent`, just started and not reaped, as a member of the run's ledger entry (off
/// the async threads). `None` without a ledger.
pub(crate) async fn join(
    core: &Core,
    agent: &ProcessHandle,
) -> Result<Option<Membership>, RuntimeError> {
    let Some(ledger) = core.ledger.clone() else {
        return Ok(None);
    };
    let membership = Membership {
        ledger,
        member: Member {
            pid: agent.pid(),
            start_time: agent.start_time(),
        },
    };
    let ledger = Arc::clone(&membership.ledger);
    let member = membership.member;
    match tokio::task::spawn_blocking(move || ledger.add_member(member)).await {
        Ok(Ok(())) => Ok(Some(membership)),
        Ok(Err(error)) => Err(bookkeeping(error)),
        Err(join) => Err(RuntimeError::Backend {
            action: "update the machine's reservation ledger",
            source: Arc::new(join),
        }),
    }
}

impl Membership {
    /// Removes the agent, ended and reaped, from the run's entry (off the async threads; a
    /// warning when it cannot: a member that is gone keeps nothing).
    pub(crate) async fn end(&self) {
        let ledger = Arc::clone(&self.ledger);
        let member = self.member;
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(error) = ledger.remove_member(member) {
                tracing::warn!(
                    pid = member.pid,
                    error = %trainyard_resources::ErrorChain(&error),
                    "cannot remove an ended agent from the ledger"
                );
            }
        })
        .await;
    }
}

/// Waits up to `timeout` for group `pg`, looking at the ledger every [`POLL`], and says
/// what it waits for on [`Core::shortage`] whenever that changes. With [`WhenBusy::Fail`],
/// a group that does not fit now fails at once with [`RuntimeError::Busy`].
pub(crate) async fn wait_ready(
    core: &Arc<Core>,
    pg: PlacementGroupId,
    timeout: Duration,
) -> Result<PlacementInfo, RuntimeError> {
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    let outcome = loop {
        let others = match settle(core).await {
            Ok(others) => others,
            Err(error) => break Err(error),
        };
        let looked = {
            let book = core.book();
            book.placement_info(pg)
                .map(|info| info.ok_or_else(|| book.shortfall(pg).unwrap_or_default()))
        };
        let missing = match looked {
            Ok(Ok(info)) => break Ok(info),
            Ok(Err(missing)) => missing,
            Err(error) => break Err(error),
        };
        let shortage = shortage(pg, missing, &others);
        if core.config.when_busy == WhenBusy::Fail {
            break Err(RuntimeError::Busy(Box::new(shortage)));
        }
        core.shortage.send_if_modified(|now| {
            let changed = now.as_ref() != Some(&shortage);
            if changed {
                *now = Some(shortage);
            }
            changed
        });
        let now = tokio::time::Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            break Err(RuntimeError::PlacementTimeout {
                pg,
                waited: timeout,
            });
        }
        let pause = deadline.map_or(POLL, |deadline| POLL.min(deadline - now));
        tokio::time::sleep(pause).await;
    };
    core.shortage.send_replace(None);
    outcome
}

/// Waits at most `timeout` until what is free on this machine changes (another run took or
/// released resources), looking at the ledger every [`POLL`].
pub(crate) async fn free_changed(core: &Arc<Core>, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    let free = |core: &Core| core.book().snapshot();
    let before = match settle(core).await {
        Ok(_) => free(core),
        Err(_) => return tokio::time::sleep_until(deadline).await,
    };
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return;
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
        if settle(core).await.is_ok() && free(core) != before {
            return;
        }
    }
}

/// What group `pg` lacks (`missing`, from [`Reservations::shortfall`](trainyard_runtime::reservations::Reservations::shortfall)), and the other runs that hold some of it (every other run that
/// holds anything when none holds the missing resources themselves).
pub fn shortage(pg: PlacementGroupId, missing: Resources, others: &[RunEntry]) -> Shortage {
    let holders: Vec<Holder> = others.iter().map(holder).collect();
    let holds_missing = |h: &Holder| {
        missing
            .iter()
            .any(|(name, _)| !h.holds.amount(name).is_zero())
    };
    let holders = if holders.iter().any(holds_missing) {
        holders.into_iter().filter(holds_missing).collect()
    } else {
        holders
            .into_iter()
            .filter(|h| !h.holds.is_empty())
            .collect()
    };
    Shortage {
        pg,
        missing,
        holders,
    }
}

/// A run's entry summed up: everything it holds, and its device ids.
pub fn holder(run: &RunEntry) -> Holder {
    let mut holds = Resources::new();
    let mut devices = std::collections::BTreeMap::<String, Vec<String>>::new();
    for bundle in &run.bundles {
        // What one machine's runs hold adds up to far below the overflow limit.
        let _ = holds.checked_add_assign(&bundle.resources);
        for (name, ids) in &bundle.devices {
            let list = devices.entry(name.clone()).or_default();
            for id in ids {
                if !list.contains(id) {
                    list.push(id.clone());
                }
            }
        }
    }
    Holder {
        run: run.run.clone(),
        pid: run.owner.pid,
        holds: holds.without_zeros(),
        devices,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use trainyard_runtime::reservations::HeldBundle;

    use super::*;
    use crate::ledger::Owner;

    fn entry(run: &str, pid: u32, held: &[(&str, &[&str])]) -> RunEntry {
        let bundles = held
            .iter()
            .map(|(resources, gpus)| HeldBundle {
                resources: resources.parse().expect("resources"),
                devices: if gpus.is_empty() {
                    BTreeMap::new()
                } else {
                    BTreeMap::from([(
                        "GPU".to_owned(),
                        gpus.iter().map(|g| (*g).to_owned()).collect(),
                    )])
                },
            })
            .collect();
        RunEntry {
            run: run.to_owned(),
            owner: Owner {
                pid,
                start_time: 1,
                uid: 0,
            },
            instance: 0,
            bundles,
            members: std::collections::BTreeSet::new(),
        }
    }

    #[test]
    fn the_holders_named_are_the_runs_holding_what_is_missing() {
        let others = [
            entry("cpu-only", 10, &[("CPU=2", &[])]),
            entry(
                "gpus",
                11,
                &[("CPU=1,GPU=1", &["0"]), ("CPU=1,GPU=1", &["1"])],
            ),
        ];
        let missing: Resources = "GPU=1".parse().expect("resources");
        let shortage = shortage(PlacementGroupId(3), missing, &others);
        assert_eq!(shortage.holders.len(), 1);
        let holder = &shortage.holders[0];
        assert_eq!((holder.run.as_str(), holder.pid), ("gpus", 11));
        assert_eq!(holder.holds, "CPU=2,GPU=2".parse().expect("resources"));
        assert_eq!(holder.devices["GPU"], ["0", "1"]);
        assert_eq!(
            shortage.to_string(),
            "GPU=1 is not free: run `gpus` (pid 11) holds CPU=2,GPU=2 (GPU 0,1)"
        );
    }

    #[test]
    fn when_nobody_holds_the_missing_resource_every_holder_is_named() {
        let others = [entry("a", 10, &[("CPU=2", &[])]), entry("b", 11, &[])];
        let missing: Resources = "memory=1024".parse().expect("resources");
        let shortage = shortage(PlacementGroupId(0), missing, &others);
        let runs: Vec<&str> = shortage.holders.iter().map(|h| h.run.as_str()).collect();
        assert_eq!(runs, ["a"], "a run holding nothing is not a holder");
    }
}
