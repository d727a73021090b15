//! Per-worker cgroups and hard memory limits: one cgroup per run, made on first need, with a
//! child per worker, limited when a limit is asked, so that every process of a worker is
//! found, and killed, through it once the worker is gone; or, where no cgroup can be made,
//! an address-space limit on each task process, and no cgroup.

use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use trainyard_resources::ErrorChain;
use trainyard_runtime::ActorId;
use trainyard_wire::config::MemoryLimit;

use crate::lock;
use trainyard_sys::cgroup::{MemoryEnforcement, RunCgroup, WorkerCgroup, sweep_stale};

/// The longest run name used in a cgroup's directory name.
const MAX_RUN_NAME: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Cgroup,
    AddressSpace,
}

/// The run's worker cgroups; nothing touches the machine until the first worker.
#[derive(Debug)]
pub(crate) struct Memory {
    run_name: String,
    mode: OnceCell<Mode>,
    run: Arc<Mutex<Option<RunCgroup>>>,
}

impl Memory {
    pub(crate) fn new(run_name: &str) -> Self {
        Self {
            run_name: cgroup_name(run_name),
            mode: OnceCell::new(),
            run: Arc::new(Mutex::new(None)),
        }
    }

    /// The memory limit of actor `actor`, holding `limit` bytes when one is asked, and its
    /// cgroup when it has one. Without a limit, a cgroup that cannot be made is no error:
    /// the worker goes without (its agent still ends what its tasks leave).
    ///
    /// # Errors
    /// Why a limited worker's cgroup cannot be made, as text for the spawn's error.
    pub(crate) async fn worker(
        &self,
        actor: ActorId,
        limit: Option<u64>,
    ) -> Result<(Option<MemoryLimit>, Option<WorkerCgroup>), String> {
        let mode = *self.mode.get_or_init(|| self.set_up()).await;
        if mode == Mode::AddressSpace {
            return Ok((limit.map(|limit| MemoryLimit::AddressSpace { limit }), None));
        }
        let run = Arc::clone(&self.run);
        let name = format!("actor-{}", actor.0);
        let made = tokio::task::spawn_blocking(move || {
            let run = lock(&run);
            let run = run
                .as_ref()
                .ok_or_else(|| "the run's cgroup was removed".to_owned())?;
            match limit {
                Some(limit) => run.create_worker(&name, limit),
                None => run.create_unlimited_worker(&name),
            }
            .map_err(|error| ErrorChain(&error).to_string())
        })
        .await
        .map_err(|error| format!("making the worker's cgroup failed: {error}"))
        .and_then(std::convert::identity);
        let made = match (made, limit) {
            (Ok(made), _) => made,
            (Err(why), Some(_)) => return Err(why),
            (Err(why), None) => {
                tracing::warn!(%why, actor = actor.0, "the worker has no cgroup");
                return Ok((None, None));
            }
        };
        let path = made.path().to_owned();
        let memory = match limit {
            Some(limit) => MemoryLimit::Cgroup { path, limit },
            None => MemoryLimit::Unlimited { path },
        };
        Ok((Some(memory), Some(made)))
    }

    /// Probes the machine once, sweeps cgroups of dead runs, and makes the run's cgroup.
    async fn set_up(&self) -> Mode {
        let run = Arc::clone(&self.run);
        let run_name = self.run_name.clone();
        let made = tokio::task::spawn_blocking(move || {
            let enforcement = MemoryEnforcement::probe();
            if let MemoryEnforcement::CgroupV1 { parent } | MemoryEnforcement::CgroupV2 { parent } =
                &enforcement
            {
                sweep_stale(parent);
            }
            match enforcement.create_run(&run_name) {
                Ok(cgroup) => {
                    *lock(&run) = Some(cgroup);
                    Ok(())
                }
                Err(error) => Err(ErrorChain(&error).to_string()),
            }
        })
        .await;
        let why = match made {
            Ok(Ok(())) => return Mode::Cgroup,
            Ok(Err(why)) => why,
            Err(error) => format!("setting up memory cgroups failed: {error}"),
        };
        tracing::warn!(
            %why,
            "no cgroup can be used for workers: memory limits are enforced with RLIMIT_AS per task process, and what a task leaves is ended by its agent alone"
        );
        Mode::AddressSpace
    }

    /// Removes the run's cgroup, killing what is left in it. Blocks; later workers get no
    /// cgroup.
    pub(crate) fn remove_all(&self) {
        let run = lock(&self.run).take();
        if let Some(run) = run {
            run.remove();
        }
    }

    /// Whether the run's cgroup exists, so that removing it has work to do.
    pub(crate) fn has_run_cgroup(&self) -> bool {
        lock(&self.run).is_some()
    }
}

/// `run` as a cgroup directory name: letters, digits, `-`, `_` and `.` kept, anything else
/// turned into `-`, no leading `.`, at most [`MAX_RUN_NAME`] characters, never empty.
fn cgroup_name(run: &str) -> String {
    let name: String = run
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .skip_while(|c| *c == '.')
        .take(MAX_RUN_NAME)
        .collect();
    if name.is_empty() {
        "run".to_owned()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_names_become_safe_directory_names() {
        assert_eq!(cgroup_name("job-42_a.b"), "job-42_a.b");
        assert_eq!(cgroup_name("my job/../x"), "my-job-..-x");
        assert_eq!(cgroup_name("..hidden"), "hidden");
        assert_eq!(cgroup_name(""), "run");
        assert_eq!(cgroup_name("ü"), "-");
        assert_eq!(cgroup_name(&"a".repeat(300)).len(), MAX_RUN_NAME);
    }
}
