//! Allocations: reading one (its nodes and what it holds on each), and requesting one of the
//! runtime's own with `salloc`, which is released however the driver ends.
//!
//! # Release, the driver SIGKILLed included
//!
//! Everything hangs on one pipe from the driver, whose writing end nothing else holds
//! (descriptors are close-on-exec): when the driver ends in any way — returns, panics, is
//! SIGKILLed — its readers see EOF.
//!
//! - Once granted, `salloc` runs a holder command for as long as the allocation should live:
//!   `sh -c '…; cat >/dev/null'`, reading the pipe. At EOF the holder exits, and `salloc`
//!   relinquishes the allocation as it does when its command ends; ending the job ends every
//!   job step in it, so every worker.
//! - While it is pending there is no holder yet: `salloc` runs under a small guard (`sh`)
//!   that reads the same pipe and, at EOF, cancels the run's *pending* job by name
//!   (`scancel --state=PENDING --name=… --me`); `salloc` then says the job was cancelled and
//!   exits.
//! - Nothing signals `salloc` or cancels its job while its command runs: a `salloc` whose
//!   job is revoked just as its command exits can spin on `wait4` (`ECHILD`) forever (seen
//!   with Slurm 22.05). Should it not exit within 10 s of the pipe's end all the same, the
//!   guard SIGKILLs it; the driver's own release (`OwnAllocation::release`) then cancels
//!   the job and ends the guard's process group too.

use std::fmt;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;
use trainyard_runtime::reservations::NodeSpec;

use crate::error::SlurmError;
use crate::slurm::{self, JobInfo, SlurmNode, node_resources, parse_nodes};

/// What `salloc` runs while the allocation lives: it says what was granted (the line
/// [`Granted::parse`] reads), then waits until the driver's pipe ends.
const HOLDER: &str = "printf 'trainyard-allocation %s %s %s %s\\n' \"$SLURM_JOB_ID\" \
     \"$SLURM_JOB_NODELIST\" \"$SLURM_JOB_CPUS_PER_NODE\" \"${SLURM_MEM_PER_NODE:-0}\"; \
     exec cat >/dev/null";
/// Runs `salloc "$@"` with the pipe on fd 0 as its stdin (for the holder). Once that pipe
/// ends it cancels the job named `$TRAINYARD_SALLOC_NAME` if it is still pending, and
/// SIGKILLs a `salloc` still there 10 s later; at `salloc`'s exit it ends the rest of its
/// process group (that watcher) and exits as `salloc` did.
const GUARD: &str = "exec 3<&0
salloc \"$@\" <&3 &
s=$!
(while IFS= read -r _; do :; done <&3
 scancel --state=PENDING --name=\"$TRAINYARD_SALLOC_NAME\" --me 2>/dev/null
 sleep 10
 kill -KILL \"$s\" 2>/dev/null) &
wait \"$s\"
status=$?
trap '' TERM
kill -TERM 0 2>/dev/null
exit \"$status\"";
/// The variable that names the job to the guard.
const GUARD_NAME_VAR: &str = "TRAINYARD_SALLOC_NAME";
/// How long a released `salloc` gets to exit (its guard SIGKILLs it after 10 s).
const RELEASE_GRACE: Duration = Duration::from_secs(12);

/// An allocation that Slurm is still to grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// Its job id, once Slurm has given one.
    pub job: Option<String>,
    /// Slurm's pending reason (`Resources`, `Priority`, …), once known.
    pub reason: Option<String>,
}

impl fmt::Display for Queued {
    /// `Slurm job 12 is pending (Priority)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.job {
            Some(job) => write!(f, "Slurm job {job} is pending")?,
            None => f.write_str("the Slurm allocation is being submitted")?,
        }
        match &self.reason {
            Some(reason) => write!(f, " ({reason})"),
            None => Ok(()),
        }
    }
}

/// Where `salloc` is in granting the allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Grant {
    /// Submitted; `Some` job id once Slurm said it.
    Waiting(Option<String>),
    /// Granted, as the holder said.
    Granted(Granted),
    /// Refused or ended before it was granted: what Slurm said.
    Refused(String),
}

/// What the holder says once the allocation is granted, from the variables `salloc` gives
/// it: the job, its nodes, and the CPUs and memory it holds on each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Granted {
    pub(crate) job: String,
    /// The host list (`n[1-4]`).
    pub(crate) node_list: String,
    /// CPUs on each node, in the host list's order (`SLURM_JOB_CPUS_PER_NODE`: `2(x3),1`).
    pub(crate) cpus: Vec<u64>,
    /// Memory on each node, in MiB; 0 when the allocation was asked without `--mem`.
    pub(crate) memory_mb: u64,
}

impl Granted {
    /// `trainyard-allocation JOB NODELIST CPUS_PER_NODE MEM_PER_NODE`.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        if words.next()? != "trainyard-allocation" {
            return None;
        }
        let job = words.next()?.to_owned();
        let node_list = words.next()?.to_owned();
        let mut cpus = Vec::new();
        for group in words.next()?.split(',') {
            let (count, times) = match group.split_once("(x") {
                Some((count, times)) => (count, times.trim_end_matches(')').parse().ok()?),
                None => (group, 1),
            };
            let count: u64 = count.parse().ok()?;
            cpus.extend(std::iter::repeat_n(count, times));
        }
        let memory_mb = words.next()?.parse().ok()?;
        Some(Self {
            job,
            node_list,
            cpus,
            memory_mb,
        })
    }

    /// The nodes as the book holds them, with addresses from `table`; `None` when the
    /// counts do not match the host list, or memory is unknown: Slurm is asked then.
    pub(crate) fn nodes(&self, table: &[SlurmNode]) -> Option<Vec<NodeSpec>> {
        let names = slurm::expand_hostlist(&self.node_list)?;
        if names.len() != self.cpus.len() || self.memory_mb == 0 {
            return None;
        }
        names
            .iter()
            .zip(&self.cpus)
            .map(|(name, cpus)| {
                let node = table.iter().find(|node| node.name == *name)?;
                let mut spec = NodeSpec::new(name, node_resources(*cpus, self.memory_mb, 0));
                spec.ip.clone_from(&node.addr);
                spec.hostname.clone_from(&node.hostname);
                Some(spec)
            })
            .collect()
    }
}

/// What `salloc`'s stderr says, line by line (its grant is the holder's line on stdout).
pub(crate) fn grant_line(line: &str) -> Option<Grant> {
    let rest = line.trim().strip_prefix("salloc: ")?;
    let job_id = |text: &str| {
        text.split_whitespace()
            .find_map(|word| word.trim_end_matches('.').parse::<u64>().ok())
            .map(|id| id.to_string())
    };
    if let Some(text) = rest.strip_prefix("Pending job allocation") {
        return Some(Grant::Waiting(job_id(text)));
    }
    if let Some(text) = rest.strip_prefix("error: ") {
        return Some(Grant::Refused(text.trim().to_owned()));
    }
    None
}

/// An allocation this runtime requested with `salloc`; see the [module docs](self).
pub(crate) struct OwnAllocation {
    salloc: Child,
    /// The holder's stdin: closing it ends the allocation.
    holder: Option<ChildStdin>,
    grant: watch::Receiver<Grant>,
    job: Option<String>,
}

impl OwnAllocation {
    /// Submits `salloc` with `flags` under the job name `name`; it waits in Slurm's queue
    /// until granted ([`OwnAllocation::granted`]).
    ///
    /// # Errors
    /// [`SlurmError::Missing`] without `salloc`, or when it cannot be started.
    pub(crate) fn submit(name: &str, flags: &[String]) -> Result<Self, SlurmError> {
        let mut command = Command::new("sh");
        command
            .args(["-c", GUARD, "trainyard-salloc"])
            .arg(format!("--job-name={name}"))
            .args(flags)
            .args(["sh", "-c", HOLDER])
            .env(GUARD_NAME_VAR, name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Not in the terminal's process group: Ctrl-C is the driver's to handle. Not
            // killed when dropped either: closing the pipe ends it, and what it holds.
            .process_group(0);
        tracing::debug!(?command, "requesting a Slurm allocation");
        let mut salloc = command.spawn().map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => SlurmError::Missing {
                program: "salloc".to_owned(),
            },
            _ => SlurmError::Command {
                command: "salloc".to_owned(),
                message: error.to_string(),
            },
        })?;
        let holder = salloc.stdin.take();
        let (tx, grant) = watch::channel(Grant::Waiting(None));
        if let Some(stdout) = salloc.stdout.take() {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(granted) = Granted::parse(&line) {
                        tx.send_replace(Grant::Granted(granted));
                    }
                }
            });
        }
        if let Some(stderr) = salloc.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                let mut refused: Vec<String> = Vec::new();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(%line, "salloc");
                    match grant_line(&line) {
                        Some(Grant::Refused(text)) => refused.push(text),
                        // The job id, unless the holder has said more already.
                        Some(Grant::Waiting(Some(job))) => {
                            tx.send_if_modified(|grant| match grant {
                                Grant::Waiting(_) => {
                                    *grant = Grant::Waiting(Some(job));
                                    true
                                }
                                _ => false,
                            });
                        }
                        _ => {}
                    }
                }
                // salloc is gone: unless granted, that is its answer.
                tx.send_if_modified(|grant| match grant {
                    Grant::Waiting(_) => {
                        *grant = Grant::Refused(if refused.is_empty() {
                            "salloc exited before the allocation was granted".to_owned()
                        } else {
                            refused.join("; ")
                        });
                        true
                    }
                    _ => false,
                });
            });
        }
        Ok(Self {
            salloc,
            holder,
            grant,
            job: None,
        })
    }

    /// The job id, once Slurm has given one.
    pub(crate) fn job(&self) -> Option<String> {
        match &*self.grant.borrow() {
            Grant::Waiting(job) => job.clone(),
            Grant::Granted(granted) => Some(granted.job.clone()),
            Grant::Refused(_) => self.job.clone(),
        }
    }

    /// Waits until Slurm grants the allocation, refuses it (`Err` with what it said), or
    /// `limit` passes (`Ok(None)`); `queued` is told the job id and Slurm's pending reason
    /// meanwhile.
    pub(crate) async fn granted(
        &mut self,
        limit: Duration,
        queued: &watch::Sender<Option<Queued>>,
    ) -> Result<Option<Granted>, String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let state = self.grant.borrow_and_update().clone();
            match state {
                Grant::Granted(granted) => {
                    self.job = Some(granted.job.clone());
                    queued.send_replace(None);
                    return Ok(Some(granted));
                }
                Grant::Refused(reason) => {
                    queued.send_replace(None);
                    return Err(reason);
                }
                Grant::Waiting(job) => {
                    let reason = match &job {
                        Some(job) => pending_reason(job).await,
                        None => None,
                    };
                    if job.is_some() {
                        self.job.clone_from(&job);
                    }
                    queued.send_replace(Some(Queued { job, reason }));
                }
            }
            let step = tokio::time::Instant::now() + Duration::from_secs(1);
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            let _ = tokio::time::timeout_at(step.min(deadline), self.grant.changed()).await;
        }
    }

    /// Ends the allocation: closes the pipe (the holder exits and `salloc` relinquishes the
    /// allocation, or the guard withdraws a pending request) and reaps the guard; after
    /// [`RELEASE_GRACE`] cancels the job and kills what is left of the guard's group.
    pub(crate) async fn release(&mut self) {
        self.holder = None;
        if tokio::time::timeout(RELEASE_GRACE, self.salloc.wait())
            .await
            .is_ok()
        {
            return;
        }
        if let Some(job) = self.job() {
            if let Err(error) = slurm::output("scancel", &[&job]).await {
                tracing::warn!(%error, %job, "cannot cancel the allocation");
            }
        }
        // The guard leads its process group, salloc and the holder with it.
        if let Some(pid) = self.salloc.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.salloc.wait().await;
    }
}

/// Slurm's reason for keeping `job` pending (`Resources`, `Priority`, …).
async fn pending_reason(job: &str) -> Option<String> {
    let text = slurm::output("squeue", &["-h", "-j", job, "-o", "%r"])
        .await
        .ok()?;
    slurm::last_line(&text).filter(|reason| reason != "None")
}

/// The nodes of running job `job`, each with what the job holds on it: the nodes a placement
/// group is laid over. Node ids are Slurm's node names.
///
/// # Errors
/// [`SlurmError::NotRunning`] when the job is not running; Slurm's commands failing.
pub(crate) async fn nodes_of(job: &str, known: &[SlurmNode]) -> Result<Vec<NodeSpec>, SlurmError> {
    let info: JobInfo = slurm::job(job)
        .await?
        .ok_or_else(|| SlurmError::NotRunning {
            job: job.to_owned(),
            state: "unknown to Slurm".to_owned(),
        })?;
    if info.state != "RUNNING" {
        return Err(SlurmError::NotRunning {
            job: job.to_owned(),
            state: info.state,
        });
    }
    let mut holdings = Vec::new();
    for holding in &info.holdings {
        holdings.push((holding, slurm::hostnames(&holding.nodes).await?));
    }
    // Addresses and host names from the node table the caller has, else from Slurm.
    let all_known = holdings
        .iter()
        .flat_map(|(_, names)| names)
        .all(|name| known.iter().any(|node| node.name == *name));
    let fetched;
    let table = if all_known {
        known
    } else {
        fetched = parse_nodes(
            &slurm::output("scontrol", &["-o", "show", "node", &info.node_list]).await?,
        );
        &fetched[..]
    };
    let mut nodes = Vec::new();
    for (holding, names) in holdings {
        for name in names {
            let known = table.iter().find(|node| node.name == name);
            let mut spec = NodeSpec::new(
                &name,
                node_resources(holding.cpus, holding.memory_mb, holding.gpus.len() as u64),
            );
            if let Some(node) = known {
                spec.ip.clone_from(&node.addr);
                spec.hostname.clone_from(&node.hostname);
            }
            if !holding.gpus.is_empty() {
                spec.devices
                    .insert(trainyard_resources::GPU.to_owned(), holding.gpus.clone());
            }
            nodes.push(spec);
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sallocs_lines_say_where_the_grant_is() {
        assert_eq!(grant_line("salloc: Granted job allocation 12"), None);
        assert_eq!(
            grant_line("salloc: Pending job allocation 13"),
            Some(Grant::Waiting(Some("13".into())))
        );
        assert_eq!(
            grant_line(
                "salloc: error: Unable to allocate resources: Requested node configuration is not available"
            ),
            Some(Grant::Refused(
                "Unable to allocate resources: Requested node configuration is not available"
                    .into()
            ))
        );
        assert_eq!(
            grant_line("salloc: job 13 queued and waiting for resources"),
            None
        );
        assert_eq!(grant_line("something else"), None);
    }

    #[test]
    fn the_holders_line_says_what_was_granted_on_each_node() {
        let granted =
            Granted::parse("trainyard-allocation 92 n[1-3],n7 2(x3),1 300").expect("a grant");
        assert_eq!(granted.job, "92");
        assert_eq!(granted.node_list, "n[1-3],n7");
        assert_eq!(granted.cpus, [2, 2, 2, 1]);
        assert_eq!(granted.memory_mb, 300);
        let table: Vec<SlurmNode> = crate::slurm::parse_nodes(
            "NodeName=n1 NodeAddr=10.0.0.1 NodeHostName=a\nNodeName=n2 NodeAddr=10.0.0.2 NodeHostName=b\nNodeName=n3 NodeAddr=10.0.0.3 NodeHostName=c\nNodeName=n7 NodeAddr=10.0.0.7 NodeHostName=g\n",
        );
        let nodes = granted.nodes(&table).expect("all known");
        assert_eq!(nodes.len(), 4);
        assert_eq!(
            (nodes[3].id.as_str(), nodes[3].ip.as_str()),
            ("n7", "10.0.0.7")
        );
        assert_eq!(
            nodes[3].resources,
            "CPU=1,memory=300MiB".parse().expect("spec")
        );
        assert!(
            granted.nodes(&table[..2]).is_none(),
            "an unknown node: Slurm is asked"
        );
        let unknown_memory = Granted::parse("trainyard-allocation 9 n1 1 0").expect("a grant");
        assert!(unknown_memory.nodes(&table).is_none());
        assert_eq!(Granted::parse("trainyard-allocation 9 n1 x 0"), None);
        assert_eq!(Granted::parse("something else"), None);
    }

    #[test]
    fn a_queued_allocation_reads_as_a_progress_line() {
        let queued = Queued {
            job: Some("12".into()),
            reason: Some("Priority".into()),
        };
        assert_eq!(queued.to_string(), "Slurm job 12 is pending (Priority)");
        let submitting = Queued {
            job: None,
            reason: None,
        };
        assert_eq!(
            submitting.to_string(),
            "the Slurm allocation is being submitted"
        );
    }
}
