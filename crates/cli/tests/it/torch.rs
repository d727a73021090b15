//! Real PyTorch through `trainyard run`: `examples/torch_ddp.py` all-reduces across 2 and 3
//! workers with gloo. The interpreter comes from `TRAINYARD_TORCH_PYTHON`, or from
//! `scripts/python-env.sh`, which installs CPU-usable torch into a venv cached outside the
//! repository. When the package registry cannot be reached the test says so loudly and
//! skips; under `CI=true` only when CI has said so too (`common::torch_python`).

use trainyard_test_support::processes as common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Sandbox, json_events, report_steps, root, torch_python};

fn run_ddp(python: &Path, workers: u32, format: &str) -> (String, String) {
    let sandbox = Sandbox::new("torch-ddp");
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .current_dir(root())
        .envs(sandbox.env())
        .args([
            "run",
            "-n",
            &workers.to_string(),
            "-r",
            "CPU=0.5",
            "--log-format",
            format,
            "--",
        ])
        .arg(python)
        .arg("examples/torch_ddp.py")
        .env("CI", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    let deadline = Instant::now() + Duration::from_secs(300);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the DDP example did not finish within 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{workers} workers: {stdout}\n{stderr}"
    );
    (stdout, stderr)
}

#[test]
fn torch_ddp_all_reduces_across_two_and_three_workers() {
    let Some(python) = torch_python() else {
        return;
    };
    for workers in [2u32, 3] {
        let (stdout, _) = run_ddp(&python, workers, "text");
        let sum = workers * (workers + 1) / 2;
        for rank in 0..workers {
            let want = format!("rank {rank}: all_reduce sum = {sum} (expected {sum})");
            assert!(
                stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("(rank={rank}, pid=")) && l.ends_with(&want)),
                "{workers} workers: no `{want}` from rank {rank} in {stdout}"
            );
        }
    }
}

#[test]
fn torch_ddp_reports_reach_the_driver_as_json_events() {
    let Some(python) = torch_python() else {
        return;
    };
    let (stdout, _) = run_ddp(&python, 2, "json");
    let events = json_events(&stdout);
    for rank in 0..2 {
        let steps = report_steps(&events, rank);
        assert_eq!(steps, [0, 1, 2, 3, 4], "rank {rank}'s reports, in order");
    }
    assert!(events.iter().any(|e| e["event"] == "attempt_started"));
}

#[test]
fn a_rank_that_leaves_early_is_named_when_its_peer_fails_in_a_collective() {
    let Some(python) = torch_python() else {
        return;
    };
    // Uneven work: rank 1 leaves after one all_reduce (at once, as a process that ends without
    // tearing its process group down), rank 0 goes on to another.
    let script = "import os, time, torch, torch.distributed as dist\n\
        dist.init_process_group('gloo')\n\
        t = torch.ones(1)\n\
        dist.all_reduce(t)\n\
        if dist.get_rank() == 1:\n    os._exit(0)\n\
        time.sleep(0.5)\n\
        dist.all_reduce(t)\n";
    let sandbox = Sandbox::new("leaves-early");
    let child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .envs(sandbox.env())
        .args(["run", "-n", "2", "-r", "CPU=0.5", "--"])
        .arg(&python)
        .args(["-c", script])
        .env("CI", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    let out = common::wait_bounded(child, Duration::from_secs(300));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.lines().any(|l| l
            == "trainyard: rank 1 had already exited with code 0 before rank 0 failed: a rank that leaves while its peers still run collectives breaks them (uneven inputs?)"),
        "{stderr}"
    );
}
