//! `trainyard run --runtime ray` on a real two-node Ray cluster on this machine: ranks over
//! both nodes, PyTorch's all-reduce, a request no node can hold refused in seconds, a worker
//! actor killed mid-run, a driver stopped by SIGTERM or SIGKILL, a node's link cut mid-run, and nothing left in Ray afterwards. The cluster
//! comes from `trainyard_runtime_ray::testing`. The tests need `TRAINYARD_RAY_PYTHON` (an
//! interpreter with `ray` and torch, from `scripts/ray-env.sh`), so they are ignored unless
//! asked for (`cargo nextest run --run-ignored only`), and fail when it is missing.

use trainyard_test_support::processes as common;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{MARKER, left_behind};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use trainyard::ray::{Bridge, GroupState};
use trainyard_runtime_ray::testing::{HEAD_MEMORY, RayCluster};
use trainyard_test_support::hosts::{self, Cut};
use trainyard_test_support::running::Running;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `trainyard run --runtime ray --address <cluster>` with a marker on every worker.
fn run(cluster: &RayCluster, mark: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .current_dir(root())
        .args(["run", "--runtime", "ray", "--address", &cluster.address])
        .args(["--env", &format!("{MARKER}={mark}")])
        .args(args)
        .env("TRAINYARD_RAY_PYTHON", &cluster.driver_python)
        .env("RAY_AUTH_MODE", "disabled")
        .stdin(Stdio::null());
    command
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Nothing of any run is left in Ray's actor and placement-group tables (the cluster is this
/// test's own), nor any process carrying `mark`.
async fn nothing_left(cluster: &RayCluster, mark: &str) {
    let (observer, _) = Bridge::start(cluster.bridge_config().namespace("observer"))
        .await
        .expect("an observer");
    let start = Instant::now();
    loop {
        let view = observer.cluster().await.expect("the GCS view");
        let actors: Vec<String> = view
            .actors
            .iter()
            .filter(|a| a.state != "DEAD")
            .map(|a| format!("{} {}", a.name, a.state))
            .collect();
        let groups: Vec<String> = view
            .groups
            .iter()
            .filter(|g| g.state != GroupState::Removed)
            .map(|g| g.name.clone())
            .collect();
        if actors.is_empty() && groups.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "left in Ray: actors {actors:?}, groups {groups:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    observer
        .shutdown(Duration::from_secs(10))
        .await
        .expect("the observer stops");
    let left = left_behind(mark, Duration::from_secs(10));
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// Two workers under SPREAD: one per node, node ranks 0 and 1, run in the driver's directory.
fn spread_ranks_cover_both_nodes(cluster: &RayCluster) {
    let output = run(cluster, "ray-spread", &["-n", "2", "-s", "SPREAD", "-r"])
        .args([r#"{"CPU": 1, "memory": "100MB"}"#, "--"])
        .args([
            "sh",
            "-c",
            "echo \"rank=$RANK node_rank=$NODE_RANK world=$WORLD_SIZE dir=$(pwd)\"",
        ])
        .output()
        .expect("trainyard runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let dir = root().canonicalize().expect("the repository");
    for (rank, node_rank) in [(0, 0), (1, 1)] {
        let line = format!(
            "rank={rank} node_rank={node_rank} world=2 dir={}",
            dir.display()
        );
        assert!(
            stdout.contains(&line),
            "no `{line}` in:\n{stdout}\n{stderr}"
        );
    }
}

/// A remote runtime's workers see only what they are given: `--env`, the variables
/// `--env-from-driver` names, and the run's own; never the driver's whole environment.
fn only_what_is_given_reaches_ray_workers(cluster: &RayCluster) {
    let output = run(cluster, "ray-env", &["-n", "1", "--env-from-driver", "TY_PASS_*", "--"])
        .args([
            "sh",
            "-c",
            "echo secret=${TY_SECRET:-unset} pass=${TY_PASS_ME:-unset} mark=${TRAINYARD_TEST_MARKER:-unset}",
        ])
        .env("TY_SECRET", "s3cret")
        .env("TY_PASS_ME", "yes")
        .output()
        .expect("trainyard runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("secret=unset pass=yes mark=ray-env"),
        "{stdout}\n{stderr}"
    );
}

/// Fails `what` unless the cluster's interpreter has torch, as the one of
/// `scripts/ray-env.sh` has (it runs `scripts/python-env.sh` first).
fn assert_has_torch(cluster: &RayCluster, what: &str) {
    let probe = Command::new(&cluster.python)
        .args(["-c", "import torch"])
        .stderr(Stdio::null())
        .status();
    assert!(
        probe.is_ok_and(|status| status.success()),
        "{what}: {} cannot import torch; TRAINYARD_RAY_PYTHON must be the interpreter of scripts/ray-env.sh, which has torch",
        cluster.python.display()
    );
}

/// The issue's scenario: `-r '{"memory": 10000}'`, two workers, the torch backend, and
/// `examples/torch_ddp.py`; every rank prints the right sum.
fn torch_all_reduces_on_ray(cluster: &RayCluster) {
    assert_has_torch(cluster, "torch on Ray");
    let python = cluster.python.display().to_string();
    let output = run(
        cluster,
        "ray-torch",
        &["-n", "2", "-r", r#"{"memory": 10000}"#, "--"],
    )
    .args([python.as_str(), "examples/torch_ddp.py"])
    .output()
    .expect("trainyard runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    for rank in 0..2 {
        let line = format!("rank {rank}: all_reduce sum = 3 (expected 3)");
        assert!(
            stdout.contains(&line),
            "no `{line}` in:\n{stdout}\n{stderr}"
        );
    }
}

/// Checkpoints on Ray: two ranks spread over both nodes hand in a checkpoint each epoch; rank
/// 1 SIGKILLs itself after epoch 3, and under `--max-failures 1` every rank of the second
/// attempt starts at epoch 4 from the committed checkpoint.
fn a_killed_rank_resumes_from_its_checkpoint_on_ray(cluster: &RayCluster, storage: &Path) {
    assert_has_torch(cluster, "checkpoints on Ray");
    let python = cluster.python.display().to_string();
    let storage = storage.display().to_string();
    let output = run(
        cluster,
        "ray-checkpoint",
        &[
            "-n",
            "2",
            "-s",
            "SPREAD",
            "--max-failures",
            "1",
            "--name",
            "ray-ckpt",
        ],
    )
    .args(["--storage", &storage, "--env", "KILL_RANK1_AFTER=3", "--"])
    .args([python.as_str(), "examples/torch_checkpoint.py"])
    .output()
    .expect("trainyard runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    for rank in 0..2 {
        let resumed = format!("rank {rank}: resumed from ");
        let line = stdout
            .lines()
            .find(|l| l.contains(&resumed))
            .unwrap_or_else(|| panic!("rank {rank} did not resume:\n{stdout}\n{stderr}"));
        assert!(line.contains("checkpoint_000003 at epoch 4"), "{line}");
    }
    assert!(stderr.contains("ray-ckpt/checkpoint_000006"), "{stderr}");
    // The restart kept every rank's actor: the killed rank's task started again in its agent.
    let record = Path::new(&storage).join("ray-ckpt").join("run.json");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("run.json")).expect("JSON");
    let agents = |attempt: usize| common::agent_pids(&record, attempt);
    assert_eq!(agents(0).len(), 2, "{record}");
    assert_eq!(
        agents(0),
        agents(1),
        "the agents are the same after the restart: {record}"
    );
}

/// `--warm-python` on Ray: each agent starts a warm Python of its own, next to its worker;
/// every rank of both attempts is a fork of its agent's, and the restart after rank 1's
/// failure kept the agents (and so their warm Pythons).
fn ranks_fork_from_their_agents_warm_python_on_ray(cluster: &RayCluster, scratch: &Path) {
    let python = cluster.python.display().to_string();
    let probe = crate::warm::agents_probe(scratch);
    let storage = scratch.join("warm");
    let output = run(
        cluster,
        "ray-warm",
        &[
            "-n",
            "2",
            "-s",
            "SPREAD",
            "-r",
            "CPU=0.5",
            "--max-failures",
            "1",
        ],
    )
    .args([
        "--name",
        "ray-warm",
        "--warm-python",
        "sqlite3",
        "--storage",
    ])
    .arg(&storage)
    .args(["--", python.as_str()])
    .arg(&probe)
    .output()
    .expect("trainyard runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("attempt 1 failed (rank 1 exited with code 3"),
        "{stderr}"
    );
    crate::warm::assert_warm_in_kept_agents(&stdout, &storage.join("ray-warm"));
}

/// More memory than any node has: exit 3 within 5 s, naming the bundle and the most memory a
/// node has (Ray Train waits forever here).
fn too_much_memory_fails_fast(cluster: &RayCluster) {
    let started = Instant::now();
    let output = run(
        cluster,
        "ray-huge",
        &["-n", "2", "-r", r#"{"memory": "100GB"}"#],
    )
    .args(["--", "true"])
    .output()
    .expect("trainyard runs");
    let elapsed = started.elapsed();
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    let most = format!(
        "the most memory any node has is {}",
        trainyard::resources::ByteSize::new(HEAD_MEMORY).human()
    );
    assert!(
        stderr.contains("bundle 0") && stderr.contains(&most),
        "names the bundle and the largest node's memory ({most}):\n{stderr}"
    );
}

/// Starts a run and returns it with a channel of its stdout lines.
pub(crate) fn spawn_run(mut command: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("trainyard starts");
    let stdout = child.stdout.take().expect("piped");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            eprintln!("  | {line}");
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    (child, received)
}

/// Waits for a line containing `needle`; returns it.
pub(crate) fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(error) => panic!("no line with `{needle}`: {error}"),
        }
    }
}

/// The pid in a `(rank=R, pid=P) ...` line.
pub(crate) fn task_pid(line: &str) -> u32 {
    let start = line.find("pid=").expect("a pid") + 4;
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|pid| pid.parse().ok())
        .expect("a numeric pid")
}

pub(crate) fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process lives");
    let after = &stat[stat.rfind(')').expect("a command name") + 1..];
    after
        .split_whitespace()
        .nth(1)
        .and_then(|ppid| ppid.parse().ok())
        .expect("a parent")
}

pub(crate) fn wait_exit(child: &mut Child, bound: Duration) -> Option<i32> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run did not end within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A worker's Ray actor SIGKILLed mid-run: with `--max-failures 1` the run restarts and then
/// succeeds; the first attempt's actors and group are gone.
fn a_killed_worker_actor_restarts_the_run(cluster: &RayCluster, scratch: &Path) {
    let storage = scratch.join("kill");
    let mut command = run(cluster, "ray-kill", &["-n", "2", "--max-failures", "1"]);
    command
        .args(["--name", "ray-kill", "--storage"])
        .arg(&storage);
    // task → agent → the Ray actor's worker process.
    replaced_while_the_other_is_kept(command, &storage.join("ray-kill"), scratch, |agent| {
        parent_of(agent)
    });
}

/// A 2-rank run of `command` (`--max-failures 1`, its run folder `run`) whose rank 1's agent
/// process, or what `victim` names from its pid (its Ray actor's worker), is SIGKILLed
/// mid-task: the run goes on, rank 1 with a new agent and rank 0 with the one it had.
pub(crate) fn replaced_while_the_other_is_kept(
    mut command: Command,
    run: &Path,
    scratch: &Path,
    victim: impl Fn(u32) -> u32,
) {
    let again = scratch.join("again");
    let script = format!(
        "if [ -e {again} ]; then echo second-$RANK; exit 0; fi; echo first-$RANK; sleep 120",
        again = again.display()
    );
    command.args(["--", "sh", "-c", &script]);
    let (mut child, lines) = spawn_run(command);
    let line = wait_for_line(&lines, "first-1");
    std::fs::write(&again, "").expect("the marker file");
    let agent = parent_of(task_pid(&line));
    kill(
        Pid::from_raw(i32::try_from(victim(agent)).expect("pid")),
        Signal::SIGKILL,
    )
    .expect("kill");
    wait_for_line(&lines, "second-0");
    assert_eq!(wait_exit(&mut child, Duration::from_secs(90)), Some(0));
    let record = hosts::record(run);
    let (before, after) = (
        common::agent_pids(&record, 0),
        common::agent_pids(&record, 1),
    );
    assert_eq!(before.len(), 2, "{record}");
    assert_eq!(before[1], u64::from(agent), "{record}");
    assert_eq!(before[0], after[0], "rank 0 kept its agent: {record}");
    assert!(
        after.len() == 2 && after[1] != before[1],
        "rank 1 has a new agent: {record}"
    );
}

/// The driver SIGKILLed mid-run: its bridge dies with it, Ray ends the job's actors and
/// groups, and the agents, losing their driver, exit.
fn a_sigkilled_driver_leaves_nothing_running(cluster: &RayCluster) {
    let mut command = run(cluster, "ray-sigkill", &["-n", "2"]);
    command.args(["--", "sh", "-c", "echo up-$RANK; sleep 120"]);
    let (mut child, lines) = spawn_run(command);
    wait_for_line(&lines, "up-1");
    child.kill().expect("SIGKILL the driver");
    let _ = child.wait();
}

/// SIGTERM to the driver mid-run: the workers stop, the run's actors and group go, exit 130.
fn a_sigtermed_driver_stops_and_cleans_up(cluster: &RayCluster) {
    let mut command = run(cluster, "ray-sigterm", &["-n", "2"]);
    command.args(["--", "sh", "-c", "echo up-$RANK; sleep 120"]);
    let (mut child, lines) = spawn_run(command);
    wait_for_line(&lines, "up-1");
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM the driver");
    assert_eq!(wait_exit(&mut child, Duration::from_secs(60)), Some(130));
}

/// How long after a node is cut off its agent must have stopped its task: its bound for a
/// silent driver (10 s), and a little more.
const AGENT_STOPS_WITHIN: Duration = Duration::from_secs(15);
/// How long after a node is cut off the driver must have booked the attempt as failed: the
/// heartbeat timeout (10 s) declares the worker dead; the failure is booked once the attempt
/// is over, after the bound (5 s) for the lost agent's kill, which cannot reach the node, and
/// the other rank's stop. Measured: 16 s.
const DETECTED_WITHIN: Duration = Duration::from_secs(20);
/// How long after a node is cut off the run must train again: the failure booked, the next
/// attempt's group reserved on the nodes that answer, its actors and torch started, and the
/// checkpoint loaded. Measured: 20 to 22 s.
const TRAINING_AGAIN_WITHIN: Duration = Duration::from_secs(40);

/// A node's link cut mid-run (`ip link set tyv-rK down`): two checkpointing torch ranks of half
/// a CPU spread over the head and the worker node; the worker node's link goes down. While it
/// is still down the cut-off rank's agent stops its task and exits, the driver declares the
/// attempt failed, and under `--max-failures 1` the run trains again on the head, from a
/// checkpoint no older than the last one committed before the cut, and succeeds. The cut-off
/// node still counts as alive in Ray for a while, with half a CPU free, so the next group must
/// be kept off it: Ray would place a bundle there and wait for it. The link comes back up when the test ends, whatever happens. A single-stack
/// cluster has no link to cut: `SKIP:`.
fn a_node_cut_off_mid_run_stops_its_task_and_the_run_resumes(cluster: &RayCluster, scratch: &Path) {
    let head = cluster
        .address
        .rsplit_once(':')
        .map_or(cluster.address.as_str(), |(host, _)| host);
    let layout = hosts::layout();
    if !layout.iter().any(|host| host.address == head) {
        eprintln!("SKIP: the Ray nodes share this machine's network: no link to cut");
        return;
    }
    assert_has_torch(cluster, "a node cut off on Ray");
    let python = cluster.python.display().to_string();
    let storage = scratch.join("cut");
    let storage = storage.display().to_string();
    let mut command = run(
        cluster,
        "ray-cut",
        &[
            "-n",
            "2",
            "-s",
            "SPREAD",
            "-r",
            "CPU=0.5",
            "--max-failures",
            "1",
        ],
    );
    command
        .args(["--name", "ray-cut", "--storage", &storage])
        .args(["--env", "EPOCHS=24", "--env", "EPOCH_SECONDS=0.5", "--"])
        .args([python.as_str(), "examples/torch_checkpoint.py"]);
    let folder = Path::new(&storage).join("ray-cut");
    let mut running = Running::start(&mut command);
    running.expect_line("rank 1: epoch 5 start", Duration::from_secs(180));
    let before = hosts::record(&folder);
    let committed = hosts::last_committed(&before);
    let (rank, cut_off) = (0..2)
        .map(|rank| (rank, hosts::rank_of(&before, 0, rank)))
        .find(|(_, placed)| placed.ip != head)
        .unwrap_or_else(|| panic!("no rank off the head: {before}"));
    let node = layout
        .iter()
        .find(|host| host.address == cut_off.ip)
        .unwrap_or_else(|| panic!("no host has rank {rank}'s address {}", cut_off.ip));

    let cut = Cut::new(vec![node.link.clone()]);
    let at = Instant::now();
    // While the link is still down: the agent stops its task and exits by itself, and the
    // driver declares the attempt failed.
    let stopped = hosts::gone_by(&[cut_off.task, cut_off.agent], AGENT_STOPS_WITHIN)
        .unwrap_or_else(|| {
            panic!(
                "rank {rank}'s task ({}) or agent ({}) on the cut-off {} still runs",
                cut_off.task, cut_off.agent, node.name
            )
        });
    let detected = hosts::failed_by(
        &folder,
        0,
        (at + DETECTED_WITHIN).saturating_duration_since(Instant::now()),
    )
    .unwrap_or_else(|| {
        panic!(
            "the driver did not declare {}'s worker lost in time",
            node.name
        )
    });
    let again = hosts::resumed_from_at_least(
        &mut running,
        "resumed from ",
        (at + TRAINING_AGAIN_WITHIN).saturating_duration_since(Instant::now()),
        committed,
    );
    eprintln!(
        "fault: link down on Ray node {}: detected in {:.1} s, its task stopped in {:.1} s, training again in {:.1} s",
        node.name,
        hosts::seconds(at, detected),
        hosts::seconds(at, stopped),
        hosts::seconds(at, again)
    );
    // The next attempt runs where the driver is heard: not on the node cut off.
    let after = hosts::record(&folder);
    for rank in 0..2 {
        let placed = hosts::rank_of(&after, 1, rank);
        assert_ne!(
            placed.ip, cut_off.ip,
            "rank {rank} went back to the cut-off node: {after}"
        );
    }
    let ended = running.finish(Duration::from_secs(180));
    drop(cut);
    assert!(ended.status.success(), "{}", ended.all());
    assert!(
        ended.stdout.contains("rank 0: done at epoch 24"),
        "{}",
        ended.all()
    );
}

/// A two-node cluster of the test's own with both nodes alive, and a bridge to it.
async fn two_nodes_up() -> (RayCluster, Bridge) {
    let cluster = RayCluster::start(false).unwrap_or_else(|error| panic!("{error}"));
    let (bridge, _) = Bridge::start(cluster.bridge_config().namespace("wait"))
        .await
        .expect("a bridge");
    cluster
        .wait_for_nodes(&bridge, 2)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    (cluster, bridge)
}

#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_a_real_ray_cluster_place_fail_restart_and_clean_up() {
    let (cluster, bridge) = two_nodes_up().await;
    bridge
        .shutdown(Duration::from_secs(10))
        .await
        .expect("stops");
    let scratch = tempfile::tempdir().expect("a scratch dir");
    spread_ranks_cover_both_nodes(&cluster);
    nothing_left(&cluster, "ray-spread").await;
    only_what_is_given_reaches_ray_workers(&cluster);
    nothing_left(&cluster, "ray-env").await;
    torch_all_reduces_on_ray(&cluster);
    nothing_left(&cluster, "ray-torch").await;
    too_much_memory_fails_fast(&cluster);
    nothing_left(&cluster, "ray-huge").await;
    a_killed_worker_actor_restarts_the_run(&cluster, scratch.path());
    nothing_left(&cluster, "ray-kill").await;
    a_sigtermed_driver_stops_and_cleans_up(&cluster);
    nothing_left(&cluster, "ray-sigterm").await;
    a_killed_rank_resumes_from_its_checkpoint_on_ray(&cluster, scratch.path());
    nothing_left(&cluster, "ray-checkpoint").await;
    ranks_fork_from_their_agents_warm_python_on_ray(&cluster, scratch.path());
    nothing_left(&cluster, "ray-warm").await;
    a_sigkilled_driver_leaves_nothing_running(&cluster);
    nothing_left(&cluster, "ray-sigkill").await;
    a_detached_run_goes_on_until_stopped(&cluster, scratch.path());
    nothing_left(&cluster, "ray-detach").await;
    // Last: the worker node may not come back from it.
    a_node_cut_off_mid_run_stops_its_task_and_the_run_resumes(&cluster, scratch.path());
    nothing_left(&cluster, "ray-cut").await;
}

/// `--detach` on Ray: the command returns once the workers are starting, the driver goes on
/// in the background, `logs` shows its ranks and `stop` ends it.
fn a_detached_run_goes_on_until_stopped(cluster: &RayCluster, scratch: &Path) {
    let storage = scratch.join("detached");
    let storage = storage.to_string_lossy().into_owned();
    let detached = run(cluster, "ray-detach", &["-n", "2", "--backend", "none"])
        .args(["--name", "ray-detach", "--storage", &storage, "--detach"])
        .args(["--", "sh", "-c", "echo up $TRAINYARD_WORLD_RANK; sleep 300"])
        .output()
        .expect("trainyard runs");
    let (stdout, stderr) = text(&detached);
    assert_eq!(detached.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout, "ray-detach\n", "{stderr}");
    let day_two = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(args)
            .args(["--storage", &storage])
            .stdin(Stdio::null())
            .output()
            .expect("trainyard runs")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs = day_two(&["logs", "ray-detach"]);
        let (lines, _) = text(&logs);
        if lines.contains("(rank=0) up 0") && lines.contains("(rank=1) up 1") {
            break;
        }
        assert!(Instant::now() < deadline, "the ranks' lines: {lines}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let stop = day_two(&["stop", "ray-detach"]);
    let (stdout, stderr) = text(&stop);
    assert_eq!(stop.status.code(), Some(0), "{stdout}\n{stderr}");
    let shown = day_two(&["ps", "--all", "--format", "json"]);
    let rows: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    assert_eq!(rows[0]["status"], "stopped", "{rows}");
}

/// An elastic run on the two-node cluster (3 CPUs): `-n 3:4` starts with 3 workers, grows to
/// 4 from its checkpoint when a third node joins, and when that node is lost goes on with 3
/// (its minimum) once Ray has marked the node dead: one failure, within `--max-failures 1`,
/// since the resize is not counted.
#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elastic_run_grows_when_a_node_joins_and_shrinks_when_it_is_lost() {
    let (mut cluster, bridge) = two_nodes_up().await;
    let storage = tempfile::tempdir().expect("a storage dir");
    let storage_path = storage.path().display().to_string();
    // The ranks end once this exists (the workers run on this machine).
    let stop = storage.path().join("stop");
    let mut command = run(
        &cluster,
        "ray-elastic",
        &["-n", "3:4", "-r", "CPU=1", "--resize-interval", "2s"],
    );
    command
        .args([
            "--max-failures",
            "1",
            "--backend",
            "none",
            "--log-format",
            "json",
        ])
        .args(["--name", "ray-elastic", "--storage", &storage_path])
        .args(["--env", "ELASTIC_STEPS=1000"])
        .args(["--env", &format!("ELASTIC_STOP_FILE={}", stop.display())])
        .args(["--", "python3", "crates/cli/tests/python/elastic.py"]);
    let (mut child, lines) = spawn_run(command);
    let started = wait_for_line(&lines, r#""event":"attempt_started""#);
    assert!(started.contains(r#""world_size":3"#), "{started}");
    wait_for_line(&lines, r#""event":"checkpoint_committed""#);

    let joined = cluster.add_node(1).expect("a third node starts");
    cluster
        .wait_for_nodes(&bridge, 3)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    let resized = wait_for_line(&lines, r#""event":"resized""#);
    assert!(
        resized.contains(r#""from":3"#)
            && resized.contains(r#""to":4"#)
            && resized.contains("room_appeared"),
        "{resized}"
    );
    let grown = wait_for_line(&lines, r#""event":"attempt_started""#);
    assert!(grown.contains(r#""world_size":4"#), "{grown}");
    wait_for_line(&lines, "world_size 4 restored");
    wait_for_line(&lines, r#""event":"checkpoint_committed""#);

    cluster.kill_joined_node(joined);
    wait_for_line(&lines, r#""event":"restarting""#);
    // Ray marks the node dead after about 15 s; until then it may still count its CPUs.
    let shrunk = wait_for_line(&lines, r#""event":"attempt_started""#);
    assert!(shrunk.contains(r#""world_size":3"#), "{shrunk}");
    wait_for_line(&lines, r#""event":"checkpoint_committed""#);
    std::fs::write(&stop, "").expect("the stop file");
    let done = wait_for_line(&lines, r#""event":"run_succeeded""#);
    assert_eq!(wait_exit(&mut child, Duration::from_secs(120)), Some(0));
    let report: serde_json::Value = serde_json::from_str(&done).expect("JSON");
    assert_eq!(
        report["world_sizes"],
        serde_json::json!([3, 4, 3]),
        "{done}"
    );
    assert_eq!(
        report["failures"].as_array().map(Vec::len),
        Some(1),
        "{done}"
    );
    bridge
        .shutdown(Duration::from_secs(10))
        .await
        .expect("stops");
    nothing_left(&cluster, "ray-elastic").await;
}

/// Without an address the run starts a throwaway local head and stops it after.
#[ignore = "needs a Ray cluster: export TRAINYARD_RAY_PYTHON=\"$(scripts/ray-env.sh)\""]
#[test]
fn without_an_address_a_throwaway_head_runs_the_job() {
    let python = trainyard_runtime_ray::testing::python().unwrap_or_else(|error| panic!("{error}"));
    let output = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .current_dir(root())
        .args(["run", "--runtime", "ray", "-n", "2", "--"])
        .args(["sh", "-c", "echo throwaway-$RANK"])
        .env("TRAINYARD_RAY_PYTHON", &python)
        .env_remove("RAY_ADDRESS")
        .stdin(Stdio::null())
        .output()
        .expect("trainyard runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("throwaway-0") && stdout.contains("throwaway-1"),
        "{stdout}"
    );
    assert!(stderr.contains("throwaway local Ray head"), "{stderr}");
}
