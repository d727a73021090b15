//! Elastic runs on the local runtime: `-n 1:4` starts with the CPUs another run leaves free
//! and grows, from its checkpoint, as soon as that run ends (through a private ledger).

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{LEDGER, MARKER, STORAGE, left_behind, root};
use serde_json::Value;
use trainyard_test_support::processes as common;

const LIMIT: Duration = Duration::from_secs(120);

fn trainyard(ledger: &Path, mark: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .current_dir(root())
        .env(LEDGER, ledger)
        .env(STORAGE, ledger.with_file_name("results"))
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .args(["run", "--num-cpus", "4", "--backend", "none"])
        .args(["--env", &format!("{MARKER}={mark}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Every stdout line of `child` as it comes, with when it came.
fn lines(child: &mut Child) -> mpsc::Receiver<(Instant, String)> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for `child` to end, killing it after [`LIMIT`]; whether it succeeded and its stderr.
fn finish(mut child: Child) -> (bool, String) {
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_elastic_run_starts_with_what_is_free_and_grows_from_its_checkpoint_when_room_appears() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = dir.path().join("ledger");
    let release = dir.path().join("release");
    let mark = "elastic-grows";

    // Another run holds two of the four CPUs until the test lets it go.
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", release.display());
    let mut other = trainyard(&ledger, mark)
        .args(["-n", "2", "-r", "CPU=1", "--log-format", "json"])
        .args(["--", "sh", "-c", &script])
        .spawn()
        .expect("trainyard starts");
    let other_lines = lines(&mut other);
    let until_started = Instant::now() + LIMIT;
    loop {
        let (_, line) = other_lines
            .recv_timeout(until_started.saturating_duration_since(Instant::now()))
            .expect("the other run starts its tasks");
        if line.contains(r#""event":"attempt_started""#) {
            break;
        }
    }

    let mut elastic = trainyard(&ledger, mark)
        .args(["-n", "1:4", "-r", "CPU=1", "--resize-interval", "2s"])
        .args(["--log-format", "json", "--name", "elastic"])
        .args(["--env", "ELASTIC_STEPS=40"])
        .args(["--", "python3", "crates/cli/tests/python/elastic.py"])
        .spawn()
        .expect("trainyard starts");
    let events = lines(&mut elastic);
    let mut seen: Vec<(Instant, Value)> = Vec::new();
    loop {
        let (at, line) = events
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("no checkpoint committed; seen: {seen:?}"));
        let event: Value = serde_json::from_str(&line).expect("one JSON event per line");
        let committed = event["event"] == "checkpoint_committed";
        seen.push((at, event));
        if committed {
            break;
        }
    }
    let sizes: Vec<&Value> = seen
        .iter()
        .filter(|(_, e)| e["event"] == "attempt_started")
        .map(|(_, e)| &e["world_size"])
        .collect();
    assert_eq!(sizes, [2], "it starts at once with the two free CPUs");

    std::fs::write(&release, "").expect("release the other run");
    let (ok, stderr) = finish(other);
    assert!(ok, "the other run ends well: {stderr}");
    let room = Instant::now();

    // Everything else the elastic run prints, to its end.
    let (ok, stderr) = finish(elastic);
    seen.extend(events.try_iter().map(|(at, line)| {
        (
            at,
            serde_json::from_str(&line).expect("one JSON event per line"),
        )
    }));
    assert!(ok, "the elastic run ends well: {stderr}");
    let kinds = |kind: &str| -> Vec<&(Instant, Value)> {
        seen.iter().filter(|(_, e)| e["event"] == kind).collect()
    };
    let resized: Vec<&Value> = kinds("resized").into_iter().map(|(_, e)| e).collect();
    assert_eq!(resized.len(), 1, "{resized:?}");
    assert_eq!(
        (
            &resized[0]["from"],
            &resized[0]["to"],
            &resized[0]["reason"]
        ),
        (
            &Value::from(2),
            &Value::from(4),
            &Value::from("room_appeared")
        )
    );
    let attempts = kinds("attempt_started");
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[1].1["world_size"], 4);
    // Running on four: every rank of the second attempt has started its task.
    let second = attempts[1].0;
    let tasks: Vec<Instant> = kinds("task_started")
        .into_iter()
        .filter(|(at, _)| *at >= second)
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(tasks.len(), 4);
    let running = tasks.into_iter().max().expect("four tasks");
    let gap = running.saturating_duration_since(room);
    eprintln!("elastic: from the other run's exit to 4 ranks running: {gap:?}");
    assert!(
        gap <= Duration::from_secs(3),
        "it took {gap:?} to run on 4 after room appeared"
    );
    // Every rank of the second attempt sees four workers and the same restored step.
    let restored: Vec<(u64, String)> = kinds("log")
        .into_iter()
        .filter(|(at, _)| *at >= second)
        .filter_map(|(_, e)| {
            let line = e["line"].as_str()?;
            let rest = line.strip_prefix("rank ")?;
            let (rank, said) = rest.split_once(' ')?;
            if !said.starts_with("world_size") {
                return None;
            }
            Some((rank.parse().ok()?, said.to_owned()))
        })
        .collect();
    assert_eq!(restored.len(), 4, "{restored:?}");
    let step = restored[0].1.clone();
    assert!(
        step.starts_with("world_size 4 restored ") && !step.ends_with(" restored 0"),
        "{step}"
    );
    assert!(
        restored.iter().all(|(_, said)| *said == step),
        "{restored:?}"
    );
    let left = left_behind(mark, Duration::from_secs(10));
    assert!(left.is_empty(), "processes left behind: {left:?}");
}
