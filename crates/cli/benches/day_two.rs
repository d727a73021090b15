//! The day-two commands over a storage of 1 000 runs, through the `trainyard` binary as a user
//! runs it: `ps --all` (the whole process), the dashboard's runs list (`GET /api/runs` of a
//! running `trainyard dashboard`), and how long a line a rank prints takes to reach
//! `trainyard logs -f` (lag; targets: 200 ms, 300 ms, 200 ms).
#![allow(
    clippy::disallowed_methods,
    reason = "benches make scratch files of their own"
)]

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use trainyard_test_support::dashboard::{Dashboard, KillOnDrop};

const RUNS: usize = 1_000;
const TRAINYARD: &str = env!("CARGO_BIN_EXE_trainyard");

fn over_1000_runs(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("tempdir");
    trainyard_test_support::runs::write_runs(root.path(), RUNS);
    let mut group = c.benchmark_group("day_two");
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(20);

    group.bench_function("ps_all_1000_runs", |b| {
        b.iter(|| {
            let out = Command::new(TRAINYARD)
                .args(["ps", "--all", "--format", "json", "--storage"])
                .arg(root.path())
                .output()
                .expect("ps runs");
            assert!(out.status.success() && out.stdout.len() > RUNS * 100);
        });
    });

    let dashboard = Dashboard::start(TRAINYARD, root.path(), &[]);
    group.bench_function("dashboard_runs_list_1000_runs", |b| {
        b.iter(|| {
            let body = dashboard.get("/api/runs");
            assert!(body.len() > RUNS * 100, "{}", &body[..body.len().min(200)]);
        });
    });
    drop(dashboard);

    // A live run whose rank prints the time every 50 ms, followed by `logs -f`.
    let storage = tempfile::tempdir().expect("tempdir");
    let _run = KillOnDrop(
        Command::new(TRAINYARD)
            .args([
                "run",
                "-n",
                "1",
                "--backend",
                "none",
                "--name",
                "lag",
                "--storage",
            ])
            .arg(storage.path())
            .args([
                "--",
                "sh",
                "-c",
                "while :; do date +%s.%N; sleep 0.05; done",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the run starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !storage.path().join("lag").join("run.json").is_file() {
        assert!(Instant::now() < deadline, "the run did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut follower = KillOnDrop(
        Command::new(TRAINYARD)
            .args(["logs", "lag", "-f", "--storage"])
            .arg(storage.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("logs -f starts"),
    );
    let mut lines = BufReader::new(follower.0.stdout.take().expect("stdout")).lines();
    let mut lag = move || -> Duration {
        let line = lines.next().expect("a line").expect("text");
        let printed: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|stamp| stamp.parse().ok())
            .expect("a time");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        Duration::from_secs_f64((now - printed).max(0.0))
    };
    // What was printed before `logs -f` started comes at once: passed over.
    while lag() > Duration::from_millis(500) {}
    group.bench_function("logs_follow_lag", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| lag()).sum());
    });
    group.finish();
}

criterion_group!(benches, over_1000_runs);
criterion_main!(benches);
