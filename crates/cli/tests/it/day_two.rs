//! Looking at runs from another terminal: `trainyard ps` lists the live runs of a storage
//! (every run with `--all`), and `trainyard stop` stops one as Ctrl-C in its terminal would,
//! leaving it `stopped` and resumable.

use trainyard_test_support::processes as common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{MARKER, left_behind};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// `trainyard ARGS`, marked, with its own ledger, taking its storage from the environment.
fn trainyard(storage: &Path, mark: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .env("TRAINYARD_STORAGE", storage)
        .env(
            "TRAINYARD_LEDGER",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ledger-{mark}")),
        )
        .env("CI", "1")
        .env(MARKER, mark)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `trainyard SUBCOMMAND [ARGS] --storage STORAGE`, to its end.
fn day_two(storage: &Path, mark: &str, args: &[&str]) -> Output {
    trainyard(storage, mark)
        .args(args)
        .arg("--storage")
        .arg(storage)
        .output()
        .expect("trainyard runs")
}

/// `trainyard run -n 2 --name NAME -- sh -c SCRIPT`, in the background.
fn start(storage: &Path, mark: &str, name: &str, script: &str) -> Child {
    trainyard(storage, mark)
        .args(["run", "-n", "2", "--backend", "none", "--name", name])
        .args(["--", "sh", "-c", script])
        .spawn()
        .expect("trainyard starts")
}

fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The runs `ps --all --format json` shows, as (name, status).
fn statuses(storage: &Path, mark: &str) -> Vec<(String, String)> {
    let output = day_two(storage, mark, &["ps", "--all", "--format", "json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    rows.as_array()
        .expect("an array")
        .iter()
        .map(|row| {
            (
                row["name"].as_str().unwrap_or_default().to_owned(),
                row["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Waits up to 30 s until `ps` shows run `name` with `status`.
fn until_shown(storage: &Path, mark: &str, name: &str, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = statuses(storage, mark);
        if shown.iter().any(|(n, s)| n == name && s == status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run `{name}` never showed as {status}: {shown:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to `limit` for `child` to exit; its output.
fn finished(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let deadline = Instant::now() + limit;
    let waiter = std::thread::spawn(move || child.wait_with_output().expect("wait"));
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            let _ = kill(
                Pid::from_raw(i32::try_from(pid).expect("a pid")),
                Signal::SIGKILL,
            );
            panic!("the driver did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().expect("the waiter")
}

#[test]
fn ps_lists_the_live_runs_and_stop_ends_one_that_stays_resumable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-stop";
    let done = trainyard(&storage, mark)
        .args([
            "run",
            "-n",
            "1",
            "--backend",
            "none",
            "--name",
            "done",
            "--",
            "true",
        ])
        .output()
        .expect("trainyard runs");
    assert_eq!(done.status.code(), Some(0), "{}", text(&done));
    let empty = day_two(&storage, mark, &["ps"]);
    assert_eq!(
        String::from_utf8_lossy(&empty.stdout).lines().next(),
        Some(
            format!(
                "no live runs in {} (1 ended: trainyard ps --all)",
                storage.display()
            )
            .as_str()
        ),
        "{}",
        text(&empty)
    );

    let live = start(&storage, mark, "live", "echo up; sleep 300");
    until_shown(&storage, mark, "live", "running");
    let listed = day_two(&storage, mark, &["ps"]);
    let table = String::from_utf8_lossy(&listed.stdout).into_owned();
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("STATUS"),
        "{table}"
    );
    assert_eq!(lines.len(), 2, "only the live run: {table}");
    assert!(
        lines[1].starts_with("live ") && lines[1].contains(" running "),
        "{table}"
    );
    assert_eq!(
        statuses(&storage, mark),
        [
            ("live".to_owned(), "running".to_owned()),
            ("done".to_owned(), "finished".to_owned())
        ],
        "newest first"
    );

    let stop = day_two(&storage, mark, &["stop", "live"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    assert!(
        String::from_utf8_lossy(&stop.stderr).starts_with("trainyard: run `live` stopped in "),
        "{}",
        text(&stop)
    );
    let driver = finished(live, Duration::from_secs(30));
    assert_eq!(driver.status.code(), Some(130), "{}", text(&driver));
    assert_eq!(
        statuses(&storage, mark)[0],
        ("live".to_owned(), "stopped".to_owned())
    );
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());

    let again = day_two(&storage, mark, &["stop", "live"]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert_eq!(
        String::from_utf8_lossy(&again.stderr).trim_end(),
        "trainyard: run `live` is not running: it is stopped"
    );
    let unknown = day_two(&storage, mark, &["stop", "nope"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown));
    assert!(
        String::from_utf8_lossy(&unknown.stderr)
            .starts_with("error: invalid value `nope` for `NAME`: no run of this name in "),
        "{}",
        text(&unknown)
    );

    // A stopped run is resumed by the same name: its record goes on.
    let resumed = trainyard(&storage, mark)
        .args([
            "run",
            "-n",
            "2",
            "--backend",
            "none",
            "--name",
            "live",
            "--",
            "true",
        ])
        .output()
        .expect("trainyard runs");
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(storage.join("live").join("run.json")).expect("run.json"),
    )
    .expect("JSON");
    assert_eq!(record["status"], "finished");
}

#[test]
fn stop_now_kills_workers_that_ignore_the_interrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-stop-now";
    // Each rank says when it ignores the interrupt: a stop before that would end it at once.
    let ready = dir.path().join("ready");
    std::fs::create_dir(&ready).expect("a folder");
    let live = start(
        &storage,
        mark,
        "stubborn",
        &format!(
            "trap '' TERM INT; touch {}/$TRAINYARD_WORLD_RANK; while :; do sleep 0.1; done",
            ready.display()
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut live = Some(live);
    while std::fs::read_dir(&ready).map_or(0, Iterator::count) < 2 {
        if Instant::now() > deadline {
            let mut driver = live.take().expect("the driver");
            let _ = driver.kill();
            let driver = driver.wait_with_output().expect("its output");
            panic!("the ranks never started: {}", text(&driver));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let live = live.expect("the driver");
    until_shown(&storage, mark, "stubborn", "running");
    let stop = day_two(&storage, mark, &["stop", "stubborn", "--now"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let driver = finished(live, Duration::from_secs(30));
    assert!(
        String::from_utf8_lossy(&driver.stderr).contains("interrupted again: killing the workers"),
        "{}",
        text(&driver)
    );
    assert_eq!(
        statuses(&storage, mark),
        [("stubborn".to_owned(), "stopped".to_owned())]
    );
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());
}

#[test]
fn a_driver_killed_without_a_word_is_shown_lost_and_not_live() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-lost";
    let mut live = start(&storage, mark, "orphan", "echo up; sleep 300");
    until_shown(&storage, mark, "orphan", "running");
    live.kill().expect("SIGKILL the driver");
    live.wait().expect("reaped");
    assert_eq!(
        statuses(&storage, mark),
        [("orphan".to_owned(), "lost".to_owned())]
    );
    let listed = day_two(&storage, mark, &["ps"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).starts_with("no live runs in "),
        "{}",
        text(&listed)
    );
    let stop = day_two(&storage, mark, &["stop", "orphan"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    assert!(
        String::from_utf8_lossy(&stop.stderr).contains("is gone without a word"),
        "{}",
        text(&stop)
    );
    // The workers go with their driver.
    assert!(left_behind(mark, Duration::from_secs(15)).is_empty());
}

#[test]
fn every_report_is_kept_and_ps_and_show_read_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-show";
    let script = "from trainyard import train\nfor step in range(3):\n    train.report({'step': step, 'loss': 1 / (step + 1)})\n";
    let run = trainyard(&storage, mark)
        .args(["run", "-n", "2", "--backend", "none", "--name", "reports"])
        .args(["--", "python3", "-c", script])
        .output()
        .expect("trainyard runs");
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));

    let listed = day_two(&storage, mark, &["ps", "--all"]);
    let table = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        table.lines().next().is_some_and(|h| h.ends_with("METRICS")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|row| row.ends_with("loss=0.3333 step=2")),
        "rank 0's latest report: {table}"
    );

    let shown = day_two(&storage, mark, &["show", "reports", "--format", "json"]);
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    assert_eq!(shown["status"], "finished");
    assert_eq!(shown["record"]["name"], "reports");
    let entries = shown["metrics"].as_array().expect("the history");
    assert_eq!(entries.len(), 6, "every report of both ranks: {entries:?}");
    for rank in [0, 1] {
        let steps: Vec<i64> = entries
            .iter()
            .filter(|e| e["rank"] == rank)
            .map(|e| {
                assert_eq!(
                    (e["attempt"].as_i64(), e["world_size"].as_i64()),
                    (Some(0), Some(2))
                );
                e["metrics"]["step"].as_i64().expect("a step")
            })
            .collect();
        assert_eq!(steps, [0, 1, 2], "rank {rank}");
    }
    let text_out = day_two(&storage, mark, &["show", "reports"]);
    let shown = String::from_utf8_lossy(&text_out.stdout).into_owned();
    assert!(shown.starts_with("run reports: finished\n"), "{shown}");
    assert!(
        shown.contains("metrics: 6 reports (3 of rank 0)"),
        "{shown}"
    );
    assert!(
        shown
            .lines()
            .any(|line| line.trim_start().starts_with("loss ") && line.contains('█')),
        "a chart of the loss: {shown}"
    );
}
