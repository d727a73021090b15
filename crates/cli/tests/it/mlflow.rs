//! `trainyard run --mlflow URI` against a real MLflow tracking server (`mlflow server`, a
//! SQLite store, on a loopback port; `scripts/mlflow-env.sh` installs it and prints the
//! `mlflow` program, which CI passes in `TRAINYARD_MLFLOW`), read back through MLflow's REST
//! API.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The `mlflow` program; `None` after a `SKIP:` line when there is none (under `CI=true`
/// only when CI says why, in `TRAINYARD_MLFLOW_SKIP`).
fn mlflow_program() -> Option<String> {
    if let Some(program) = std::env::var("TRAINYARD_MLFLOW")
        .ok()
        .filter(|p| !p.is_empty())
    {
        return Some(program);
    }
    let reason = std::env::var("TRAINYARD_MLFLOW_SKIP").unwrap_or_default();
    assert!(
        std::env::var("CI").as_deref() != Ok("true") || !reason.is_empty(),
        "TRAINYARD_MLFLOW is not set (scripts/mlflow-env.sh prints it), and CI did not say why (TRAINYARD_MLFLOW_SKIP)"
    );
    eprintln!(
        "SKIP: the MLflow reporter against a real server: {}",
        if reason.is_empty() {
            "TRAINYARD_MLFLOW is not set (scripts/mlflow-env.sh)"
        } else {
            &reason
        }
    );
    None
}

/// A tracking server of the test's own, stopped when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts `mlflow server` on a free loopback port with its store in `dir`, and waits (at
    /// most 120 s: it takes 10 to 30 s here) until it answers.
    fn start(program: &str, dir: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(program)
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("store.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.join("artifacts"))
            .arg("--workers")
            .arg("1")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("mlflow server starts");
        let server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let health = format!("{}/health", server.url);
        while !get_ok(&health) {
            assert!(
                Instant::now() < deadline,
                "mlflow server did not answer in 120 s"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        server
    }

    /// POSTs `body` to MLflow's REST endpoint `path`; its JSON answer.
    fn post(&self, path: &str, body: &Value) -> Value {
        let url = format!("{}/api/2.0/mlflow/{path}", self.url);
        let body = body.to_string();
        curl(
            path,
            &[
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
                &body,
                &url,
            ],
        )
    }

    /// GETs MLflow's REST endpoint `path` with `query`; its JSON answer.
    fn get(&self, path: &str, query: &str) -> Value {
        curl(
            path,
            &[&format!("{}/api/2.0/mlflow/{path}?{query}", self.url)],
        )
    }
}

/// `curl -sS -f ARGS` for MLflow's endpoint `path`: the JSON it answers.
fn curl(path: &str, args: &[&str]) -> Value {
    let out = Command::new("curl")
        .args(["-sS", "-f"])
        .args(args)
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "{path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

impl Drop for Server {
    fn drop(&mut self) {
        // The server and its workers are one process group of their own.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.wait();
    }
}

/// Whether a GET of `url` answers 2xx.
fn get_ok(url: &str) -> bool {
    Command::new("curl")
        .args(["-sf", "-o", "/dev/null", "--max-time", "2", url])
        .status()
        .is_ok_and(|status| status.success())
}

/// Each rank reports `loss = 1 / step` with a checkpoint, three steps a command from the latest
/// checkpoint on; rank 1 dies after its second report of each attempt while `DIE` is set.
const TRAIN: &str = r#"
import os, tempfile
from trainyard import train
rank = int(os.environ["TRAINYARD_WORLD_RANK"])
start = 0
checkpoint = train.get_checkpoint()
if checkpoint:
    with checkpoint.as_directory() as d:
        start = int(open(os.path.join(d, "step")).read())
for i, step in enumerate(range(start + 1, start + 4)):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "step"), "w") as f:
        f.write(str(step))
    train.report({"loss": 1.0 / step}, checkpoint=train.Checkpoint.from_directory(d))
    if os.environ.get("DIE") and rank == 1 and i == 1:
        os._exit(3)
"#;

#[test]
fn one_mlflow_run_keeps_a_run_over_restarts_and_resumes_with_its_metrics_params_and_checkpoints() {
    let Some(program) = mlflow_program() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start(&program, dir.path());
    let storage = dir.path().join("runs");
    let script = dir.path().join("train.py");
    std::fs::write(&script, TRAIN).expect("written");
    let run = |die: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
        command
            .args(["run", "-n", "2", "-r", "CPU=0.5", "--backend", "none"])
            .args(["--name", "tracked", "--max-failures", "1"])
            .arg("--storage")
            .arg(&storage)
            .args(["--mlflow", &server.url])
            .args(["--", "python3"])
            .arg(&script)
            .env("MLFLOW_EXPERIMENT_NAME", "trainyard-tests")
            .env(
                "TRAINYARD_LEDGER",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("ledger-mlflow"),
            )
            .env("CI", "1")
            .stdin(Stdio::null());
        if die {
            command.env("DIE", "1");
        }
        command.output().expect("trainyard runs")
    };
    // A restart, then a failure: the run ends failed, resumable.
    let first = run(true);
    assert_eq!(first.status.code(), Some(1), "{}", text(&first));
    // The same command again resumes it and succeeds.
    let second = run(false);
    assert!(second.status.success(), "{}", text(&second));

    let experiment = server.get("experiments/get-by-name", "experiment_name=trainyard-tests");
    let experiment = experiment["experiment"]["experiment_id"]
        .as_str()
        .expect("the experiment was made");
    let runs = server.post("runs/search", &json!({"experiment_ids": [experiment]}));
    let runs = runs["runs"].as_array().expect("runs");
    assert_eq!(
        runs.len(),
        1,
        "one MLflow run over restarts and resumes: {runs:?}"
    );
    let mlflow_run = &runs[0];
    assert_eq!(mlflow_run["info"]["run_name"], "tracked");
    assert_eq!(mlflow_run["info"]["status"], "FINISHED");
    let data = &mlflow_run["data"];
    let tag = |key: &str| {
        data["tags"]
            .as_array()
            .and_then(|tags| tags.iter().find(|t| t["key"] == key))
            .map(|t| t["value"].clone())
    };
    let folder = storage.join("tracked");
    assert_eq!(
        tag("trainyard.run_folder"),
        Some(json!(folder.display().to_string()))
    );
    // The run's own record names its latest checkpoint (two attempts that each commit one
    // or two, then three more: which, depends on whether rank 0's report raced rank 1's
    // death): the MLflow run's tags name the same.
    let record: Value =
        serde_json::from_slice(&std::fs::read(folder.join("run.json")).expect("the run's record"))
            .expect("JSON");
    let latest_index = record["latest_checkpoint"].as_u64().expect("a checkpoint");
    let latest = folder
        .join(format!("checkpoint_{latest_index:06}"))
        .display()
        .to_string();
    assert_eq!(tag("trainyard.latest_checkpoint"), Some(json!(latest)));
    assert_eq!(
        tag(&format!("trainyard.checkpoint.{latest_index}")),
        Some(json!(latest))
    );
    let param = |key: &str| {
        data["params"]
            .as_array()
            .and_then(|params| params.iter().find(|p| p["key"] == key))
            .map(|p| p["value"].clone())
    };
    assert_eq!(param("scaling.num_workers"), Some(json!("2")));
    assert_eq!(param("run.name"), Some(json!("tracked")));
    let run_id = mlflow_run["info"]["run_id"].as_str().expect("an id");
    let history = server.get(
        "metrics/get-history",
        &format!("run_id={run_id}&metric_key=loss&max_results=1000"),
    );
    let mut points: Vec<(u64, f64)> = history["metrics"]
        .as_array()
        .expect("a history")
        .iter()
        .map(|m| {
            (
                m["step"].as_u64().expect("a step"),
                m["value"].as_f64().expect("a value"),
            )
        })
        .collect();
    points.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    points.dedup();
    // Rank 0's reports, each at its step (its index, which goes on over the restart and the
    // resume: the script's own step is the same number), from every attempt and driver.
    let steps: Vec<u64> = points.iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, (1..=latest_index).collect::<Vec<_>>(), "{points:?}");
    for (step, value) in points {
        assert!(
            (value - 1.0 / step as f64).abs() < 1e-9,
            "step {step}: {value}"
        );
    }
}

fn text(output: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
