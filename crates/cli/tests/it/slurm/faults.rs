//! Faults across hosts, on the Slurm test cluster whose nodes have network namespaces of
//! their own (`scripts/netns-env.sh`): a node's link going down mid-run, the driver's host cut
//! off from every node, and a node lost for good. Each test says how long the fault took to
//! be seen and the run to train again (printed as `fault:` lines), and asserts that no
//! committed checkpoint was lost and no process was left.
//!
//! The deadlines: the driver declares an agent it has not heard from for the heartbeat
//! timeout (10 s) lost; an agent that has not heard from its driver for its bound (10 s)
//! stops its task and exits; a worker whose agent does not call back within the start
//! timeout (60 s) is given up, and its host with it; a worker replacing a lost one first asks
//! its node's `slurmd` (3 s), and a node whose `slurmd` does not answer is left out.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use trainyard_runtime_slurm::testing::{cluster, setup_script, wait_for_no_jobs};
use trainyard_test_support::hosts::{self, Cut, LAYOUT, gone_by, last_committed, seconds};
use trainyard_test_support::processes::{Sandbox, left_behind, torch_python};
use trainyard_test_support::running::Running;

use super::{name, nothing_left, slurm_run};

/// How long after a host is cut off its agent must have stopped its task: its bound for a
/// silent driver, and a little more.
const AGENT_STOPS_WITHIN: Duration = Duration::from_secs(15);
/// How long after a host is cut off the driver must have declared its workers lost: the
/// heartbeat timeout, and a little more.
const DETECTED_WITHIN: Duration = Duration::from_secs(15);

/// The link on this machine's side of each Slurm node's namespace (`tyv-n1` …), once the
/// nodes have namespaces of their own. `None` after printing `SKIP:` and why; under
/// `CI=true` without `TRAINYARD_NETNS_SKIP` saying why, a single-stack cluster panics.
fn node_links() -> Option<Vec<(String, String)>> {
    let links: Vec<(String, String)> = hosts::layout()
        .into_iter()
        .filter(|host| host.name.starts_with('n'))
        .map(|host| (host.name, host.link))
        .collect();
    let in_namespaces = ["n1", "n2", "n3", "n4"]
        .iter()
        .all(|node| links.iter().any(|(name, _)| name == node))
        && Path::new("/run/netns/ty-n1").exists();
    if in_namespaces {
        return Some(links);
    }
    if let Ok(why) = std::env::var("TRAINYARD_NETNS_SKIP") {
        eprintln!("SKIP: the Slurm nodes share this machine's network: {why}");
        return None;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "the Slurm nodes have no network namespaces of their own under CI=true ({LAYOUT}); \
         TRAINYARD_NETNS_SKIP must say why"
    );
    eprintln!("SKIP: the Slurm nodes share this machine's network ({LAYOUT} lists no n1-n4)");
    None
}

/// Takes the links of `nodes` down, until the guard is dropped.
fn cut(links: &[(String, String)], nodes: &[&str]) -> Cut {
    Cut::new(
        nodes
            .iter()
            .map(|node| {
                links
                    .iter()
                    .find(|(name, _)| name == node)
                    .map(|(_, link)| link.clone())
                    .unwrap_or_else(|| panic!("no link for node {node}"))
            })
            .collect(),
    )
}

/// Brings the test cluster's lost nodes back when dropped (their slurmd started again).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(setup_script())
            .arg("up")
            .stdout(std::process::Stdio::null())
            .status();
    }
}

fn record(sandbox: &Sandbox, run: &str) -> serde_json::Value {
    hosts::record(&sandbox.storage().join(run))
}

/// Where rank `rank` of attempt `attempt` runs: its node, task pid and agent pid.
fn rank_of(record: &serde_json::Value, attempt: usize, rank: usize) -> (String, u32, u32) {
    let rank = hosts::rank_of(record, attempt, rank);
    (rank.node, rank.task, rank.agent)
}

/// When the driver booked attempt `attempt` of `run` as failed, within `limit`.
fn failed_by(sandbox: &Sandbox, run: &str, attempt: usize, limit: Duration) -> Option<Instant> {
    hosts::failed_by(&sandbox.storage().join(run), attempt, limit)
}

/// Those of `pids` that run on a Slurm node's host (in a `ty-n*` network namespace), not on
/// the driver's.
fn on_the_nodes(pids: &[u32]) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let namespace = |path: String| std::fs::metadata(path).ok().map(|meta| meta.ino());
    let nodes: Vec<u64> = (1..=4)
        .filter_map(|k| namespace(format!("/run/netns/ty-n{k}")))
        .collect();
    pids.iter()
        .copied()
        .filter(|pid| {
            namespace(format!("/proc/{pid}/ns/net")).is_some_and(|ns| nodes.contains(&ns))
        })
        .collect()
}

/// A two-rank checkpointing torch run spread over two nodes, for `epochs` epochs of half a
/// second.
fn checkpointing(sandbox: &Sandbox, run: &str, python: &Path, failures: &str) -> Command {
    let mut command = slurm_run(
        sandbox,
        run,
        &[
            "-n",
            "2",
            "-s",
            "SPREAD",
            "-r",
            "CPU=1,memory=1GiB",
            "--max-failures",
            failures,
            "--env",
            "EPOCHS=24",
            "--env",
            "EPOCH_SECONDS=0.5",
            "--",
        ],
    );
    command.arg(python).arg("examples/torch_checkpoint.py");
    command
}

/// What a fault test needs before its fault: the cluster held, torch, the nodes' links.
struct Scene {
    _cluster: trainyard_runtime_slurm::testing::Cluster,
    python: std::path::PathBuf,
    links: Vec<(String, String)>,
}

impl Scene {
    /// `None` (after saying why) where the test cannot run.
    fn new() -> Option<Self> {
        let cluster = cluster()?;
        let python = torch_python()?;
        let links = node_links()?;
        Some(Self {
            _cluster: cluster,
            python,
            links,
        })
    }

    /// Starts the checkpointing run `run` allowing `failures`, and waits until it trains (5
    /// epochs in): the run, and its record then.
    fn train(&self, sandbox: &Sandbox, run: &str, failures: &str) -> (Running, serde_json::Value) {
        let mut running = Running::start(&mut checkpointing(sandbox, run, &self.python, failures));
        running.expect_line("rank 1: epoch 5 start", Duration::from_secs(180));
        (running, record(sandbox, run))
    }
}

/// When rank 1 says it resumed (within `limit`), from a checkpoint no older than
/// `committed`.
fn resumed(running: &mut Running, limit: Duration, committed: u64) -> Instant {
    hosts::resumed_from_at_least(running, "rank 1: resumed from ", limit, committed)
}

#[test]
fn a_node_cut_off_mid_run_stops_its_task_and_the_run_resumes_on_nodes_that_answer() {
    let Some(scene) = Scene::new() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-cut");
    let run = name("cut");
    let (mut running, before) = scene.train(&sandbox, &run, "1");
    let committed = last_committed(&before);
    let (node, task, agent) = rank_of(&before, 0, 1);

    let cut = cut(&scene.links, &[node.as_str()]);
    let at = Instant::now();
    // While the link is still down: the agent stops its task and exits by itself, and the
    // driver declares the worker lost.
    let stopped = gone_by(&[task, agent], AGENT_STOPS_WITHIN).unwrap_or_else(|| {
        panic!("rank 1's task ({task}) or agent ({agent}) on the cut-off {node} still runs")
    });
    let detected = failed_by(&sandbox, &run, 0, DETECTED_WITHIN)
        .unwrap_or_else(|| panic!("the driver did not declare {node}'s worker lost in time"));
    let again = resumed(&mut running, Duration::from_secs(90), committed);
    eprintln!(
        "fault: link down on {node}: detected in {:.1} s, its task stopped in {:.1} s, training again in {:.1} s",
        seconds(at, detected),
        seconds(at, stopped),
        seconds(at, again)
    );
    // The next attempt runs where the driver is heard: not on the node cut off.
    let after = record(&sandbox, &run);
    for rank in 0..2 {
        let (placed, _, _) = rank_of(&after, 1, rank);
        assert_ne!(
            placed, node,
            "rank {rank} went back to the cut-off node: {after}"
        );
    }
    drop(cut);
    let ended = running.finish(Duration::from_secs(180));
    assert!(ended.status.success(), "{}", ended.all());
    assert!(
        ended.stdout.contains("rank 0: done at epoch 24"),
        "{}",
        ended.all()
    );
    // The cut-off node's side of the old job ends once its link is back.
    let jobs = wait_for_no_jobs(&run, Duration::from_secs(90));
    assert!(jobs.is_empty(), "jobs left in squeue: {jobs:?}");
    nothing_left(&sandbox, &run);
}

#[test]
fn a_driver_cut_off_from_every_node_leaves_no_task_and_the_same_command_resumes() {
    let Some(scene) = Scene::new() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-island");
    let run = name("island");
    let (running, before) = scene.train(&sandbox, &run, "0");
    let committed = last_committed(&before);
    let ranks: Vec<(String, u32, u32)> = (0..2).map(|rank| rank_of(&before, 0, rank)).collect();
    let pids: Vec<u32> = ranks
        .iter()
        .flat_map(|(_, task, agent)| [*task, *agent])
        .collect();

    let cut = cut(&scene.links, &["n1", "n2", "n3", "n4"]);
    let at = Instant::now();
    let stopped = gone_by(&pids, AGENT_STOPS_WITHIN)
        .unwrap_or_else(|| panic!("a task or agent of {ranks:?} still runs on a cut-off node"));
    let left = on_the_nodes(&left_behind(sandbox.mark(), Duration::from_secs(1)));
    assert!(
        left.is_empty(),
        "processes of the run left on the nodes: {left:?}"
    );
    // The driver gives the run up (no restart allowed), bounded, and says it can resume.
    let ended = running.finish(Duration::from_secs(120));
    let exited = ended.at;
    assert!(!ended.status.success(), "{}", ended.all());
    assert!(
        ended.stderr.contains("resumes from it"),
        "no word on resuming: {}",
        ended.all()
    );
    eprintln!(
        "fault: driver cut off from every node: every task stopped in {:.1} s, the driver exited in {:.1} s",
        seconds(at, stopped),
        seconds(at, exited)
    );
    drop(cut);
    let jobs = wait_for_no_jobs(&run, Duration::from_secs(90));
    assert!(jobs.is_empty(), "jobs left in squeue: {jobs:?}");

    // The same command, once the network is back, resumes from the last committed checkpoint.
    let mut again = Running::start(&mut checkpointing(&sandbox, &run, &scene.python, "0"));
    resumed(&mut again, Duration::from_secs(180), committed);
    let ended = again.finish(Duration::from_secs(180));
    assert!(ended.status.success(), "{}", ended.all());
    nothing_left(&sandbox, &run);
}

#[test]
fn a_node_lost_for_good_is_left_out_and_the_run_goes_on_from_its_last_checkpoint() {
    let Some(scene) = Scene::new() else {
        return;
    };
    let restore = Restore;
    let sandbox = Sandbox::new("slurm-lost");
    let run = name("lost");
    let (mut running, before) = scene.train(&sandbox, &run, "1");
    let committed = last_committed(&before);
    let (node, _, _) = rank_of(&before, 0, 1);

    // Every process of the node's namespace (its slurmd, its step, the agent, the task) dies.
    let namespace = format!("ty-{node}");
    let at = Instant::now();
    let pids = Command::new("ip")
        .args(["netns", "pids", &namespace])
        .output()
        .expect("ip runs");
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    let detected = failed_by(&sandbox, &run, 0, DETECTED_WITHIN)
        .unwrap_or_else(|| panic!("the driver did not see {node}'s worker die"));
    let again = resumed(&mut running, Duration::from_secs(90), committed);
    eprintln!(
        "fault: node {node} lost for good: detected in {:.1} s, training again in {:.1} s",
        seconds(at, detected),
        seconds(at, again)
    );
    let ended = running.finish(Duration::from_secs(180));
    assert!(ended.status.success(), "{}", ended.all());
    // One failure, the node's: giving up on the worker that could not start there is not
    // another.
    let after = record(&sandbox, &run);
    let attempts = after["attempts"].as_array().map_or(0, Vec::len);
    assert_eq!(attempts, 2, "{after}");
    let (placed, _, _) = rank_of(&after, 1, 1);
    assert_ne!(placed, node, "rank 1 went back to the lost node: {after}");
    // The old allocation completes once the node is back (or Slurm gives it up).
    drop(restore);
    let jobs = wait_for_no_jobs(&run, Duration::from_secs(90));
    assert!(jobs.is_empty(), "jobs left in squeue: {jobs:?}");
    nothing_left(&sandbox, &run);
}
