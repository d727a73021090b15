//! Slurm's own commands (`sinfo`, `scontrol`, `squeue`, `scancel`), each run with a time
//! limit, and what their output says: the node table, partitions, and a job's state and
//! resources.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use trainyard_resources::{CPU, GPU, MEMORY, ResourceAmount, Resources};

use crate::error::SlurmError;

/// How long one of Slurm's commands may take (the controller answers in milliseconds; one
/// that does not answer would otherwise make `scontrol` retry for a minute).
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// One MiB: Slurm counts memory in these (`M`).
pub(crate) const MIB: u64 = 1 << 20;

/// Runs one of Slurm's commands and returns its stdout.
///
/// # Errors
/// [`SlurmError::Missing`] when it is not on `PATH`, [`SlurmError::Command`] when it fails or
/// does not answer within `COMMAND_TIMEOUT`.
pub async fn output(program: &str, args: &[&str]) -> Result<String, SlurmError> {
    output_with_env(program, args, &[]).await
}

/// [`output`], with `env` added to the command's environment (what must not be on its
/// command line).
///
/// # Errors
/// As [`output`].
pub async fn output_with_env(
    program: &str,
    args: &[&str],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Result<String, SlurmError> {
    let command_line = || format!("{program} {}", args.join(" "));
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => SlurmError::Missing {
                program: program.to_owned(),
            },
            _ => SlurmError::Command {
                command: command_line(),
                message: source.to_string(),
            },
        })?;
    let done = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output()).await;
    let out = match done {
        Ok(Ok(out)) => out,
        Ok(Err(error)) => {
            return Err(SlurmError::Command {
                command: command_line(),
                message: error.to_string(),
            });
        }
        Err(_) => {
            return Err(SlurmError::Command {
                command: command_line(),
                message: format!("no answer within {COMMAND_TIMEOUT:?}"),
            });
        }
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(SlurmError::Command {
            command: command_line(),
            message: last_line(&stderr).unwrap_or_else(|| out.status.to_string()),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last line of `text` that says something.
pub(crate) fn last_line(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty())
        .map(str::to_owned)
}

/// The `key=value` words of one record of `scontrol -o show …` or of a block of `scontrol
/// show job`. A value with spaces in it (`OS=Linux 6.1 …`, a reason) keeps its words.
pub(crate) fn fields(record: &str) -> BTreeMap<&str, String> {
    let mut out: BTreeMap<&str, String> = BTreeMap::new();
    let mut last: Option<&str> = None;
    for word in record.split_whitespace() {
        match word.split_once('=') {
            Some((key, value)) if !key.is_empty() && !key.contains(['(', '[']) => {
                out.insert(key, value.to_owned());
                last = Some(key);
            }
            _ => {
                if let Some(value) = last.and_then(|key| out.get_mut(key)) {
                    value.push(' ');
                    value.push_str(word);
                }
            }
        }
    }
    out
}

/// A node of Slurm's node table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmNode {
    /// Its name (`NodeName`), which `-w` takes.
    pub name: String,
    /// The address it is reached at (`NodeAddr`).
    pub addr: String,
    /// Its host name (`NodeHostName`).
    pub hostname: String,
    /// The port its `slurmd` listens on (`Port`), when the table says.
    pub port: Option<u16>,
    /// Its CPUs (`CPUTot`).
    pub cpus: u64,
    /// Its CPUs allocated to jobs now (`CPUAlloc`).
    pub cpus_allocated: u64,
    /// Its memory for jobs, in MiB (`RealMemory`).
    pub memory_mb: u64,
    /// Its memory allocated to jobs now, in MiB (`AllocMem`).
    pub memory_allocated_mb: u64,
    /// Its GPUs (`Gres=gpu:…`).
    pub gpus: u64,
    /// Its state (`IDLE`, `MIXED`, `DOWN+DRAIN`, …).
    pub state: String,
    /// The partitions it belongs to.
    pub partitions: Vec<String>,
}

impl SlurmNode {
    /// Whether it takes jobs: not down, drained, failing or powered off.
    #[must_use]
    pub fn is_usable(&self) -> bool {
        let state = self.state.to_ascii_uppercase();
        ![
            "DOWN",
            "DRAIN",
            "FAIL",
            "POWERED_DOWN",
            "POWER_DOWN",
            "NOT_RESPONDING",
            "FUTURE",
        ]
        .iter()
        .any(|bad| state.contains(bad))
            && !state.ends_with('*')
    }

    /// All it has, as a resource dictionary.
    #[must_use]
    pub fn total(&self) -> Resources {
        node_resources(self.cpus, self.memory_mb, self.gpus)
    }

    /// What jobs leave free on it now.
    #[must_use]
    pub fn available(&self) -> Resources {
        node_resources(
            self.cpus.saturating_sub(self.cpus_allocated),
            self.memory_mb.saturating_sub(self.memory_allocated_mb),
            self.gpus,
        )
    }
}

/// CPUs, MiB and GPUs as a resource dictionary.
pub(crate) fn node_resources(cpus: u64, memory_mb: u64, gpus: u64) -> Resources {
    let mut out = Resources::new();
    for (name, amount) in [
        (CPU, ResourceAmount::from_units(cpus)),
        (
            MEMORY,
            ResourceAmount::from_units(memory_mb.saturating_mul(MIB)),
        ),
        (GPU, ResourceAmount::from_units(gpus)),
    ] {
        if !amount.is_zero() {
            // Known names and whole amounts: always accepted.
            let _ = out.insert(name, amount);
        }
    }
    out
}

/// The nodes of `scontrol -o show nodes` (one line each).
#[must_use]
pub fn parse_nodes(text: &str) -> Vec<SlurmNode> {
    text.lines()
        .filter(|line| line.starts_with("NodeName="))
        .map(|line| {
            let f = fields(line);
            let text = |key: &str| f.get(key).cloned().unwrap_or_default();
            let number = |key: &str| f.get(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let name = text("NodeName");
            SlurmNode {
                addr: f.get("NodeAddr").cloned().unwrap_or_else(|| name.clone()),
                hostname: f
                    .get("NodeHostName")
                    .cloned()
                    .unwrap_or_else(|| name.clone()),
                port: f.get("Port").and_then(|port| port.parse().ok()),
                name,
                cpus: number("CPUTot"),
                cpus_allocated: number("CPUAlloc"),
                memory_mb: number("RealMemory"),
                memory_allocated_mb: number("AllocMem"),
                gpus: gres_gpus(&text("Gres")).0,
                state: text("State"),
                partitions: text("Partitions")
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(str::to_owned)
                    .collect(),
            }
        })
        .collect()
}

/// The partitions of `scontrol -o show partitions`: name and whether it is the default.
#[must_use]
pub fn parse_partitions(text: &str) -> Vec<(String, bool)> {
    text.lines()
        .filter(|line| line.starts_with("PartitionName="))
        .map(|line| {
            let f = fields(line);
            (
                f.get("PartitionName").cloned().unwrap_or_default(),
                f.get("Default").is_some_and(|d| d == "YES"),
            )
        })
        .collect()
}

/// The GPUs a `Gres` value names, and their indices where it says them: `gpu:4`,
/// `gpu:a100:2(S:0-1)`, `gpu:2(IDX:0-1)`, `gpu:a100:1(IDX:3),nic:1`.
#[must_use]
pub fn gres_gpus(gres: &str) -> (u64, Vec<String>) {
    let mut count = 0;
    let mut ids = Vec::new();
    for item in gres.split(',').filter(|item| item.starts_with("gpu")) {
        let (spec, detail) = match item.split_once('(') {
            Some((spec, detail)) => (spec, detail.trim_end_matches(')')),
            None => (item, ""),
        };
        if let Some(n) = spec.rsplit(':').next().and_then(|n| n.parse::<u64>().ok()) {
            count += n;
        }
        if let Some(indices) = detail.strip_prefix("IDX:") {
            ids.extend(expand_ids(indices).into_iter().map(|id| id.to_string()));
        }
    }
    (count, ids)
}

/// The numbers of a Slurm id list: `0-2,5` → 0, 1, 2, 5.
#[must_use]
pub fn expand_ids(list: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((low, high)) => {
                if let (Ok(low), Ok(high)) = (low.parse::<u64>(), high.parse::<u64>()) {
                    out.extend(low..=high.min(low.saturating_add(1 << 16)));
                }
            }
            None => out.extend(part.parse::<u64>().ok()),
        }
    }
    out
}

/// A job as `scontrol -d show job` describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobInfo {
    /// `PENDING`, `RUNNING`, `CANCELLED`, `TIMEOUT`, `PREEMPTED`, `NODE_FAIL`, ….
    pub state: String,
    /// Why it is pending (`Resources`, `Priority`, …), or `None`.
    pub reason: String,
    /// Its nodes, as a host list (`n[1-2]`).
    pub node_list: String,
    /// What it holds on each group of its nodes: their host list, CPUs, memory (MiB) and
    /// GPU indices on each.
    pub holdings: Vec<Holding>,
}

/// What a job holds on each node of a host list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// The nodes (`n[1-2]`).
    pub nodes: String,
    /// CPUs on each.
    pub cpus: u64,
    /// Memory on each, in MiB.
    pub memory_mb: u64,
    /// GPU indices on each.
    pub gpus: Vec<String>,
}

/// The job of `scontrol -d show job ID` (its first record).
#[must_use]
pub fn parse_job(text: &str) -> JobInfo {
    let f = fields(text);
    let mut job = JobInfo {
        state: f.get("JobState").cloned().unwrap_or_default(),
        reason: f.get("Reason").cloned().unwrap_or_default(),
        node_list: f.get("NodeList").cloned().unwrap_or_default(),
        holdings: Vec::new(),
    };
    for line in text.lines().map(str::trim) {
        // The detail lines: `Nodes=n[1-2] CPU_IDs=0-1 Mem=500 GRES=gpu:1(IDX:0)`.
        if !(line.starts_with("Nodes=") && line.contains("CPU_IDs=")) {
            continue;
        }
        let d = fields(line);
        job.holdings.push(Holding {
            nodes: d.get("Nodes").cloned().unwrap_or_default(),
            cpus: expand_ids(d.get("CPU_IDs").map_or("", String::as_str)).len() as u64,
            memory_mb: d.get("Mem").and_then(|m| m.parse().ok()).unwrap_or(0),
            gpus: gres_gpus(d.get("GRES").map_or("", String::as_str)).1,
        });
    }
    job
}

/// The node names of a host list with at most one bracket group per name (`n[1-3],gpu[07-08]`
/// → n1, n2, n3, gpu07, gpu08), zero padding kept; `None` for what this does not read
/// (several groups in one name), which Slurm then expands.
#[must_use]
pub fn expand_hostlist(list: &str) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let mut depth = 0_u32;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    for item in items.into_iter().filter(|item| !item.is_empty()) {
        let Some((prefix, rest)) = item.split_once('[') else {
            names.push(item.to_owned());
            continue;
        };
        let (ranges, suffix) = rest.split_once(']')?;
        if suffix.contains(['[', ']']) {
            return None;
        }
        for range in ranges.split(',') {
            let (low, high) = range.split_once('-').unwrap_or((range, range));
            let width = low.len();
            let (low, high) = (low.parse::<u64>().ok()?, high.parse::<u64>().ok()?);
            if high < low || high - low > 1 << 16 {
                return None;
            }
            names.extend((low..=high).map(|n| format!("{prefix}{n:0width$}{suffix}")));
        }
    }
    Some(names)
}

/// The node names of a host list (`n[1-3],gpu7` → n1, n2, n3, gpu7), as Slurm expands them.
///
/// # Errors
/// When `scontrol` fails.
pub(crate) async fn hostnames(list: &str) -> Result<Vec<String>, SlurmError> {
    if list.is_empty() || list == "(null)" {
        return Ok(Vec::new());
    }
    if let Some(names) = expand_hostlist(list) {
        return Ok(names);
    }
    Ok(output("scontrol", &["show", "hostnames", list])
        .await?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The job `id` as the controller knows it now; `None` once it has forgotten it.
///
/// # Errors
/// When `scontrol` fails for another reason.
pub(crate) async fn job(id: &str) -> Result<Option<JobInfo>, SlurmError> {
    match output("scontrol", &["-d", "show", "job", id]).await {
        Ok(text) => Ok(Some(parse_job(&text))),
        Err(SlurmError::Command { message, .. }) if message.contains("Invalid job id") => Ok(None),
        Err(error) => Err(error),
    }
}

/// The node table, restricted to `partition` (else the default partition), usable nodes only.
///
/// # Errors
/// When Slurm's commands fail, or the partition does not exist.
pub async fn partition_nodes(
    partition: Option<&str>,
) -> Result<(String, Vec<SlurmNode>), SlurmError> {
    let (partitions, nodes) = tokio::join!(
        output("scontrol", &["-o", "show", "partitions"]),
        output("scontrol", &["-o", "show", "nodes"]),
    );
    let (partitions, nodes) = (parse_partitions(&partitions?), parse_nodes(&nodes?));
    let name = match partition {
        Some(name) => {
            if !partitions.iter().any(|(p, _)| p == name) {
                return Err(SlurmError::NoPartition {
                    partition: name.to_owned(),
                    known: partitions.into_iter().map(|(p, _)| p).collect(),
                });
            }
            name.to_owned()
        }
        None => partitions
            .iter()
            .find(|(_, default)| *default)
            .or(partitions.first())
            .map(|(p, _)| p.clone())
            .ok_or(SlurmError::NoPartition {
                partition: "(default)".to_owned(),
                known: Vec::new(),
            })?,
    };
    let nodes = nodes
        .into_iter()
        .filter(|node| node.partitions.contains(&name) && node.is_usable())
        .collect();
    Ok((name, nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=0.91 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:4(S:0) NodeAddr=10.0.0.7 NodeHostName=vm Port=17001 Version=22.05.8 OS=Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4096 AllocMem=500 FreeMem=20031 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=test,gpu  BootTime=2026-12-01T22:58:02";

    #[test]
    fn the_node_table_reads_as_resources() {
        let nodes = parse_nodes(&format!(
            "{NODE}\nNodeName=n2 CPUTot=4 RealMemory=100 State=DOWN+DRAIN Partitions=test\n"
        ));
        assert_eq!(nodes.len(), 2);
        let n1 = &nodes[0];
        assert_eq!(
            (n1.name.as_str(), n1.addr.as_str(), n1.hostname.as_str()),
            ("n1", "10.0.0.7", "vm")
        );
        assert_eq!((n1.cpus, n1.cpus_allocated, n1.gpus), (2, 1, 4));
        assert_eq!((n1.memory_mb, n1.memory_allocated_mb), (4096, 500));
        assert_eq!(n1.partitions, ["test", "gpu"]);
        assert!(n1.is_usable());
        assert_eq!(
            n1.total(),
            "CPU=2,GPU=4,memory=4096MiB".parse().expect("spec")
        );
        assert_eq!(
            n1.available(),
            "CPU=1,GPU=4,memory=3596MiB".parse().expect("spec")
        );
        assert!(!nodes[1].is_usable(), "drained");
        assert_eq!(nodes[1].addr, "n2", "no NodeAddr: its name");
        assert_eq!((n1.port, nodes[1].port), (Some(17001), None));
    }

    #[test]
    fn gres_and_id_lists_are_counted() {
        assert_eq!(gres_gpus("(null)"), (0, vec![]));
        assert_eq!(gres_gpus("gpu:4"), (4, vec![]));
        assert_eq!(
            gres_gpus("gpu:a100:2(IDX:0-1),nic:1"),
            (2, vec!["0".to_owned(), "1".to_owned()])
        );
        assert_eq!(expand_ids("0-2,5"), [0, 1, 2, 5]);
        assert_eq!(expand_ids(""), Vec::<u64>::new());
        assert_eq!(expand_ids("x,3"), [3]);
    }

    #[test]
    fn a_jobs_state_and_holdings_are_read_from_scontrol() {
        let text = "JobId=1 JobName=tytest\n   JobState=PENDING Reason=Priority Dependency=(null)\n   NodeList=n[1-2]\n   BatchHost=n1\n   JOB_GRES=(null)\n     Nodes=n1 CPU_IDs=0-1 Mem=500 GRES=gpu:1(IDX:1)\n     Nodes=n2 CPU_IDs=0 Mem=250 GRES=\n   MinCPUsNode=1\n";
        let job = parse_job(text);
        assert_eq!(job.state, "PENDING");
        assert_eq!(job.reason, "Priority");
        assert_eq!(job.node_list, "n[1-2]");
        assert_eq!(
            job.holdings,
            [
                Holding {
                    nodes: "n1".into(),
                    cpus: 2,
                    memory_mb: 500,
                    gpus: vec!["1".into()]
                },
                Holding {
                    nodes: "n2".into(),
                    cpus: 1,
                    memory_mb: 250,
                    gpus: vec![]
                },
            ]
        );
    }

    #[test]
    fn host_lists_expand_as_slurm_expands_them() {
        let names = |list: &str| expand_hostlist(list).expect("readable");
        assert_eq!(names("n[1-3],gpu7"), ["n1", "n2", "n3", "gpu7"]);
        assert_eq!(
            names("gpu[07-09,11]-ib"),
            ["gpu07-ib", "gpu08-ib", "gpu09-ib", "gpu11-ib"]
        );
        assert_eq!(names("a[1-2],b[3]"), ["a1", "a2", "b3"]);
        assert_eq!(names("vm"), ["vm"]);
        assert!(names("").is_empty());
        assert_eq!(
            expand_hostlist("rack[1-2]-n[1-2]"),
            None,
            "two groups: Slurm's to do"
        );
        assert_eq!(expand_hostlist("n[3-1]"), None);
        assert_eq!(expand_hostlist("n[1-2"), None);
    }

    #[test]
    fn partitions_say_which_is_the_default() {
        let text = "PartitionName=gpu AllowGroups=ALL Default=NO State=UP\nPartitionName=test Default=YES State=UP\n";
        assert_eq!(
            parse_partitions(text),
            [("gpu".to_owned(), false), ("test".to_owned(), true)]
        );
    }
}
