//! Resumable runs with real PyTorch DDP (2 workers, gloo): `examples/torch_checkpoint.py`
//! hands in a checkpoint every epoch through `train.report(..., checkpoint=...)`. A rank
//! killed mid-run, a driver killed mid-run, S3 storage on a loopback S3 server, a shard per
//! rank, and retention by score.

use trainyard_test_support::processes as common;

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{LEDGER, MARKER, agent_pids, json_events, left_behind, root, torch_python};
use serde_json::Value;

/// How long one run may take.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// `trainyard run` of the example with two workers, JSON events on stdout.
fn command(name: &str, storage: &str, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .current_dir(root())
        .args(["run", "-n", "2", "-r", "CPU=0.5", "--log-format", "json"])
        .args(["--name", name, "--storage", storage])
        // A ledger of the test's own: another run on this machine never makes it wait.
        .env(
            LEDGER,
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-{name}")),
        )
        .env("CI", "1")
        .env(MARKER, name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// Adds the flags after the run's own and the program, then runs it to its end.
fn finish(mut command: Command, flags: &[&str], python: &Path) -> (bool, Vec<Value>, String) {
    let child = command
        .args(flags)
        .arg("--")
        .arg(python)
        .arg("examples/torch_checkpoint.py")
        .spawn()
        .expect("trainyard starts");
    wait(child)
}

fn wait(mut child: Child) -> (bool, Vec<Value>, String) {
    let deadline = Instant::now() + RUN_LIMIT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not finish within {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success(),
        json_events(&stdout),
        format!("{stdout}\n{stderr}"),
    )
}

/// The lines rank `rank` printed, in order, split into attempts by `restarting` events.
fn lines_by_attempt(events: &[Value], rank: u64) -> Vec<Vec<String>> {
    let mut attempts = vec![Vec::new()];
    for event in events {
        if event["event"] == "restarting" {
            attempts.push(Vec::new());
        }
        if event["event"] == "log" && event["rank"] == rank {
            if let (Some(line), Some(current)) = (event["line"].as_str(), attempts.last_mut()) {
                current.push(line.to_owned());
            }
        }
    }
    attempts
}

/// The epochs rank `rank` started in each attempt.
fn epochs_by_attempt(events: &[Value], rank: u64) -> Vec<Vec<u64>> {
    lines_by_attempt(events, rank)
        .iter()
        .map(|lines| {
            lines
                .iter()
                .filter_map(|l| {
                    l.strip_prefix(&format!("rank {rank}: epoch "))?
                        .strip_suffix(" start")?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .collect()
}

fn committed(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["event"] == "checkpoint_committed")
        .filter_map(|e| e["checkpoint"]["index"].as_u64())
        .collect()
}

/// No epoch ran more than twice on any rank, over `runs`.
fn assert_each_epoch_at_most_twice(runs: &[&[Value]]) {
    for rank in 0..2 {
        let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
        for events in runs {
            for epoch in epochs_by_attempt(events, rank).into_iter().flatten() {
                *counts.entry(epoch).or_default() += 1;
            }
        }
        assert!(
            counts.values().all(|n| *n <= 2),
            "rank {rank} ran an epoch more than twice: {counts:?}"
        );
        assert_eq!(
            counts.keys().copied().collect::<Vec<_>>(),
            (1..=6).collect::<Vec<_>>()
        );
    }
}

fn run_json(storage: &Path, name: &str) -> Value {
    let text = std::fs::read_to_string(storage.join(name).join("run.json")).expect("run.json");
    serde_json::from_str(&text).expect("run.json is valid JSON")
}

/// The scenario of (a), (c) and (d): rank 1 SIGKILLs itself right after epoch 3's checkpoint,
/// under `--max-failures 1`; every rank of the second attempt starts at epoch 4.
fn rank_killed_after_epoch_3(
    python: &Path,
    name: &str,
    storage: &str,
    env: &[(&str, &str)],
) -> Vec<Value> {
    let mut env = env.to_vec();
    env.push(("KILL_RANK1_AFTER", "3"));
    let (ok, events, output) = finish(
        command(name, storage, &env),
        &["--max-failures", "1"],
        python,
    );
    assert!(ok, "the run succeeds after one restart: {output}");
    for rank in 0..2 {
        let attempts = epochs_by_attempt(&events, rank);
        assert_eq!(attempts.len(), 2, "two attempts: {output}");
        assert_eq!(attempts[0].first(), Some(&1), "rank {rank}: {output}");
        assert_eq!(
            attempts[1],
            vec![4, 5, 6],
            "rank {rank} resumes at epoch 4: {output}"
        );
        let resumed = lines_by_attempt(&events, rank)[1].iter().any(|l| {
            l.starts_with(&format!("rank {rank}: resumed from ")) && l.contains("checkpoint_000003")
        });
        assert!(
            resumed,
            "rank {rank} says it resumed from checkpoint 3: {output}"
        );
    }
    assert_each_epoch_at_most_twice(&[&events]);
    assert_eq!(committed(&events), vec![1, 2, 3, 4, 5, 6], "{output}");
    // Each report says whether it handed in a checkpoint: rank 0's always, rank 1's only
    // when the ranks hand in shards.
    let shards = env.iter().any(|(key, _)| *key == "SHARDS");
    for report in events.iter().filter(|e| e["event"] == "report") {
        let expected = shards || report["rank"] == 0;
        assert_eq!(report["checkpoint"], expected, "{report}");
    }
    let succeeded = events
        .iter()
        .find(|e| e["event"] == "run_succeeded")
        .expect("run_succeeded");
    assert!(
        succeeded["checkpoint"]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("checkpoint_000006")),
        "{succeeded}"
    );
    assert!(
        left_behind(name, Duration::from_secs(10)).is_empty(),
        "processes left behind"
    );
    events
}

#[test]
fn a_rank_killed_after_epoch_3_resumes_every_rank_at_epoch_4() {
    let Some(python) = torch_python() else {
        return;
    };
    let storage = tempfile::tempdir().expect("tempdir");
    let dir = storage.path().display().to_string();
    rank_killed_after_epoch_3(&python, "ckpt-rank", &dir, &[]);
    let record = run_json(storage.path(), "ckpt-rank");
    assert_eq!(record["status"], "finished");
    assert_eq!(record["attempts"][1]["resumed_from"], 3);
    // The restart kept every worker's agent: the killed rank's task started again in its own.
    assert_eq!(
        agent_pids(&record, 0),
        agent_pids(&record, 1),
        "the agents are the same after the restart: {record}"
    );
    assert_eq!(agent_pids(&record, 0).len(), 2, "{record}");
    assert!(
        storage
            .path()
            .join("ckpt-rank/checkpoint_000006/model.pt")
            .is_file()
    );
}

#[test]
fn every_rank_saves_its_own_shard_and_the_restore_sees_both() {
    let Some(python) = torch_python() else {
        return;
    };
    let storage = tempfile::tempdir().expect("tempdir");
    let dir = storage.path().display().to_string();
    let events = rank_killed_after_epoch_3(&python, "ckpt-shards", &dir, &[("SHARDS", "1")]);
    for rank in 0..2 {
        let sees_both = lines_by_attempt(&events, rank)[1]
            .iter()
            .any(|l| l.ends_with("files ['shard_0.pt', 'shard_1.pt']"));
        assert!(
            sees_both,
            "rank {rank}'s restore sees both shards: {events:?}"
        );
    }
    let last = storage.path().join("ckpt-shards/checkpoint_000006");
    assert!(last.join("shard_0.pt").is_file() && last.join("shard_1.pt").is_file());
}

#[test]
fn every_rank_saving_model_pt_commits_one_copy_and_resumes_from_it() {
    let Some(python) = torch_python() else {
        return;
    };
    let storage = tempfile::tempdir().expect("tempdir");
    let dir = storage.path().display().to_string();
    let events = rank_killed_after_epoch_3(&python, "ckpt-same", &dir, &[("SHARDS", "all")]);
    for rank in 0..2 {
        let sees_one = lines_by_attempt(&events, rank)[1]
            .iter()
            .any(|l| l.ends_with("files ['model.pt']"));
        assert!(
            sees_one,
            "rank {rank}'s restore sees one model.pt: {events:?}"
        );
    }
    let last = storage.path().join("ckpt-same/checkpoint_000006");
    let files: Vec<_> = std::fs::read_dir(&last)
        .expect("the last checkpoint")
        .map(|entry| entry.expect("an entry").file_name())
        .collect();
    assert_eq!(files, ["model.pt"], "one copy, no temporary file left");
}

#[test]
fn a_rank_killed_after_epoch_3_resumes_from_s3() {
    let Some(python) = torch_python() else {
        return;
    };
    let server = match trainyard_checkpoint::testing::S3Server::start() {
        Ok(Some(server)) => server,
        Ok(None) => return,
        Err(error) => panic!("the S3 server cannot start: {error}"),
    };
    server.create_bucket("runs").expect("create the bucket");
    let env: Vec<(String, String)> = server.env().into_iter().collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    rank_killed_after_epoch_3(&python, "ckpt-s3", "s3://runs/experiments", &env);
}

#[test]
fn a_driver_killed_after_epoch_3_is_resumed_by_the_same_command() {
    let Some(python) = torch_python() else {
        return;
    };
    let storage = tempfile::tempdir().expect("tempdir");
    let dir = storage.path().display().to_string();
    let name = "ckpt-driver";
    let env = [("EPOCH_SECONDS", "1")];
    let mut child = command(name, &dir, &env)
        .arg("--")
        .arg(&python)
        .arg("examples/torch_checkpoint.py")
        .spawn()
        .expect("trainyard starts");
    let stdout = child.stdout.take().expect("stdout");
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let third =
                event["event"] == "checkpoint_committed" && event["checkpoint"]["index"] == 3;
            seen.push(event);
            if third {
                let _ = seen_tx.send(std::mem::take(&mut seen));
            }
        }
    });
    let first = seen_rx
        .recv_timeout(RUN_LIMIT)
        .expect("checkpoint 3 is committed");
    child.kill().expect("SIGKILL the driver");
    let _ = child.wait();
    assert!(
        left_behind(name, Duration::from_secs(15)).is_empty(),
        "the workers die with their driver"
    );
    let record = run_json(storage.path(), name);
    assert_eq!(record["status"], "running", "{record}");
    assert_eq!(record["latest_checkpoint"], 3, "{record}");

    let (ok, events, output) = finish(command(name, &dir, &env), &[], &python);
    assert!(ok, "the same command finishes the run: {output}");
    for rank in 0..2 {
        assert_eq!(
            epochs_by_attempt(&events, rank),
            vec![vec![4, 5, 6]],
            "rank {rank}: {output}"
        );
    }
    assert_each_epoch_at_most_twice(&[&first, &events]);
    assert_eq!(run_json(storage.path(), name)["status"], "finished");

    // A finished run is refused with a hint, unless started afresh.
    let (ok, _, output) = finish(command(name, &dir, &env), &[], &python);
    assert!(!ok && output.contains("--resume never"), "{output}");
    let (ok, events, output) = finish(command(name, &dir, &[]), &["--resume", "never"], &python);
    assert!(ok, "{output}");
    assert_eq!(epochs_by_attempt(&events, 0), vec![vec![1, 2, 3, 4, 5, 6]]);
    assert!(storage.path().join(format!("{name}-2/run.json")).is_file());
}

#[test]
fn a_killed_agent_is_replaced_in_its_bundle_and_the_other_agent_is_kept() {
    let Some(python) = torch_python() else {
        return;
    };
    let storage = tempfile::tempdir().expect("tempdir");
    let dir = storage.path().display().to_string();
    let name = "ckpt-agent";
    let env = [("EPOCH_SECONDS", "1")];
    let child = command(name, &dir, &env)
        .args(["--max-failures", "1", "--"])
        .arg(&python)
        .arg("examples/torch_checkpoint.py")
        .spawn()
        .expect("trainyard starts");
    // Once checkpoint 2 is committed, rank 1's agent is SIGKILLed (its task dies with it).
    let deadline = Instant::now() + RUN_LIMIT;
    let victim = loop {
        let record = std::fs::read_to_string(storage.path().join(name).join("run.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok());
        if let Some(record) = record {
            let agents = agent_pids(&record, 0);
            if record["latest_checkpoint"].as_u64() >= Some(2) && agents.len() == 2 {
                break agents[1];
            }
        }
        assert!(Instant::now() < deadline, "checkpoint 2 is not committed");
        std::thread::sleep(Duration::from_millis(50));
    };
    let victim = i32::try_from(victim).expect("a pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL rank 1's agent");
    let (ok, events, output) = wait(child);
    assert!(ok, "the run succeeds after the restart: {output}");
    let record = run_json(storage.path(), name);
    let (before, after) = (agent_pids(&record, 0), agent_pids(&record, 1));
    assert_eq!(after.len(), 2, "{record}");
    assert_eq!(before[0], after[0], "rank 0's agent is kept: {record}");
    assert_ne!(before[1], after[1], "rank 1's agent is a new one: {record}");
    let resumed = record["attempts"][1]["resumed_from"]
        .as_u64()
        .expect("the restart resumed from a checkpoint");
    assert!(resumed >= 2, "{record}");
    for rank in 0..2 {
        let epochs = epochs_by_attempt(&events, rank);
        assert_eq!(epochs.len(), 2, "rank {rank}: {output}");
        assert_eq!(
            epochs[1].first().copied(),
            Some(resumed + 1),
            "rank {rank} goes on from the last committed checkpoint: {output}"
        );
    }
    assert_eq!(record["latest_checkpoint"], 6, "{record}");
    assert!(
        left_behind(name, Duration::from_secs(10)).is_empty(),
        "processes left behind"
    );
}

/// `trainyard run --backend none --name NAME --storage STORAGE FLAGS -- PROGRAM`, with a
/// ledger of the storage's own.
fn named_run(storage: &Path, name: &str, flags: &[&str], program: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .env(LEDGER, storage.join("ledger"))
        .args(["run", "--backend", "none", "--name", name, "--storage"])
        .arg(storage)
        .args(flags)
        .arg("--")
        .args(program)
        .env("CI", "1")
        .stdin(Stdio::null());
    command
}

#[test]
fn a_finished_run_of_the_same_name_exits_2_with_a_hint() {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = |extra: &[&str]| {
        named_run(storage.path(), "done", extra, &["true"])
            .output()
            .expect("trainyard runs")
    };
    assert!(run(&[]).status.success());
    let again = run(&[]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`done`")
            && stderr.contains("--resume never")
            && stderr.contains("--resume always"),
        "{stderr}"
    );
    assert!(run(&["--resume", "never"]).status.success());
    assert!(storage.path().join("done-2/run.json").is_file());

    // Run again as Ray Train v2 does: the same run goes on, with one more attempt.
    let resumed = run(&["--resume", "always"]);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let record = run_json(storage.path(), "done");
    assert_eq!(record["status"], "finished", "{record}");
    assert_eq!(record["attempts"].as_array().map(Vec::len), Some(2));
    // Refused before anything trained: it stays finished.
    let refused = run(&["--resume", "always", "-r", "CPU=100000"]);
    assert_eq!(
        refused.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let record = run_json(storage.path(), "done");
    assert_eq!(record["status"], "finished", "{record}");
    let attempts = record["attempts"].as_array().expect("attempts");
    assert!(
        attempts.iter().all(|a| a["ended_at"].is_number()),
        "{record}"
    );
}

#[test]
fn a_second_driver_of_a_running_run_is_refused_naming_the_first() {
    let storage = tempfile::tempdir().expect("tempdir");
    let run = |program: &[&str]| named_run(storage.path(), "busy", &[], program);
    let mut first = run(&["sh", "-c", "echo up; sleep 600"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("trainyard starts");
    let log = storage.path().join("busy/logs/attempt_0/rank_0.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log).is_ok_and(|text| text.contains(" up")) {
        assert!(
            Instant::now() < deadline,
            "the first run's worker never printed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = run(&["true"]).output().expect("trainyard runs");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    let expected = format!(
        "error: the run cannot start: run `busy` in `{}` is being run by process {} on this host (since ",
        storage.path().join("busy").display(),
        first.id()
    );
    assert!(
        stderr
            .lines()
            .next()
            .is_some_and(|l| l.starts_with(&expected)),
        "expected `{expected}…` in:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("kill -INT {}", first.id())),
        "{stderr}"
    );
    assert!(
        first.try_wait().expect("waitable").is_none(),
        "the first run goes on"
    );
    // Once the first is interrupted, the same command resumes the run.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(first.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT is sent");
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = first.try_wait().expect("waitable") {
            break status.code();
        }
        assert!(Instant::now() < deadline, "the first run stops on SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(130));
    let third = run(&["true"]).output().expect("trainyard runs");
    assert!(
        third.status.success(),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
}

#[test]
fn retention_keeps_exactly_the_two_best_and_the_latest() {
    let Some(python) = torch_python() else {
        return;
    };
    let storage = tempfile::tempdir().expect("tempdir");
    let dir = storage.path().display().to_string();
    let (ok, events, output) = finish(
        command("ckpt-keep", &dir, &[]),
        &[
            "--checkpoints-to-keep",
            "2",
            "--checkpoint-score",
            "val:max",
        ],
        &python,
    );
    assert!(ok, "{output}");
    assert_eq!(committed(&events), vec![1, 2, 3, 4, 5, 6]);
    let mut kept: Vec<String> = std::fs::read_dir(storage.path().join("ckpt-keep"))
        .expect("the run folder")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint_"))
        .collect();
    kept.sort();
    // val by epoch: 2, 4, 1, 3, 0, 2: the best are epochs 2 and 4; 6 is the latest.
    assert_eq!(
        kept,
        [
            "checkpoint_000002",
            "checkpoint_000004",
            "checkpoint_000006"
        ]
    );
    let succeeded = events
        .iter()
        .find(|e| e["event"] == "run_succeeded")
        .expect("run_succeeded");
    let best: Vec<u64> = succeeded["best_checkpoints"]
        .as_array()
        .expect("best_checkpoints")
        .iter()
        .filter_map(|c| c["index"].as_u64())
        .collect();
    assert_eq!(best[..2], [2, 4], "{succeeded}");
}
