//! Looking at runs from another terminal: `trainyard ps` lists the live runs of a storage
//! (every run with `--all`), and `trainyard stop` stops one as Ctrl-C in its terminal would,
//! leaving it `stopped` and resumable.

use trainyard_test_support::processes as common;

use std::path::{Path, PathBuf};
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
    let json = day_two(&storage, mark, &["stop", "live", "--format", "json"]);
    let said: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(
        (&said["name"], &said["status"], &said["seconds"]),
        (
            &serde_json::json!("live"),
            &serde_json::json!("stopped"),
            &serde_json::Value::Null
        ),
        "{said}"
    );
    for outside in ["..", "../runs/live", "a/b"] {
        let refused = day_two(&storage, mark, &["show", outside]);
        assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
        assert!(
            String::from_utf8_lossy(&refused.stderr).starts_with(&format!(
                "error: invalid value `{outside}` for `NAME`: run name `{outside}` must be"
            )),
            "{}",
            text(&refused)
        );
    }
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
            .is_some_and(|row| row.ends_with("step=2 loss=0.3333")),
        "rank 0's latest report, its keys in the order reported: {table}"
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
        shown.lines().any(|line| line.starts_with("  command     ")
            && line.ends_with(r#" run -n 2 --backend none --name reports -- python3 -c "from trainyard import train\nfor step in range(3):\n    train.report({'step': step, 'loss': 1 / (step + 1)})\n""#)),
        "the driver's command line, as a shell takes it back: {shown}"
    );
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

/// A driver in the background, killed if a test fails before it ends.
struct Driver(Option<Child>);

impl Driver {
    fn start(storage: &Path, mark: &str, name: &str, flags: &[&str], script: &str) -> Self {
        Self(Some(
            trainyard(storage, mark)
                .args(["run", "-n", "2", "--backend", "none", "--name", name])
                .args(flags)
                .args(["--", "sh", "-c", script])
                .spawn()
                .expect("trainyard starts"),
        ))
    }

    /// Waits up to `limit` for it to exit; its output.
    fn finished(mut self, limit: Duration) -> Output {
        finished(self.0.take().expect("a driver"), limit)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `trainyard SUBCOMMAND [ARGS] --storage STORAGE`, in the background.
fn day_two_spawned(storage: &Path, mark: &str, args: &[&str]) -> Driver {
    Driver(Some(
        trainyard(storage, mark)
            .args(args)
            .arg("--storage")
            .arg(storage)
            .spawn()
            .expect("trainyard starts"),
    ))
}

#[test]
fn logs_merge_the_ranks_by_time_and_follow_a_live_run_into_its_restart_and_to_its_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-logs";
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).expect("a folder");
    // Attempt 0: each rank says so and rank 1 fails. Attempt 1: rank 0 prints m1 and m3,
    // rank 1 prints m2 between them.
    let script = format!(
        r#"R=$TRAINYARD_WORLD_RANK
if [ ! -e {flags}/$R ]; then
  touch {flags}/$R; echo "first $R"; sleep 1
  [ "$R" = 1 ] && exit 1; sleep 30
fi
sleep 1
if [ "$R" = 0 ]; then echo m1; sleep 0.6; echo m3; else sleep 0.3; echo m2 >&2; fi"#,
        flags = flags.display()
    );
    let run = Driver::start(&storage, mark, "logged", &["--max-failures", "1"], &script);
    until_shown(&storage, mark, "logged", "running");
    let follower = day_two_spawned(&storage, mark, &["logs", "logged", "-f"]);
    let run = run.finished(Duration::from_secs(60));
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    let followed = follower.finished(Duration::from_secs(10));
    assert_eq!(followed.status.code(), Some(0), "{}", text(&followed));
    let stdout = String::from_utf8_lossy(&followed.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    for expected in ["(rank=0) first 0", "(rank=1) first 1"] {
        assert!(lines.contains(&expected), "{expected}: {}", text(&followed));
    }
    let ends: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|line| line.ends_with(" m1") || line.ends_with(" m2") || line.ends_with(" m3"))
        .collect();
    assert_eq!(
        ends,
        ["(rank=0) m1", "(rank=1) m2", "(rank=0) m3"],
        "the restarted attempt's lines, merged by time: {}",
        text(&followed)
    );
    assert!(
        String::from_utf8_lossy(&followed.stderr)
            .contains("trainyard: attempt 1 of run `logged` started"),
        "{}",
        text(&followed)
    );

    // A finished run: the latest attempt by default, another one by --attempt, one rank by
    // --rank, JSON with the time of every line.
    let latest = day_two(&storage, mark, &["logs", "logged"]);
    assert_eq!(latest.status.code(), Some(0), "{}", text(&latest));
    assert_eq!(
        String::from_utf8_lossy(&latest.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["(rank=0) m1", "(rank=1) m2", "(rank=0) m3"]
    );
    assert_eq!(
        String::from_utf8_lossy(&latest.stderr).lines().next(),
        Some("trainyard: attempt 1 of run `logged` (attempts 0 to 1; --attempt K shows another)")
    );
    let first = day_two(
        &storage,
        mark,
        &[
            "logs",
            "logged",
            "--attempt",
            "0",
            "--rank",
            "1",
            "--format",
            "json",
        ],
    );
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let objects: Vec<serde_json::Value> = String::from_utf8_lossy(&first.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object a line"))
        .collect();
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(
        (
            &objects[0]["line"],
            &objects[0]["rank"],
            &objects[0]["attempt"],
            &objects[0]["stream"]
        ),
        (
            &serde_json::json!("first 1"),
            &serde_json::json!(1),
            &serde_json::json!(0),
            &serde_json::json!("stdout")
        )
    );
    assert!(
        objects[0]["time"].as_f64().is_some_and(|t| t > 1.7e9),
        "{objects:?}"
    );
    let beyond = day_two(&storage, mark, &["logs", "logged", "--attempt", "2"]);
    assert_eq!(beyond.status.code(), Some(2), "{}", text(&beyond));
    assert_eq!(
        String::from_utf8_lossy(&beyond.stderr).trim_end(),
        "error: invalid value `2` for `--attempt`: run `logged` has 2 attempts (0 to 1)"
    );
    let last = day_two(&storage, mark, &["logs", "logged", "--tail", "2"]);
    assert_eq!(
        String::from_utf8_lossy(&last.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["(rank=1) m2", "(rank=0) m3"]
    );
    let no_rank = day_two(&storage, mark, &["logs", "logged", "--rank", "2"]);
    assert_eq!(no_rank.status.code(), Some(2), "{}", text(&no_rank));
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());
}

#[test]
fn stacks_prints_a_live_runs_stacks_and_the_run_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-stacks";
    let run = Driver::start(&storage, mark, "looked-at", &[], "echo up; sleep 300");
    until_shown(&storage, mark, "looked-at", "running");
    let stacks = day_two(&storage, mark, &["stacks", "looked-at"]);
    assert_eq!(stacks.status.code(), Some(0), "{}", text(&stacks));
    let dump = String::from_utf8_lossy(&stacks.stdout).into_owned();
    for rank in ["=== rank 0 ===", "=== rank 1 ==="] {
        assert!(dump.contains(rank), "{rank}: {dump}");
    }
    assert!(
        String::from_utf8_lossy(&stacks.stderr).starts_with("trainyard: the stacks are kept in "),
        "{}",
        text(&stacks)
    );
    assert_eq!(statuses(&storage, mark)[0].1, "running", "the run goes on");
    let json = day_two(&storage, mark, &["stacks", "looked-at", "--format", "json"]);
    assert_eq!(json.status.code(), Some(0), "{}", text(&json));
    let dump: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert!(
        dump["text"]
            .as_str()
            .is_some_and(|t| t.contains("=== rank 0 ==="))
            && dump["file"].is_string(),
        "{dump}"
    );

    let stop = day_two(&storage, mark, &["stop", "looked-at"]);
    assert_eq!(stop.status.code(), Some(0), "{}", text(&stop));
    let run = run.finished(Duration::from_secs(30));
    assert!(
        String::from_utf8_lossy(&run.stderr)
            .contains("trainyard: every rank's stacks (SIGQUIT; the run goes on):"),
        "{}",
        text(&run)
    );
    let ended = day_two(&storage, mark, &["stacks", "looked-at"]);
    assert_eq!(ended.status.code(), Some(1), "{}", text(&ended));
    assert_eq!(
        String::from_utf8_lossy(&ended.stderr).trim_end(),
        "error: run `looked-at` is not running: it is stopped"
    );
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());
}

#[test]
fn logs_of_an_s3_run_are_read_from_its_folder_once_the_local_copy_is_gone() {
    let Some(server) = trainyard_checkpoint::testing::S3Server::start().expect("moto starts")
    else {
        return;
    };
    server.create_bucket("day-two").expect("a bucket");
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = Path::new("s3://day-two/runs");
    let mark = "day-two-s3-logs";
    let run = trainyard(storage, mark)
        .envs(server.env())
        .args(["run", "-n", "2", "--backend", "none", "--name", "remote"])
        .args(["--", "sh", "-c", "echo hello $TRAINYARD_WORLD_RANK"])
        .output()
        .expect("trainyard runs");
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    let shown = trainyard(storage, mark)
        .envs(server.env())
        .args(["show", "remote", "--format", "json"])
        .output()
        .expect("trainyard runs");
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown));
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    let written = shown["record"]["attempts"][0]["log_dir"]
        .as_str()
        .expect("the record names where the logs were written")
        .to_owned();
    assert!(
        Path::new(&written).join("rank_1.log").is_file(),
        "{written}"
    );
    std::fs::remove_dir_all(&written).expect("the local copy removed");
    let logs = trainyard(storage, mark)
        .envs(server.env())
        .env("TMPDIR", dir.path())
        .args(["logs", "remote"])
        .output()
        .expect("trainyard runs");
    assert_eq!(logs.status.code(), Some(0), "{}", text(&logs));
    let mut lines: Vec<String> = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    assert_eq!(lines, ["(rank=0) hello 0", "(rank=1) hello 1"]);
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("the temp dir").count(),
        0,
        "the download is removed"
    );
}

#[test]
fn a_detached_run_goes_on_in_the_background_and_a_refused_one_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-detach";
    let detached = trainyard(&storage, mark)
        .args([
            "run",
            "-n",
            "2",
            "--backend",
            "none",
            "--name",
            "bg",
            "--detach",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "echo up $TRAINYARD_WORLD_RANK; sleep 2; echo done $TRAINYARD_WORLD_RANK",
        ])
        .output()
        .expect("trainyard runs");
    assert_eq!(detached.status.code(), Some(0), "{}", text(&detached));
    assert_eq!(String::from_utf8_lossy(&detached.stdout), "bg\n");
    let said = String::from_utf8_lossy(&detached.stderr).into_owned();
    assert!(
        said.starts_with("trainyard: run `bg` goes on in the background (driver pid "),
        "{said}"
    );
    assert!(
        said.contains("\n  follow it:  trainyard logs bg -f\n"),
        "{said}"
    );
    assert_eq!(
        statuses(&storage, mark),
        [("bg".to_owned(), "running".to_owned())]
    );

    let followed =
        day_two_spawned(&storage, mark, &["logs", "bg", "-f"]).finished(Duration::from_secs(30));
    assert_eq!(followed.status.code(), Some(0), "{}", text(&followed));
    let lines = String::from_utf8_lossy(&followed.stdout).into_owned();
    for expected in ["(rank=0) up 0", "(rank=1) done 1"] {
        assert!(
            lines.lines().any(|line| line == expected),
            "{expected}: {lines}"
        );
    }
    until_shown(&storage, mark, "bg", "finished");
    let outputs: Vec<PathBuf> = std::fs::read_dir(storage.join("bg"))
        .expect("the run folder")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("driver-"))
        })
        .collect();
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    // The record says finished a moment before the driver says so.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let output = std::fs::read_to_string(&outputs[0]).expect("the driver's output");
        if output.contains("trainyard: the run succeeded") {
            break;
        }
        assert!(Instant::now() < deadline, "{output}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Refused: the driver's word and its exit code, and no file or folder left.
    let refused = trainyard(&storage, mark)
        .args([
            "run",
            "-n",
            "64",
            "--backend",
            "none",
            "--name",
            "too-big",
            "--detach",
            "--",
            "true",
        ])
        .output()
        .expect("trainyard runs");
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(
        said.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{said}"
    );
    assert!(
        said.contains("error: the run cannot start: the workers cannot be scheduled"),
        "{said}"
    );
    let mut left: Vec<String> = std::fs::read_dir(&storage)
        .expect("the storage")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["bg"]);
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());
}

#[test]
fn a_driver_interrupted_twice_records_its_run_as_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-twice";
    let ready = dir.path().join("ready");
    std::fs::create_dir(&ready).expect("a folder");
    let script = format!(
        "trap '' TERM INT; touch {}/$TRAINYARD_WORLD_RANK; while :; do sleep 0.1; done",
        ready.display()
    );
    let run = Driver::start(&storage, mark, "twice", &[], &script);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&ready).map_or(0, Iterator::count) < 2 {
        assert!(Instant::now() < deadline, "the ranks never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = Pid::from_raw(i32::try_from(run.0.as_ref().expect("a driver").id()).expect("a pid"));
    kill(pid, Signal::SIGINT).expect("interrupted");
    std::thread::sleep(Duration::from_millis(500));
    kill(pid, Signal::SIGINT).expect("interrupted again");
    let ended = run.finished(Duration::from_secs(30));
    assert_eq!(ended.status.code(), Some(130), "{}", text(&ended));
    assert!(
        String::from_utf8_lossy(&ended.stderr).contains("interrupted again: killing the workers"),
        "{}",
        text(&ended)
    );
    assert_eq!(
        statuses(&storage, mark),
        [("twice".to_owned(), "interrupted".to_owned())]
    );
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());
}

/// The Python of a venv with TensorBoard (`scripts/tensorboard-env.sh`): `None`, after saying
/// why, when there is none (a failure under `CI=true` unless `TRAINYARD_TENSORBOARD_SKIP`
/// says why).
fn tensorboard_python() -> Option<String> {
    if let Some(python) = std::env::var("TRAINYARD_TENSORBOARD_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
    {
        return Some(python);
    }
    let reason = std::env::var("TRAINYARD_TENSORBOARD_SKIP").unwrap_or_default();
    assert!(
        std::env::var("CI").as_deref() != Ok("true") || !reason.is_empty(),
        "TRAINYARD_TENSORBOARD_PYTHON is not set (scripts/tensorboard-env.sh prints it), and CI did not say why (TRAINYARD_TENSORBOARD_SKIP)"
    );
    eprintln!(
        "SKIP: reading TensorBoard event files back: {}",
        if reason.is_empty() {
            "TRAINYARD_TENSORBOARD_PYTHON is not set (scripts/tensorboard-env.sh)"
        } else {
            &reason
        }
    );
    None
}

#[test]
fn tensorboard_reads_rank_0s_metrics_from_the_event_files() {
    let Some(python) = tensorboard_python() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let events = dir.path().join("tb");
    let mark = "day-two-tensorboard";
    let script = "import os\nfrom trainyard import train\nrank = int(os.environ['TRAINYARD_WORLD_RANK'])\nfor step in range(5):\n    train.report({'loss': 1 / (step + 1) + rank, 'phase': 'train'})\n";
    let run = trainyard(&storage, mark)
        .args(["run", "-n", "2", "--backend", "none", "--name", "boarded"])
        .arg("--tensorboard")
        .arg(&events)
        .args(["--", "python3", "-c", script])
        .output()
        .expect("trainyard runs");
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    let read = Command::new(python)
        .args([
            "-c",
            "import json, sys\nfrom tensorboard.backend.event_processing.event_accumulator import EventAccumulator\nevents = EventAccumulator(sys.argv[1])\nevents.Reload()\nprint(json.dumps({tag: [[e.step, e.value] for e in events.Scalars(tag)] for tag in events.Tags()['scalars']}))",
        ])
        .arg(&events)
        .output()
        .expect("python runs");
    assert!(read.status.success(), "{}", text(&read));
    let scalars: serde_json::Value = serde_json::from_slice(&read.stdout).expect("JSON");
    let loss: Vec<(u64, f64)> = scalars["loss"]
        .as_array()
        .expect("a loss series")
        .iter()
        .map(|point| {
            (
                point[0].as_u64().expect("a step"),
                point[1].as_f64().expect("a value"),
            )
        })
        .collect();
    let expected: Vec<(u64, f64)> = (0..5u32)
        .map(|step| (u64::from(step) + 1, 1.0 / f64::from(step + 1)))
        .collect();
    assert_eq!(
        loss.len(),
        expected.len(),
        "rank 0's reports only: {scalars}"
    );
    for ((step, value), (want_step, want)) in loss.iter().zip(&expected) {
        assert_eq!(step, want_step, "{scalars}");
        assert!((value - want).abs() < 1e-6, "{scalars}");
    }
    assert_eq!(
        scalars.as_object().map(|tags| tags.len()),
        Some(1),
        "only numbers are scalars: {scalars}"
    );
}

/// A webhook on loopback: every JSON body POSTed to it, in order.
fn webhook() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let url = format!(
        "http://{}/hook",
        listener.local_addr().expect("its address")
    );
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = std::sync::Arc::clone(&bodies);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let kept = std::sync::Arc::clone(&kept);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("a clone"));
                let mut stream = stream;
                // Requests one after another on a kept-alive connection.
                loop {
                    let mut length = 0;
                    let mut first = true;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let line = line.trim_end();
                        if line.is_empty() && !first {
                            break;
                        }
                        first = false;
                        if let Some((name, value)) = line.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    if let Ok(value) = serde_json::from_slice(&body) {
                        kept.lock().expect("the bodies").push(value);
                    }
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
                }
            });
        }
    });
    (url, bodies)
}

#[test]
fn notify_posts_each_change_of_state_and_the_end_to_a_webhook() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-notify";
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).expect("a folder");
    let (url, bodies) = webhook();
    let script = format!(
        "[ -e {flags}/$TRAINYARD_WORLD_RANK ] || {{ touch {flags}/$TRAINYARD_WORLD_RANK; [ $TRAINYARD_WORLD_RANK = 1 ] && exit 1; sleep 30; }}; true",
        flags = flags.display()
    );
    let run = trainyard(&storage, mark)
        .args(["run", "-n", "2", "--backend", "none", "--name", "notified"])
        .args(["--max-failures", "1", "--notify", &url])
        .args(["--", "sh", "-c", &script])
        .output()
        .expect("trainyard runs");
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    let events: Vec<(String, String)> = bodies
        .lock()
        .expect("the bodies")
        .iter()
        .map(|body| {
            assert!(body["time"].as_f64().is_some(), "{body}");
            (
                body["run"].as_str().unwrap_or_default().to_owned(),
                body["event"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        "attempt_started",
        "restarting",
        "attempt_started",
        "run_succeeded",
    ]
    .map(|event| ("notified".to_owned(), event.to_owned()))
    .to_vec();
    assert_eq!(events, expected);

    let refused = trainyard(&storage, mark)
        .args([
            "run",
            "-n",
            "1",
            "--backend",
            "none",
            "--notify",
            "ftp://x",
            "--",
            "true",
        ])
        .output()
        .expect("trainyard runs");
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim_end(),
        "error: invalid value `ftp://x` for `--notify`: expected an http:// or https:// URL"
    );
    assert!(left_behind(mark, Duration::from_secs(10)).is_empty());
}

#[test]
fn a_run_leased_by_a_driver_on_another_host_is_running_until_the_lease_goes_stale() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-lease";
    let run = |name: &str| {
        trainyard(&storage, mark)
            .args([
                "run",
                "-n",
                "1",
                "--backend",
                "none",
                "--name",
                name,
                "--",
                "true",
            ])
            .output()
            .expect("trainyard runs")
    };
    let first = run("leased");
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert!(
        storage.join("leased").join("lease.json").is_file(),
        "the driver held a lease"
    );
    // As a driver on another host would have left it, alive.
    let record_file = storage.join("leased").join("run.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record_file).expect("run.json")).expect("JSON");
    record["status"] = serde_json::json!("running");
    record["driver"]["host"] = serde_json::json!("elsewhere");
    record["driver"]["pid"] = serde_json::json!(1);
    std::fs::write(&record_file, serde_json::to_vec(&record).expect("JSON")).expect("written");
    let lease = |age: f64| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let lease = serde_json::json!({"host": "elsewhere", "pid": 1, "renewed_at": now - age});
        std::fs::write(
            storage.join("leased").join("lease.json"),
            serde_json::to_vec(&lease).expect("JSON"),
        )
        .expect("written");
    };
    lease(0.0);
    assert_eq!(
        statuses(&storage, mark),
        [("leased".to_owned(), "running".to_owned())]
    );
    let refused = run("leased");
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    let said = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(
        said.starts_with("error: the run cannot start: run `leased` in `")
            && said.contains("` is being run by process 1 on host elsewhere (its lease was renewed 0s ago); stop it there (trainyard stop leased), or choose another name"),
        "{said}"
    );
    let stop = day_two(&storage, mark, &["stop", "leased"]);
    assert_eq!(stop.status.code(), Some(1), "{}", text(&stop));
    assert_eq!(
        String::from_utf8_lossy(&stop.stderr).trim_end(),
        "error: run `leased` is driven on host elsewhere (pid 1): stop it there"
    );

    // Not renewed for a minute: the driver is gone, and the same command resumes the run.
    lease(60.0);
    assert_eq!(
        statuses(&storage, mark),
        [("leased".to_owned(), "lost".to_owned())]
    );
    let resumed = run("leased");
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    assert_eq!(
        statuses(&storage, mark),
        [("leased".to_owned(), "finished".to_owned())]
    );
}

#[test]
fn stacks_never_sends_sigquit_to_a_driver_that_does_not_take_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = dir.path().join("runs");
    let mark = "day-two-sigquit";
    let done = trainyard(&storage, mark)
        .args([
            "run",
            "-n",
            "1",
            "--backend",
            "none",
            "--name",
            "library",
            "--",
            "true",
        ])
        .output()
        .expect("trainyard runs");
    assert_eq!(done.status.code(), Some(0), "{}", text(&done));
    // A program of its own drives the run (as a library user's would): SIGQUIT would kill it.
    let mut program = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep starts");
    let pid = program.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("its stat");
    let start_ticks: u64 = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(19))
        .and_then(|ticks| ticks.parse().ok())
        .expect("its start time");
    let record_file = storage.join("library").join("run.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record_file).expect("run.json")).expect("JSON");
    record["status"] = serde_json::json!("running");
    record["driver"]["pid"] = serde_json::json!(pid);
    record["driver"]["start_ticks"] = serde_json::json!(start_ticks);
    std::fs::write(&record_file, serde_json::to_vec(&record).expect("JSON")).expect("written");
    let stacks = day_two(&storage, mark, &["stacks", "library"]);
    let alive = program.try_wait().expect("try_wait").is_none();
    let _ = program.kill();
    let _ = program.wait();
    assert_eq!(stacks.status.code(), Some(1), "{}", text(&stacks));
    assert_eq!(
        String::from_utf8_lossy(&stacks.stderr).trim_end(),
        format!(
            "error: the driver of run `library` (pid {pid}) does not take SIGQUIT for stacks: it is a program of its own, not `trainyard run`"
        )
    );
    assert!(alive, "the program was not signalled");
}
