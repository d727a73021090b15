//! Elastic runs on the local runtime: `-n 1:4` starts with the CPUs another run leaves free
//! and grows, from its checkpoint, as soon as that run ends (through a private ledger).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{LEDGER, MARKER, STORAGE, left_behind, root};
use serde_json::Value;
use trainyard_test_support::processes as common;
use trainyard_test_support::running::Running;

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

#[test]
fn an_elastic_run_starts_with_what_is_free_and_grows_from_its_checkpoint_when_room_appears() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = dir.path().join("ledger");
    let release = dir.path().join("release");
    let mark = "elastic-grows";

    // Another run holds two of the four CPUs until the test lets it go.
    let script = format!("while [ ! -e {} ]; do sleep 0.05; done", release.display());
    let mut other = Running::start(
        trainyard(&ledger, mark)
            .args(["-n", "2", "-r", "CPU=1", "--log-format", "json"])
            .args(["--", "sh", "-c", &script]),
    );
    other.expect_line(r#""event":"attempt_started""#, LIMIT);

    let mut elastic = Running::start(
        trainyard(&ledger, mark)
            .args(["-n", "1:4", "-r", "CPU=1", "--resize-interval", "2s"])
            .args(["--log-format", "json", "--name", "elastic"])
            .args(["--env", "ELASTIC_STEPS=40"])
            .args(["--", "python3", "crates/cli/tests/python/elastic.py"]),
    );
    let mut seen: Vec<(Instant, Value)> = Vec::new();
    loop {
        let (at, line) = elastic
            .next_line(LIMIT)
            .unwrap_or_else(|| panic!("no checkpoint committed; seen: {seen:?}"));
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
    let other = other.finish(LIMIT);
    assert!(
        other.status.success(),
        "the other run ends well: {}",
        other.stderr
    );
    let room = other.at;

    // Everything else the elastic run prints, to its end.
    let elastic = elastic.finish(LIMIT);
    let seen: Vec<(Instant, Value)> = elastic
        .lines
        .iter()
        .map(|(at, line)| {
            (
                *at,
                serde_json::from_str(line).expect("one JSON event per line"),
            )
        })
        .collect();
    assert!(
        elastic.status.success(),
        "the elastic run ends well: {}",
        elastic.stderr
    );
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
