//! Concurrent `trainyard run`s on one machine through a private ledger per test (GPUs faked
//! with `--num-gpus 2`), and `plan` placing on a cluster as `run` then does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{LEDGER, MARKER, STORAGE, left_behind};
use trainyard_test_support::processes as common;

const LIMIT: Duration = Duration::from_secs(120);

fn trainyard(ledger: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    command
        .env(LEDGER, ledger)
        // The run folders beside the ledger, in the test's temporary directory.
        .env(STORAGE, ledger.with_file_name("results"))
        .env("CI", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `trainyard run --num-gpus 2 ARGS -- sh -c SCRIPT`, marked with `mark`.
fn start_run(ledger: &Path, mark: &str, args: &[&str], script: &str) -> Child {
    trainyard(ledger)
        .args([
            "run",
            "--num-gpus",
            "2",
            "--num-cpus",
            "4",
            "--memory",
            "4GB",
        ])
        .args(["--backend", "none", "--env", &format!("{MARKER}={mark}")])
        .args(args)
        .args(["--", "sh", "-c", script])
        .spawn()
        .expect("trainyard starts")
}

fn finish(mut child: Child) -> Output {
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "trainyard did not finish: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until the ledger at `ledger` holds a run with `pid`.
fn wait_for_holder(ledger: &Path, pid: u32) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = trainyard(ledger)
            .args(["cluster", "--format", "json", "--num-gpus", "2"])
            .output()
            .expect("cluster runs");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        if json["runs"]
            .as_array()
            .is_some_and(|runs| runs.iter().any(|r| r["pid"] == pid))
        {
            return;
        }
        assert!(Instant::now() < deadline, "run {pid} never held anything");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gpus_of(output: &Output) -> Vec<String> {
    let mut gpus: Vec<String> = text(&output.stdout)
        .lines()
        .filter_map(|l| l.split("gpu=").nth(1).map(str::to_owned))
        .collect();
    gpus.sort();
    gpus
}

/// `n` workers with a GPU each, strictly spread over two virtual nodes, to the end.
fn spread_run(ledger: &Path, mark: &str, n: &str, script: &str) -> Output {
    let args = ["--nodes", "2", "-n", n, "--use-gpu", "-s", "STRICT_SPREAD"];
    finish(start_run(ledger, mark, &args, script))
}

fn ledger_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger");
    (dir, path)
}

#[test]
fn two_concurrent_runs_asking_for_one_gpu_each_get_different_devices() {
    let (_dir, ledger) = ledger_dir();
    let mark = format!("two-gpus-{}", std::process::id());
    let script = "echo gpu=$CUDA_VISIBLE_DEVICES; sleep 2";
    let args = ["--use-gpu", "-r", "CPU=1,GPU=1"];
    let a = start_run(&ledger, &mark, &args, script);
    let b = start_run(&ledger, &mark, &args, script);
    let (a, b) = (finish(a), finish(b));
    assert!(
        a.status.success() && b.status.success(),
        "{} {}",
        text(&a.stderr),
        text(&b.stderr)
    );
    let mut both = [gpus_of(&a), gpus_of(&b)].concat();
    both.sort();
    assert_eq!(both, ["0", "1"], "each run has its own GPU");
    assert!(left_behind(&mark, Duration::from_secs(10)).is_empty());
}

#[test]
fn a_second_run_waits_for_the_holder_and_no_wait_fails_naming_it() {
    let (_dir, ledger) = ledger_dir();
    let mark = format!("wait-{}", std::process::id());
    let holder = start_run(
        &ledger,
        &mark,
        &[
            "-n",
            "2",
            "--use-gpu",
            "-r",
            "CPU=1,GPU=1,memory=1GB",
            "--name",
            "gpu-holder",
        ],
        "echo gpu=$CUDA_VISIBLE_DEVICES; sleep 3",
    );
    let holder_pid = holder.id();
    wait_for_holder(&ledger, holder_pid);

    let eager = finish(start_run(
        &ledger,
        &mark,
        &["--use-gpu", "--no-wait"],
        "true",
    ));
    let stderr = text(&eager.stderr);
    assert_eq!(eager.status.code(), Some(3), "{stderr}");
    // Other runs see the holder by the name it was given.
    assert!(
        stderr.contains(&format!("run `gpu-holder` (pid {holder_pid}) holds")),
        "{stderr}"
    );
    assert!(stderr.contains("GPU=1 is not free"), "{stderr}");

    let started = Instant::now();
    let waiter = start_run(
        &ledger,
        &mark,
        &["--use-gpu"],
        "echo gpu=$CUDA_VISIBLE_DEVICES",
    );
    let third = start_run(&ledger, &mark, &["-r", "CPU=2"], "echo cpu-only");
    let (holder, waiter, third) = (finish(holder), finish(waiter), finish(third));
    assert!(holder.status.success(), "{}", text(&holder.stderr));
    assert_eq!(gpus_of(&holder), ["0", "1"]);
    let waited = text(&waiter.stderr);
    assert!(waiter.status.success(), "{waited}");
    assert!(
        waited.contains("waiting for other runs on this machine: GPU=1 is not free")
            && waited.contains(&format!("run `gpu-holder` (pid {holder_pid})")),
        "the wait names what it waits for and the holder: {waited}"
    );
    assert!(started.elapsed() > Duration::from_millis(500), "it waited");
    assert!(
        third.status.success(),
        "a run needing no GPU fits beside: {}",
        text(&third.stderr)
    );
    assert!(left_behind(&mark, Duration::from_secs(10)).is_empty());
}

#[test]
fn a_sigkilled_drivers_reservation_is_reclaimed_by_the_next_run() {
    let (_dir, ledger) = ledger_dir();
    let mark = format!("sigkill-{}", std::process::id());
    let mut holder = start_run(&ledger, &mark, &["-n", "2", "--use-gpu"], "sleep 60");
    wait_for_holder(&ledger, holder.id());
    holder.kill().expect("SIGKILL");
    holder.wait().expect("reaped");
    // The killed run's agents hold its GPUs until they have stopped their tasks and exited,
    // which on a loaded machine can come after the next run looks: it waits for them, within
    // a bound.
    let next = finish(start_run(
        &ledger,
        &mark,
        &["-n", "2", "--use-gpu", "--placement-timeout", "20"],
        "echo gpu=$CUDA_VISIBLE_DEVICES",
    ));
    assert!(next.status.success(), "{}", text(&next.stderr));
    assert_eq!(gpus_of(&next), ["0", "1"]);
    assert!(
        left_behind(&mark, Duration::from_secs(20)).is_empty(),
        "the killed run's workers end"
    );
}

#[test]
fn plan_on_a_described_cluster_agrees_with_what_run_then_does() {
    let (dir, ledger) = ledger_dir();
    let file = dir.path().join("cluster.toml");
    std::fs::write(
        &file,
        "[[nodes]]\nid = \"local\"\ncount = 2\nresources = { CPU = 2, GPU = 1, memory = \"2GB\" }\n",
    )
    .expect("write");
    let scaling = ["-n", "2", "--use-gpu", "-s", "STRICT_SPREAD"];
    let plan = trainyard(&ledger)
        .args(["plan", "--format", "json", "--cluster"])
        .arg(&file)
        .args(scaling)
        .output()
        .expect("plan runs");
    assert!(plan.status.success(), "{}", text(&plan.stderr));
    let json: serde_json::Value = serde_json::from_slice(&plan.stdout).expect("json");
    assert_eq!(
        json["placement"]["placed"]["bundle_nodes"],
        serde_json::json!(["local-0", "local-1"])
    );

    let local = trainyard(&ledger)
        .args([
            "plan",
            "--runtime",
            "local",
            "--nodes",
            "2",
            "--num-cpus",
            "4",
            "--num-gpus",
            "2",
            "--memory",
            "4GB",
        ])
        .args(scaling)
        .output()
        .expect("plan runs");
    let shown = text(&local.stdout);
    assert!(
        shown.contains("bundle 0 (GPU=1) -> local-0")
            && shown.contains("bundle 1 (GPU=1) -> local-1"),
        "{shown}"
    );

    let mark = format!("plan-{}", std::process::id());
    let run = spread_run(&ledger, &mark, "2", "echo gpu=$CUDA_VISIBLE_DEVICES");
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        gpus_of(&run),
        ["0", "1"],
        "one worker on each node's GPU, as planned"
    );

    // Three spread bundles fit neither: plan explains it as run does, with exit 3.
    let too_many = ["-n", "3", "--use-gpu", "-s", "STRICT_SPREAD"];
    let plan = trainyard(&ledger)
        .args(["plan", "--cluster"])
        .arg(&file)
        .args(too_many)
        .output()
        .expect("plan");
    let run = spread_run(&ledger, &mark, "3", "true");
    assert_eq!((plan.status.code(), run.status.code()), (Some(3), Some(3)));
    let (planned, ran) = (text(&plan.stderr), text(&run.stderr));
    let reason = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_default()
            .replace("local-", "node-")
    };
    assert!(
        planned.contains("the workers cannot be scheduled"),
        "{planned}"
    );
    assert_eq!(
        reason(&planned).split(':').next(),
        reason(&ran).split(':').next(),
        "{planned} / {ran}"
    );
}

#[test]
fn plan_refuses_ray_and_a_bad_cluster_file_with_exit_2() {
    let (dir, ledger) = ledger_dir();
    let ray = trainyard(&ledger)
        .args(["plan", "--runtime", "ray"])
        .output()
        .expect("plan");
    assert_eq!(ray.status.code(), Some(2));
    assert!(
        text(&ray.stderr).contains("--runtime"),
        "{}",
        text(&ray.stderr)
    );
    let file = dir.path().join("bad.json");
    std::fs::write(
        &file,
        r#"{"nodes": [{"resources": {"CPU": 2}, "gpus": 1}]}"#,
    )
    .expect("write");
    let bad = trainyard(&ledger)
        .args(["plan", "--cluster"])
        .arg(&file)
        .output()
        .expect("plan");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("gpus"),
        "names the unknown field: {}",
        text(&bad.stderr)
    );
}

#[test]
fn without_xdg_runtime_dir_the_ledger_is_under_the_home_and_the_run_says_why() {
    let home = tempfile::tempdir().expect("temp dir");
    let tmp = tempfile::tempdir().expect("temp dir");
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(["run", "--backend", "none", "--num-cpus", "1"])
            .arg("--storage")
            .arg(home.path().join("results"))
            .args(["--", "true"])
            .env_remove(LEDGER)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("RUST_LOG")
            .env("HOME", home.path())
            .env("TMPDIR", tmp.path())
            .env("CI", "1")
            .stdin(Stdio::null())
            .output()
            .expect("trainyard runs")
    };
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let host = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("UTF-8");
    let ledger = home
        .path()
        .join(".cache/trainyard")
        .join(host)
        .join("ledger");
    assert_eq!(
        stderr.lines().next(),
        Some(
            format!(
                "warning: XDG_RUNTIME_DIR is not set: this user's ledger is in `{}` (set TRAINYARD_LEDGER to put it elsewhere)",
                ledger.display()
            )
            .as_str()
        ),
        "{stderr}"
    );
    assert!(ledger.exists(), "{}", ledger.display());
    // The next run on this host finds the ledger there and says nothing of it.
    let again = run();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("list")
        .map(|entry| entry.expect("an entry").file_name())
        .filter(|name| !name.to_string_lossy().starts_with("trainyard-python-"))
        .collect();
    assert!(
        left.is_empty(),
        "nothing in the temporary directory but the Python files all agents share: {left:?}"
    );
}
