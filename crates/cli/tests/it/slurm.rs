//! `trainyard run --runtime slurm` on a real Slurm cluster of four fake nodes on this machine
//! (`scripts/slurm-env.sh`): PyTorch DDP over two nodes, a restart in the same steps (ranks
//! forked from their agents' warm Pythons), a killed agent replaced, memory per step, an OOM kill, a
//! cancelled allocation, an interrupted and a SIGKILLed driver leaving nothing behind, a
//! request no node can hold, and `--detach`. Without the cluster the tests print `SKIP:` and
//! why; under `CI=true` they fail unless `TRAINYARD_SLURM_SKIP` says why.

mod faults;

use trainyard_test_support::processes as common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{MARKER, Sandbox, agent_pids, left_behind, root, torch_python, wait_bounded};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use trainyard_runtime_slurm::testing::{cluster, jobs_named, wait_for_no_jobs};

/// A `trainyard run --runtime slurm --name NAME` in `sandbox`, its workers marked.
fn slurm_run(sandbox: &Sandbox, name: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .current_dir(root())
        .envs(sandbox.env())
        .env(MARKER, sandbox.mark())
        .args(["run", "--runtime", "slurm", "--name", name])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs `command` to its end (killed past `limit`): its output, stdout and stderr.
fn run_to_end(command: &mut Command, limit: Duration) -> (Output, String, String) {
    let child = command.spawn().expect("trainyard starts");
    let out = wait_bounded(child, limit);
    let (stdout, stderr) = text(&out);
    (out, stdout, stderr)
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A name of this test's own for its run (and so its Slurm job).
fn name(test: &str) -> String {
    format!("tyslurm-cli-{test}-{}", std::process::id())
}

/// Waits until the run's allocation runs `count` steps (its workers have started), and a
/// moment more for their tasks to start.
fn wait_for_steps(name: &str, count: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(job) = jobs_named(name).into_iter().next() {
            let steps = Command::new("squeue")
                .args(["-h", "-s", "-j", &job, "-t", "RUNNING", "-o", "%i"])
                .output()
                .expect("squeue");
            if String::from_utf8_lossy(&steps.stdout).lines().count() >= count {
                std::thread::sleep(Duration::from_millis(500));
                return job;
            }
        }
        assert!(Instant::now() < deadline, "the run's steps never started");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Nothing of the run is left: no job in Slurm's queue, no worker process.
/// The address Slurm knows `node` by (its `NodeAddr`).
fn node_addr(node: &str) -> String {
    let out = Command::new("scontrol")
        .args(["show", "node", node, "-o"])
        .output()
        .expect("scontrol runs");
    let shown = String::from_utf8_lossy(&out.stdout);
    shown
        .split_whitespace()
        .find_map(|field| field.strip_prefix("NodeAddr="))
        .unwrap_or_else(|| panic!("no NodeAddr for {node} in: {shown}"))
        .to_owned()
}

fn nothing_left(sandbox: &Sandbox, name: &str) {
    let jobs = wait_for_no_jobs(name, Duration::from_secs(10));
    assert!(jobs.is_empty(), "jobs left in squeue: {jobs:?}");
    let processes = left_behind(sandbox.mark(), Duration::from_secs(10));
    assert!(processes.is_empty(), "worker processes left: {processes:?}");
}

#[test]
fn torch_ddp_spreads_over_two_nodes_and_every_rank_sums_right() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let Some(python) = torch_python() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-ddp");
    let run = name("ddp");
    let (out, stdout, stderr) = run_to_end(
        slurm_run(
            &sandbox,
            &run,
            &["-n", "2", "-s", "SPREAD", "-r", "CPU=1,memory=1GiB", "--"],
        )
        .arg(&python)
        .arg("examples/torch_ddp.py"),
        Duration::from_secs(300),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for (rank, node) in [(0, "n1"), (1, "n2")] {
        // Each node at its own address where the test cluster's nodes have network
        // namespaces of their own (scripts/netns-env.sh), loopback on a single stack.
        let ip = node_addr(node);
        let placed = stderr.lines().any(|line| {
            line.starts_with(&format!("- (node_id={node}, ip={ip}, pid="))
                && line.ends_with(&format!(
                    "world_rank={rank}, local_rank=0, node_rank={rank}"
                ))
        });
        assert!(placed, "rank {rank} on node {node}: {stderr}");
        let want = format!("rank {rank}: all_reduce sum = 3 (expected 3)");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("(rank={rank}, pid=")) && l.ends_with(&want)),
            "no `{want}` in {stdout}"
        );
    }
    nothing_left(&sandbox, &run);
}

#[test]
fn a_killed_rank_restarts_in_the_same_steps_and_resumes_from_its_checkpoint() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let Some(python) = torch_python() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-ckpt");
    let run = name("ckpt");
    let (out, stdout, stderr) = run_to_end(
        slurm_run(
            &sandbox,
            &run,
            &[
                "-n",
                "2",
                "-s",
                "SPREAD",
                "-r",
                "CPU=1,memory=1GiB",
                "--max-failures",
                "1",
                "--env",
                "KILL_RANK1_AFTER=3",
                "--",
            ],
        )
        .arg(&python)
        .arg("examples/torch_checkpoint.py"),
        Duration::from_secs(300),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for rank in 0..2 {
        let resumed = format!("rank {rank}: resumed from ");
        let line = stdout
            .lines()
            .find(|l| l.contains(&resumed))
            .unwrap_or_else(|| panic!("rank {rank} did not resume:\n{stdout}\n{stderr}"));
        assert!(line.contains("checkpoint_000003 at epoch 4"), "{line}");
    }
    let record = sandbox.storage().join(&run).join("run.json");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("run.json")).expect("JSON");
    assert_eq!(record["attempts"][1]["resumed_from"], 3, "{record}");
    // The restart kept every rank's step: the killed rank's task started again in its agent.
    assert_eq!(agent_pids(&record, 0).len(), 2, "{record}");
    assert_eq!(
        agent_pids(&record, 0),
        agent_pids(&record, 1),
        "the agents are the same after the restart: {record}"
    );
    nothing_left(&sandbox, &run);
}

#[test]
fn ranks_fork_from_their_agents_warm_python_in_their_steps_across_a_restart() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-warm");
    let run = name("warm");
    let dir = tempfile::tempdir().expect("a temp dir");
    let probe = crate::warm::agents_probe(dir.path());
    let (out, stdout, stderr) = run_to_end(
        slurm_run(
            &sandbox,
            &run,
            &[
                "-n",
                "2",
                "-s",
                "SPREAD",
                "-r",
                "CPU=0.5",
                "--max-failures",
                "1",
                "--warm-python",
                "sqlite3",
                "--",
                "python3",
            ],
        )
        .arg(&probe),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("attempt 1 failed (rank 1 exited with code 3"),
        "{stderr}"
    );
    crate::warm::assert_warm_in_kept_agents(&stdout, &sandbox.storage().join(&run));
    // The warm Pythons ended with their agents, and their steps with the run.
    nothing_left(&sandbox, &run);
}

#[test]
fn a_killed_agent_is_replaced_in_a_step_of_its_own_and_the_other_rank_keeps_its_own() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-agent-kill");
    let run = name("agentkill");
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let mut command = slurm_run(
        &sandbox,
        &run,
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
    command.stderr(Stdio::inherit());
    crate::ray::replaced_while_the_other_is_kept(
        command,
        &sandbox.storage().join(&run),
        scratch.path(),
        |agent| agent,
    );
    nothing_left(&sandbox, &run);
}

#[test]
fn memory_per_worker_is_each_steps_limit_and_past_it_is_the_ranks_limit() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-memory");
    // The seed's memory-only scenario: Slurm's cgroup holds each step to its --mem.
    let run = name("memory");
    let probe = "cat /sys/fs/cgroup/memory/slurm_$SLURMD_NODENAME/uid_$(id -u)/job_$SLURM_JOB_ID/step_$SLURM_STEP_ID/memory.limit_in_bytes 2>/dev/null || echo no-cgroup";
    let (out, stdout, stderr) = run_to_end(
        &mut slurm_run(
            &sandbox,
            &run,
            &[
                "-n",
                "2",
                "-r",
                r#"{"memory": "200MiB"}"#,
                "--backend",
                "none",
                "--",
                "sh",
                "-c",
                probe,
            ],
        ),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("(rank={rank}, pid="))
                && (stdout.contains(") 209715200") || stdout.contains(") no-cgroup")),
            "rank {rank}'s step limit: {stdout}"
        );
    }
    nothing_left(&sandbox, &run);

    let run = name("oom");
    let (out, stdout, stderr) = run_to_end(
        &mut slurm_run(
            &sandbox,
            &run,
            &[
                "-r",
                "memory=100MiB",
                "--backend",
                "none",
                "--",
                "sh",
                "-c",
                "head -c 400000000 /dev/zero | tail >/dev/null && echo survived",
            ],
        ),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("rank 0 exceeded its memory limit of 100MiB"),
        "{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("survived"), "{stdout}");
    nothing_left(&sandbox, &run);
}

/// A worker that asks for no memory gets the job's default (the test cluster's
/// DefMemPerCPU=256 for its one CPU): past it, the run says that limit and where it came
/// from, and names no log file the rank never wrote.
#[test]
fn a_worker_without_memory_past_slurms_default_is_told_the_limit_and_where_it_came_from() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-default-memory");
    let run = name("default-memory");
    let (out, stdout, stderr) = run_to_end(
        &mut slurm_run(
            &sandbox,
            &run,
            &[
                "--backend",
                "none",
                "--",
                "python3",
                "-c",
                "x = b'x' * 800_000_000",
            ],
        ),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("rank 0 exceeded its memory limit of 256MiB"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.lines().any(|line| line
            == "trainyard: rank 0 asked for no memory, so its Slurm step had what the job got by default (256MiB: the partition's DefMemPerCPU for each of its CPUs): ask for what a worker needs with -r memory=<size>"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("rank_0.log"),
        "the rank wrote nothing: no log file is named: {stderr}"
    );
    nothing_left(&sandbox, &run);
}

#[test]
fn a_cancelled_allocation_fails_the_run_with_that_cause() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-scancel");
    let run = name("scancel");
    let child = slurm_run(
        &sandbox,
        &run,
        &[
            "-n",
            "2",
            "-s",
            "SPREAD",
            "--backend",
            "none",
            "--max-failures",
            "3",
            "--",
            "sleep",
            "60",
        ],
    )
    .spawn()
    .expect("trainyard starts");
    let job = wait_for_steps(&run, 2);
    // The tasks themselves run: a cancel while the steps still launch is a failed start,
    // which is retried.
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::marked(sandbox.mark())
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the tasks never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("scancel").arg(&job).status().expect("scancel");
    assert!(status.success());
    let out = wait_bounded(child, Duration::from_secs(60));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("died: its scheduler cancelled it (scancel)"),
        "not retried, with its cause: {stderr}"
    );
    assert!(stderr.contains("failed after 1 attempt"), "{stderr}");
    nothing_left(&sandbox, &run);
}

/// Starts a two-worker run that sleeps, waits for its steps, and ends its driver with
/// `signal`; returns the driver for its exit.
fn interrupted(sandbox: &Sandbox, run: &str, signal: Signal) -> Child {
    let child = slurm_run(
        sandbox,
        run,
        &[
            "-n",
            "2",
            "-s",
            "SPREAD",
            "--backend",
            "none",
            "--",
            "sleep",
            "60",
        ],
    )
    .spawn()
    .expect("trainyard starts");
    wait_for_steps(run, 2);
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    kill(pid, signal).expect("signalled");
    child
}

#[test]
fn an_interrupted_or_sigkilled_driver_leaves_no_job_and_no_worker() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-interrupt");
    let run = name("sigint");
    let out = wait_bounded(
        interrupted(&sandbox, &run, Signal::SIGINT),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(130), "{:?}", text(&out));
    nothing_left(&sandbox, &run);

    let run = name("sigkill");
    let out = wait_bounded(
        interrupted(&sandbox, &run, Signal::SIGKILL),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), None, "killed");
    nothing_left(&sandbox, &run);
}

#[test]
fn a_sigkilled_driver_whose_allocation_is_still_queued_leaves_no_job() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-queued-kill");
    let run = name("queued-kill");
    // Every CPU of every node is held: the run's allocation waits in the queue.
    let hog = trainyard_runtime_slurm::testing::HeldAllocation::new(
        &format!("{run}-hog"),
        &[
            "--nodes=4",
            "--ntasks-per-node=1",
            "--cpus-per-task=2",
            "--mem=100M",
        ],
    );
    let child = slurm_run(
        &sandbox,
        &run,
        &["-n", "2", "--backend", "none", "--", "true"],
    )
    .spawn()
    .expect("trainyard starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while jobs_named(&run).iter().all(|job| *job == hog.job) {
        assert!(
            Instant::now() < deadline,
            "the run's allocation was never queued"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    kill(pid, Signal::SIGKILL).expect("killed");
    let out = wait_bounded(child, Duration::from_secs(10));
    assert_eq!(out.status.code(), None, "killed");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mine = || -> Vec<String> {
        jobs_named(&run)
            .into_iter()
            .filter(|job| *job != hog.job)
            .collect()
    };
    while !mine().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the queued request outlived its driver: {:?}",
            mine()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(hog);
}

#[test]
fn what_no_node_can_hold_exits_3_at_once_and_bad_flags_exit_2() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-infeasible");
    let run = name("huge");
    let started = Instant::now();
    let out = slurm_run(&sandbox, &run, &["-r", "memory=100GB", "--", "true"])
        .output()
        .expect("trainyard runs");
    let took = started.elapsed();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        stderr.contains("bundle 0 needs memory=100GB but the most memory any node has is 4GiB"),
        "{stderr}"
    );
    assert!(jobs_named(&run).is_empty());

    for (flags, said) in [
        (
            &["--partition", "nope"][..],
            "partition `nope` does not exist",
        ),
        (&["--time", "1h"][..], "invalid value `1h` for `--time`"),
        (
            &["--signal", "USR3@90"][..],
            "invalid value `USR3@90` for `--signal`",
        ),
        (&["--num-cpus", "4"][..], "a Slurm cluster describes itself"),
    ] {
        let out = slurm_run(&sandbox, &run, &[flags, &["--", "true"]].concat())
            .output()
            .expect("trainyard runs");
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
    }
}

#[test]
fn a_detached_run_is_a_batch_job_whose_output_file_shows_the_ranks() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-detach");
    let run = name("detach");
    let output = std::env::temp_dir().join(format!("{run}-%j.out"));
    let out = slurm_run(
        &sandbox,
        &run,
        &[
            "--detach",
            "--output",
            &output.to_string_lossy(),
            "-n",
            "2",
            "-s",
            "SPREAD",
            "--backend",
            "none",
            "--",
            "sh",
            "-c",
            "echo rank $TRAINYARD_WORLD_RANK on $SLURMD_NODENAME",
        ],
    )
    .output()
    .expect("trainyard submits");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let job = stdout.trim().to_owned();
    assert!(
        job.parse::<u64>().is_ok(),
        "the job id alone on stdout: {stdout}"
    );
    let file = output.to_string_lossy().replace("%j", &job);
    assert!(
        stderr.contains(&format!(
            "submitted Slurm job {job}; its output goes to {file}"
        )),
        "{stderr}"
    );
    // The job runs to its end.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !jobs_named(&run).is_empty() && job_is_queued(&job) {
        assert!(Instant::now() < deadline, "job {job} did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    let shown = std::fs::read_to_string(&file).expect("the output file");
    let _ = std::fs::remove_file(&file);
    for (rank, node) in [(0, "n1"), (1, "n2")] {
        assert!(shown.contains(&format!("rank {rank} on {node}")), "{shown}");
    }
    assert!(shown.contains("trainyard: the run succeeded"), "{shown}");
}

/// Whether `job` is pending or running still.
fn job_is_queued(job: &str) -> bool {
    let out = Command::new("squeue")
        .args(["-h", "-j", job, "-o", "%T"])
        .output()
        .expect("squeue");
    let state = String::from_utf8_lossy(&out.stdout);
    matches!(
        state.trim(),
        "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING"
    )
}

#[test]
fn cluster_and_plan_show_the_partitions_nodes() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["cluster", "--runtime", "slurm", "--format", "json"])
        .output()
        .expect("trainyard runs");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let shown: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let names: Vec<&str> = shown["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|node| node["id"].as_str())
        .collect();
    assert_eq!(names, ["n1", "n2", "n3", "n4"], "{stdout}");
    assert_eq!(shown["nodes"][0]["resources"]["CPU"], 2, "{stdout}");

    let out = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args([
            "plan",
            "-n",
            "3",
            "-s",
            "STRICT_SPREAD",
            "-r",
            "memory=200MiB",
        ])
        .args(["--runtime", "slurm"])
        .output()
        .expect("trainyard runs");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for (bundle, node) in [(0, "n1"), (1, "n2"), (2, "n3")] {
        assert!(
            stdout.contains(&format!("bundle {bundle} ("))
                && stdout.contains(&format!("-> {node}")),
            "{stdout}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args([
            "plan",
            "-n",
            "5",
            "-s",
            "STRICT_SPREAD",
            "--runtime",
            "slurm",
        ])
        .output()
        .expect("trainyard runs");
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
}

/// `trainyard SUBCOMMAND ARGS` over the sandbox's storage, to its end.
fn day_two(sandbox: &Sandbox, args: &[&str]) -> (Output, String, String) {
    run_to_end(
        Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .envs(sandbox.env())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        Duration::from_secs(60),
    )
}

#[test]
fn the_day_two_commands_see_a_live_slurm_run_and_its_stop_leaves_no_job() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-day-two");
    let run = name("daytwo");
    let driver = slurm_run(
        &sandbox,
        &run,
        &[
            "-n",
            "2",
            "-s",
            "SPREAD",
            "--backend",
            "none",
            "--",
            "sh",
            "-c",
            "echo up $TRAINYARD_WORLD_RANK; while :; do sleep 0.2; done",
        ],
    )
    .spawn()
    .expect("trainyard starts");
    wait_for_steps(&run, 2);

    let (out, stdout, stderr) = day_two(&sandbox, &["ps"]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout
            .lines()
            .any(|line| line.starts_with(&format!("{run} ")) && line.contains(" running ")),
        "{stdout}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, stdout, _) = day_two(&sandbox, &["logs", &run]);
        if ["(rank=0) up 0", "(rank=1) up 1"]
            .iter()
            .all(|line| stdout.lines().any(|l| l == *line))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the ranks' lines: {stdout}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (out, stdout, stderr) = day_two(&sandbox, &["stacks", &run]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("=== rank 1 ==="), "{stdout}");

    let (out, stdout, stderr) = day_two(&sandbox, &["stop", &run]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("trainyard: run `{run}` stopped in ")),
        "{stderr}"
    );
    let ended = wait_bounded(driver, Duration::from_secs(60));
    assert_eq!(ended.status.code(), Some(130), "{:?}", text(&ended));
    nothing_left(&sandbox, &run);

    // The finished run: its record, and its logs from the run folder.
    let (out, stdout, stderr) = day_two(&sandbox, &["show", &run, "--format", "json"]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let shown: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(shown["status"], "stopped");
    let (_, stdout, _) = day_two(&sandbox, &["logs", &run, "--rank", "1"]);
    assert_eq!(stdout.lines().next(), Some("(rank=1) up 1"), "{stdout}");
}

#[test]
fn a_detached_slurm_run_driven_on_another_host_is_stopped_through_its_job() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let sandbox = Sandbox::new("slurm-stop-anywhere");
    let run = name("anywhere");
    let output = std::env::temp_dir().join(format!("{run}-%j.out"));
    let out = slurm_run(
        &sandbox,
        &run,
        &[
            "--detach",
            "--output",
            &output.to_string_lossy(),
            "-n",
            "2",
            "--backend",
            "none",
            "--",
            "sh",
            "-c",
            "echo up; while :; do sleep 0.2; done",
        ],
    )
    .output()
    .expect("trainyard submits");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let job = stdout.trim().to_owned();
    let file = output.to_string_lossy().replace("%j", &job);
    // The driver, in the batch job, records its job; it is made to look driven elsewhere.
    let record_file = sandbox.storage().join(&run).join("run.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut record: serde_json::Value = loop {
        let read = std::fs::read(&record_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .filter(|record| !record["attempts"].as_array().is_none_or(Vec::is_empty));
        if let Some(record) = read {
            break record;
        }
        assert!(
            Instant::now() < deadline,
            "the run never started in job {job}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(record["driver"]["slurm_job"], serde_json::json!(job));
    wait_for_steps(&run, 3);
    record["driver"]["host"] = serde_json::json!("elsewhere");
    std::fs::write(&record_file, serde_json::to_vec(&record).expect("JSON")).expect("written");
    let (_, listed, _) = day_two(&sandbox, &["ps", "--format", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&listed).expect("JSON");
    assert_eq!(rows[0]["status"], "running", "{listed}");

    let (out, stdout, stderr) = day_two(&sandbox, &["stop", &run]);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("in Slurm job {job}); the same command resumes it")),
        "{stderr}"
    );
    nothing_left(&sandbox, &run);
    let shown = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    assert!(
        shown.contains("interrupted"),
        "the driver was interrupted: {shown}"
    );
    let (_, stdout, _) = day_two(&sandbox, &["ps", "--all", "--format", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(rows[0]["status"], "stopped", "{stdout}");

    // A record that still says running elsewhere, with no lease (a driver of an earlier
    // version), of a job that is gone: lost.
    let _ = std::fs::remove_file(sandbox.storage().join(&run).join("lease.json"));
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record_file).expect("run.json")).expect("JSON");
    record["status"] = serde_json::json!("running");
    record["driver"]["host"] = serde_json::json!("elsewhere");
    std::fs::write(&record_file, serde_json::to_vec(&record).expect("JSON")).expect("written");
    let (_, stdout, _) = day_two(&sandbox, &["ps", "--all", "--format", "json"]);
    let rows: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(rows[0]["status"], "lost", "{stdout}");
}
