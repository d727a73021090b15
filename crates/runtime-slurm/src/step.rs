//! A worker's agent as a Slurm job step: `srun --jobid J --nodes 1 --ntasks 1 --exact -w
//! NODE …`, seen through the `srun` process on the driver's host, and what Slurm says on its
//! stderr about the step's end (an OOM kill, a cancellation, a time limit, a preemption, a
//! node failure).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Child;
use tokio::task::JoinHandle;
use trainyard_hub::{AgentExit, AgentProcess};
use trainyard_runtime::{DeathCause, NodeId};
use trainyard_sys::procfs::ProcessHandle;

use crate::slurm;

/// How long the end of `srun`'s stderr may take to be read once it has exited.
const STDERR_DRAIN: Duration = Duration::from_secs(2);
/// How long a cancelled step's `srun` gets to see the step end before it is killed.
const SRUN_KILL_AFTER: Duration = Duration::from_secs(3);
/// How long `srun` gets to exit once its agent's connection is lost.
const SRUN_EXIT_WAIT: Duration = Duration::from_secs(10);
/// How old a step must be before it is cancelled: Slurm 22.05's `slurmstepd`, cancelled in
/// the first tens of milliseconds of its launch, was seen to hang in a futex wait for good,
/// its job stuck completing and the node's CPUs taken (`slurmd`: `STEP … CANCELLED` 63 ms
/// after `launch task`, then nothing).
const STEP_SETTLE: Duration = Duration::from_secs(1);

/// What Slurm said about a step's end, from `srun`'s stderr.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StepEnd {
    /// The cgroup's OOM killer struck (`task 0: Out Of Memory`, `oom-kill event`).
    pub(crate) out_of_memory: bool,
    /// Slurm's RSS polling killed it (`exceeded memory limit (X > LIMIT)`): the limit.
    pub(crate) over_limit: Option<u64>,
    /// The step or its job was ended by Slurm: why.
    pub(crate) ended: Option<DeathCause>,
}

impl StepEnd {
    /// Takes in one line of `srun`'s stderr.
    pub(crate) fn note(&mut self, line: &str, node: &NodeId) {
        // Slurm's own lines only, not what the agent itself prints.
        if !(line.starts_with("srun:") || line.starts_with("slurmstepd")) {
            return;
        }
        if line.contains("Out Of Memory") || line.contains("oom-kill event") {
            self.out_of_memory = true;
        }
        if let Some(rest) = line.split("exceeded memory limit (").nth(1) {
            // `846901248 > 209715200), being killed`
            self.over_limit = rest
                .split(['>', ')'])
                .nth(1)
                .and_then(|limit| limit.trim().parse().ok());
        }
        // `slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-… DUE TO TIME LIMIT ***`
        if line.contains("***") && line.contains(" CANCELLED AT ") {
            let cause = if line.contains("DUE TO TIME LIMIT") {
                DeathCause::TimeLimit
            } else if line.contains("DUE TO PREEMPTION") || line.contains("DUE TO JOB REQUEUE") {
                DeathCause::Preempted
            } else if line.contains("DUE TO NODE FAILURE") {
                DeathCause::NodeLost { node: node.clone() }
            } else {
                DeathCause::Cancelled
            };
            self.ended = Some(cause);
        }
        if line.contains("Node failure on") || line.contains("NODE_FAIL") {
            self.ended = Some(DeathCause::NodeLost { node: node.clone() });
        }
    }
}

/// The death a job's final state means, for a step that ended without Slurm saying why.
pub(crate) fn job_state_cause(state: &str, node: &NodeId) -> Option<DeathCause> {
    Some(match state {
        "CANCELLED" => DeathCause::Cancelled,
        "TIMEOUT" | "DEADLINE" => DeathCause::TimeLimit,
        "PREEMPTED" => DeathCause::Preempted,
        "NODE_FAIL" => DeathCause::NodeLost { node: node.clone() },
        _ => return None,
    })
}

/// An agent running as a job step, through its `srun`.
pub(crate) struct StepAgent {
    pub(crate) srun: Child,
    /// A hold on `srun`, taken while it was this driver's unreaped child: a signal sent
    /// through it reaches `srun` or nobody.
    pub(crate) handle: Option<Arc<ProcessHandle>>,
    /// When `srun` was started: the step is cancelled no sooner than [`STEP_SETTLE`] after.
    pub(crate) started: Instant,
    /// The job, and the step's name (unique in it), to cancel it by.
    pub(crate) job: String,
    pub(crate) step_name: String,
    pub(crate) node: NodeId,
    pub(crate) program: PathBuf,
    /// The step's memory limit, in bytes, when it has one of its own.
    pub(crate) memory_limit: Option<u64>,
    pub(crate) end: Arc<Mutex<StepEnd>>,
    pub(crate) stderr: Option<JoinHandle<()>>,
    pub(crate) exited: Option<AgentExit>,
}

impl StepAgent {
    /// Reads `srun`'s stderr in the background: Slurm's lines are noted, and passed on to
    /// the driver's stderr as they are (they are what a Slurm user looks for).
    pub(crate) fn watch_stderr(&mut self) {
        let Some(stderr) = self.srun.stderr.take() else {
            return;
        };
        let end = Arc::clone(&self.end);
        let node = self.node.clone();
        self.stderr = Some(tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                end.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .note(&line, &node);
                eprintln!("{line}");
            }
        }));
    }

    /// How long a cancel waits for the step to be [`STEP_SETTLE`] old.
    fn settle(&self) -> Duration {
        STEP_SETTLE.saturating_sub(self.started.elapsed())
    }

    fn end(&self) -> StepEnd {
        self.end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Cancels the step (SIGKILL, by its name: `srun` does not tell its id), in the
    /// background; the hub's signals do not wait. `srun` is left to see the step end: one
    /// killed first leaves Slurm waiting for it, and the step's CPUs taken, for seconds. It
    /// is killed only if it is still there [`SRUN_KILL_AFTER`] later.
    fn cancel(&self) {
        let (job, name) = (self.job.clone(), self.step_name.clone());
        let srun = self.handle.clone();
        let settle = self.settle();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(settle).await;
                cancel_step(&job, &name, None).await;
                tokio::time::sleep(SRUN_KILL_AFTER).await;
                if let Some(srun) = srun {
                    srun.signal(Signal::SIGKILL);
                }
            });
        }
    }
}

/// `scancel [--signal S] JOB.STEP` for the step of `job` named `name`; a SIGKILL (or no
/// signal) is Slurm's own cancel, `scancel JOB.STEP`.
///
/// Never `--signal=KILL`: that is `REQUEST_TERMINATE_TASKS` sent to the node's `slurmd`
/// directly, whose handler in Slurm 22.05's `slurmstepd` arms the step's terminate monitor a
/// second time when it arrives while the step is ending by itself (its task just killed by
/// the SIGTERM before, say). The step then waits `UnkillableStepTimeout` (180 s on the test
/// cluster) for a thread nobody wakes, and drains its node ("Kill task failed"). Seen here:
/// `slurmstepd` joining one monitor thread while two wait. A plain `scancel` goes through the
/// controller as a signal (`REQUEST_SIGNAL_TASKS`), which arms nothing.
pub(crate) async fn cancel_step(job: &str, name: &str, signal: Option<Signal>) {
    let steps = match slurm::output("squeue", &["-h", "-s", "-j", job, "-o", "%i %j"]).await {
        Ok(steps) => steps,
        Err(error) => {
            tracing::debug!(%error, job, "cannot list the job's steps");
            return;
        }
    };
    let Some(step) = steps.lines().find_map(|line| {
        let (id, step_name) = line.trim().split_once(' ')?;
        (step_name.trim() == name).then(|| id.to_owned())
    }) else {
        return;
    };
    let signal = signal
        .filter(|signal| *signal != Signal::SIGKILL)
        .map(|s| format!("--signal={}", s.as_str().trim_start_matches("SIG")));
    let mut args: Vec<&str> = signal.iter().map(String::as_str).collect();
    args.push(&step);
    if let Err(error) = slurm::output("scancel", &args).await {
        tracing::debug!(%error, %step, "cannot cancel the step");
    }
}

#[async_trait]
impl AgentProcess for StepAgent {
    fn pid(&self) -> Option<u32> {
        self.srun.id()
    }

    fn program(&self) -> Option<&Path> {
        Some(&self.program)
    }

    /// Waits for `srun` to exit, reads what Slurm said, and tells a step that Slurm ended
    /// (cancelled, out of time, preempted, its node lost) as that death.
    async fn wait(&mut self) -> io::Result<AgentExit> {
        if let Some(exit) = &self.exited {
            return Ok(exit.clone());
        }
        // Both awaits keep what they need in `self`: a wait dropped half-way resumes.
        let status = self.srun.wait().await?;
        if let Some(reader) = self.stderr.as_mut() {
            let _ = tokio::time::timeout(STDERR_DRAIN, reader).await;
            self.stderr = None;
        }
        let mut exit = AgentExit::from(status);
        let end = self.end();
        if let Some(cause) = end.ended {
            exit = AgentExit::Died(cause);
        } else if !status.success() && end.over_limit.is_none() && !end.out_of_memory {
            // A job that ended under the step says why in its state.
            if let Ok(Some(job)) = slurm::job(&self.job).await {
                if let Some(cause) = job_state_cause(&job.state, &self.node) {
                    exit = AgentExit::Died(cause);
                }
            }
        }
        self.exited = Some(exit.clone());
        Ok(exit)
    }

    /// SIGTERM to the step's task (the agent), through Slurm: it stops its task within its
    /// grace and exits, and the step ends.
    fn terminate(&mut self) {
        let (job, name) = (self.job.clone(), self.step_name.clone());
        let settle = self.settle();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(settle).await;
                cancel_step(&job, &name, Some(Signal::SIGTERM)).await;
            });
        }
    }

    /// `srun` exits once Slurm has told it its step ended: a few seconds after a
    /// cancellation ("waiting up to 7 seconds for job step to finish").
    fn exit_wait(&self) -> Duration {
        SRUN_EXIT_WAIT
    }

    /// SIGKILL to the step's tasks through Slurm, which then ends the step and every process
    /// in it; `srun` goes too.
    fn kill(&mut self, _task: Option<trainyard_hub::TaskProcess>) {
        self.cancel();
    }

    async fn memory_kill(&mut self) -> Option<u64> {
        let end = self.end();
        end.over_limit
            .or_else(|| end.out_of_memory.then_some(self.memory_limit).flatten())
    }
}

impl Drop for StepAgent {
    fn drop(&mut self) {
        if self.exited.is_none() {
            self.cancel();
        }
    }
}

/// `srun` for one agent, with its stdin, stderr piped.
pub(crate) fn srun(program: &Path, args: &[String], flags: &[String]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("srun");
    command
        .args(flags)
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        // Not in the terminal's process group: a Ctrl-C is the driver's to handle (srun
        // would take a first one as a request for its status).
        .process_group(0)
        .kill_on_drop(true);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurms_lines_say_how_a_step_ended() {
        let node = NodeId::from("n2");
        let cases: [(&str, StepEnd); 7] = [
            (
                "srun: error: n2: task 0: Out Of Memory",
                StepEnd {
                    out_of_memory: true,
                    ..StepEnd::default()
                },
            ),
            (
                "slurmstepd-n2: error: StepId=8.0 exceeded memory limit (846901248 > 209715200), being killed",
                StepEnd {
                    over_limit: Some(209_715_200),
                    ..StepEnd::default()
                },
            ),
            (
                "slurmstepd-n2: error: *** STEP 1.2 ON n2 CANCELLED AT 2026-12-02T02:12:27 ***",
                StepEnd {
                    ended: Some(DeathCause::Cancelled),
                    ..StepEnd::default()
                },
            ),
            (
                "slurmstepd: error: *** STEP 4.0 ON n2 CANCELLED AT 2026-12-02T02:12:27 DUE TO TIME LIMIT ***",
                StepEnd {
                    ended: Some(DeathCause::TimeLimit),
                    ..StepEnd::default()
                },
            ),
            (
                "slurmstepd: error: *** JOB 4 ON n2 CANCELLED AT 2026-12-02T02:12:27 DUE TO PREEMPTION ***",
                StepEnd {
                    ended: Some(DeathCause::Preempted),
                    ..StepEnd::default()
                },
            ),
            (
                "trainyard agent: my task printed Out Of Memory, and *** STEP 4.0 ON n2 CANCELLED AT 1 ***",
                StepEnd::default(),
            ),
            (
                "slurmstepd: error: *** STEP 4.0 ON n2 CANCELLED AT 2026-12-02T02:12:27 DUE TO NODE FAILURE ***",
                StepEnd {
                    ended: Some(DeathCause::NodeLost { node: node.clone() }),
                    ..StepEnd::default()
                },
            ),
        ];
        for (line, want) in cases {
            let mut end = StepEnd::default();
            end.note(line, &node);
            assert_eq!(end, want, "{line}");
        }
    }

    #[test]
    fn a_jobs_final_state_names_the_death() {
        let node = NodeId::from("n1");
        assert_eq!(
            job_state_cause("CANCELLED", &node),
            Some(DeathCause::Cancelled)
        );
        assert_eq!(
            job_state_cause("TIMEOUT", &node),
            Some(DeathCause::TimeLimit)
        );
        assert_eq!(
            job_state_cause("PREEMPTED", &node),
            Some(DeathCause::Preempted)
        );
        assert_eq!(
            job_state_cause("NODE_FAIL", &node),
            Some(DeathCause::NodeLost { node: node.clone() })
        );
        assert_eq!(job_state_cause("RUNNING", &node), None);
        assert_eq!(job_state_cause("COMPLETED", &node), None);
    }
}
