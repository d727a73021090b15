//! Python scripts through real agents: `import trainyard` with nothing installed, Ray
//! Train's worker API (`train.report` with a checkpoint, `get_checkpoint`, `get_context`),
//! the protocol-1 client `trainyard_report` beside it, and the checkpoint a task resumes
//! from, fetched by the agent before the task starts (for command and function tasks).
//!
//! Each test starts a local runtime whose agent is `examples/agent.rs` and runs `python3 -c`
//! as a command task. Without `python3` on `PATH` a test says `SKIP:` and passes.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::timeout;
use trainyard_resources::{ActorOptions, ResourceAmount};
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_runtime::root_cause::ERROR_FILE_VAR;
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, RuntimeError, Stream, TaskEvent, TaskExit,
    TaskFailure, TaskRejection, TaskSpec, builtins,
};
use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
use trainyard_runtime_local::ledger::LedgerLocation;
use trainyard_runtime_local::{LocalConfig, LocalRuntime};

/// The bound of every test.
const TEST_LIMIT: Duration = Duration::from_secs(120);

/// Whether `python3` runs here; says `SKIP:` when it does not.
fn python3() -> bool {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        println!("SKIP: python3 is not on PATH");
    }
    found
}

/// A runtime of one node with 2 CPUs, its agents being `examples/agent.rs`.
async fn runtime(run: &str) -> LocalRuntime {
    let overrides = Overrides {
        num_cpus: Some(ResourceAmount::from(2u32)),
        memory: Some(4 << 30),
        ..Overrides::default()
    };
    let nodes = plan_nodes(&Machine::detect(), &overrides, 1).expect("one node");
    let config = LocalConfig::new(nodes, run)
        .expect("config")
        .with_agent(common::agent())
        .stop_grace(Duration::from_secs(2))
        .ledger(LedgerLocation::Off);
    LocalRuntime::start(config)
        .await
        .expect("the runtime starts")
}

/// What a task did, in the order it happened.
#[derive(Debug, Default)]
struct Outcome {
    stdout: Vec<String>,
    stderr: Vec<String>,
    /// Each report's metrics, and its checkpoint's hand-in as JSON (`None` without one).
    reports: Vec<(serde_json::Value, Option<serde_json::Value>)>,
    exit: Option<TaskExit>,
}

impl Outcome {
    /// The output, for messages.
    fn output(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.stdout.join("\n"),
            self.stderr.join("\n")
        )
    }

    /// The one stdout line that starts with `prefix`, without it.
    fn line(&self, prefix: &str) -> &str {
        self.stdout
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line\n{}", self.output()))
    }

    fn assert_succeeded(&self) {
        assert!(
            matches!(self.exit, Some(TaskExit::Succeeded { .. })),
            "the script failed: {:?}\n{}",
            self.exit,
            self.output()
        );
    }
}

/// Spawns a 1-CPU actor called `name` with `env`, and takes its task events.
async fn spawn_actor(
    runtime: &LocalRuntime,
    name: &str,
    env: BTreeMap<String, String>,
) -> (ActorId, TaskEvents) {
    let actor = runtime
        .spawn(ActorSpec {
            name: name.to_owned(),
            options: ActorOptions {
                num_cpus: ResourceAmount::ONE,
                ..ActorOptions::default()
            },
            placement: None,
            env,
        })
        .await
        .expect("spawn");
    let events = runtime
        .task_events(actor)
        .await
        .expect("events")
        .expect("pushed");
    (actor, events)
}

/// The actor's next task event, within 60 s.
async fn next_event(events: &mut TaskEvents) -> ActorEvent {
    timeout(Duration::from_secs(60), events.next())
        .await
        .expect("an event within 60 s")
        .expect("the stream is open")
}

/// How the running task ends; the events before are passed over.
async fn task_exit(events: &mut TaskEvents) -> TaskExit {
    loop {
        if let ActorEvent::TaskExited { exit, .. } = next_event(events).await {
            return exit;
        }
    }
}

/// `python3 -c script` with `env`.
fn python_task(script: &str, env: BTreeMap<String, String>) -> TaskSpec {
    TaskSpec::Command {
        program: "python3".to_owned(),
        args: vec!["-c".to_owned(), script.to_owned()],
        env,
    }
}

/// `path` as text.
fn utf8(path: &Path) -> String {
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// A folder `relative` in a fresh temporary storage, holding a file `state` that reads
/// `state`; the storage (deleted when dropped) and the folder's path.
fn folder_with_state(relative: &str, state: &str) -> (tempfile::TempDir, String) {
    let storage = tempfile::tempdir().expect("a temp dir");
    let folder = storage.path().join(relative);
    std::fs::create_dir_all(&folder).expect("made");
    std::fs::write(folder.join("state"), state).expect("written");
    (storage, utf8(&folder))
}

/// Runs `python3 -c script` with `env` on a fresh 1-CPU actor and follows it to its end,
/// which must be a success; the actor is killed then.
async fn run_python(runtime: &LocalRuntime, script: &str, env: &[(&str, &str)]) -> Outcome {
    let (actor, mut events) = spawn_actor(runtime, "python", BTreeMap::new()).await;
    let env = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    runtime
        .run_task(actor, python_task(script, env))
        .await
        .expect("started");
    let mut outcome = Outcome::default();
    while outcome.exit.is_none() {
        match next_event(&mut events).await {
            ActorEvent::Task {
                event: TaskEvent::Log { stream, line },
                ..
            } => match stream {
                Stream::Stdout => outcome.stdout.push(line),
                Stream::Stderr => outcome.stderr.push(line),
            },
            ActorEvent::Task {
                event:
                    TaskEvent::Report {
                        metrics,
                        checkpoint,
                    },
                ..
            } => outcome.reports.push((
                serde_json::Value::Object(metrics),
                checkpoint.map(|c| serde_json::to_value(c).expect("a hand-in is JSON")),
            )),
            ActorEvent::Task { event: _, .. } => {}
            ActorEvent::TaskExited { exit, .. } => outcome.exit = Some(exit),
            ActorEvent::Died(cause) => panic!("the actor died: {cause}\n{}", outcome.output()),
        }
    }
    runtime.kill(actor, Duration::ZERO).await.expect("kill");
    outcome.assert_succeeded();
    outcome
}

/// Runs `test` against a fresh runtime, bounded, and shuts the runtime down.
async fn with_runtime<F: Future<Output = ()>>(run: &str, test: impl FnOnce(LocalRuntime) -> F) {
    let runtime = runtime(run).await;
    timeout(TEST_LIMIT, test(runtime.clone()))
        .await
        .expect("in time");
    runtime.shutdown().await;
}

/// As [`with_runtime`] where `python3` runs; says `SKIP:` and runs nothing where it does not.
async fn with_python<F: Future<Output = ()>>(run: &str, test: impl FnOnce(LocalRuntime) -> F) {
    if python3() {
        with_runtime(run, test).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_imports_trainyard_with_nothing_installed() {
    let script = r#"
import os, stat, sys
import trainyard, trainyard_report
from trainyard import train
here = os.path.dirname(os.path.dirname(os.path.abspath(trainyard.__file__)))
print("package:" + here)
print("report-module:" + os.path.dirname(os.path.abspath(trainyard_report.__file__)))
print("mode:" + oct(stat.S_IMODE(os.stat(here).st_mode)))
print("path:" + os.environ["PYTHONPATH"])
"#;
    with_python("py-import", |runtime| async move {
        let outcome = run_python(&runtime, script, &[("PYTHONPATH", "/the/users/own")]).await;
        let package = outcome.line("package:").to_owned();
        assert!(
            package.contains("trainyard-python-"),
            "imported from the directory the agents share, not {package}"
        );
        assert_eq!(outcome.line("report-module:"), package);
        assert_eq!(outcome.line("mode:"), "0o700", "the directory is private");
        assert_eq!(
            outcome.line("path:"),
            format!("{package}:/the/users/own"),
            "the package goes first, the task's own path stays"
        );
        // The actor was killed by `run_python`; the shared directory stays for the next.
        assert!(Path::new(&package).is_dir(), "{package} is kept");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_1_client_still_reports() {
    let script = r#"
import trainyard_report
for step in range(3):
    trainyard_report.report({"step": step, "loss": 1.0 / (step + 1)})
"#;
    with_python("py-v1", |runtime| async move {
        let outcome = run_python(&runtime, script, &[]).await;
        let steps: Vec<_> = outcome
            .reports
            .iter()
            .map(|(metrics, checkpoint)| {
                assert_eq!(checkpoint, &None);
                metrics["step"].clone()
            })
            .collect();
        assert_eq!(steps, [0, 1, 2], "{}", outcome.output());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_context_and_get_checkpoint_read_the_workers_environment() {
    let script = r#"
import json, os
from trainyard import train
ctx = train.get_context()
def values():
    return [ctx.get_world_rank(), ctx.get_local_rank(), ctx.get_world_size(),
            ctx.get_local_world_size(), ctx.get_node_rank(), ctx.get_experiment_name()]
print("trainyard:" + json.dumps(values()))
for name in ["TRAINYARD_WORLD_RANK", "TRAINYARD_LOCAL_RANK", "TRAINYARD_WORLD_SIZE",
             "TRAINYARD_LOCAL_WORLD_SIZE", "TRAINYARD_NODE_RANK", "TRAINYARD_RUN_NAME"]:
    del os.environ[name]
print("torchrun:" + json.dumps(values()))
checkpoint = train.get_checkpoint()
with checkpoint.as_directory() as d:
    print("checkpoint:" + json.dumps([checkpoint.path, d, open(os.path.join(d, "state")).read()]))
del os.environ["TRAINYARD_CHECKPOINT"]
print("fresh:" + json.dumps(train.get_checkpoint()))
"#;
    let (_storage, resume_dir) = folder_with_state("resume", "epoch 3");
    with_python("py-context", |runtime| async move {
        let env = [
            ("TRAINYARD_WORLD_RANK", "5"),
            ("TRAINYARD_LOCAL_RANK", "1"),
            ("TRAINYARD_WORLD_SIZE", "8"),
            ("TRAINYARD_LOCAL_WORLD_SIZE", "2"),
            ("TRAINYARD_NODE_RANK", "2"),
            ("TRAINYARD_RUN_NAME", "mnist"),
            ("RANK", "3"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("GROUP_RANK", "1"),
            ("TRAINYARD_CHECKPOINT", resume_dir.as_str()),
        ];
        let outcome = run_python(&runtime, script, &env).await;
        assert_eq!(outcome.line("trainyard:"), r#"[5, 1, 8, 2, 2, "mnist"]"#);
        assert_eq!(outcome.line("torchrun:"), "[3, 0, 4, 4, 1, null]");
        let checkpoint: serde_json::Value =
            serde_json::from_str(outcome.line("checkpoint:")).expect("JSON");
        assert_eq!(
            checkpoint,
            serde_json::json!([resume_dir, resume_dir, "epoch 3"])
        );
        assert_eq!(outcome.line("fresh:"), "null");
    })
    .await;
}

/// Reports three times, counting from base 3: with a checkpoint (index 4), without (5), and
/// with one again (6); after each report with a checkpoint, the script looks for the files in
/// the run folder.
const REPORT_CHECKPOINTS: &str = r#"
import os, tempfile
from trainyard import train
run_dir = os.environ["TRAINYARD_RUN_DIR"]
def persisted(index, name):
    return os.path.exists(os.path.join(run_dir, "checkpoint_%06d" % index, name))
for step, index in [(1, 4), (2, 5), (3, 6)]:
    if step == 2:
        train.report({"step": step})
        continue
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "shard_0.pt"), "w") as f:
            f.write("weights %d" % step)
        os.mkdir(os.path.join(d, "optim"))
        with open(os.path.join(d, "optim", "state"), "w") as f:
            f.write("state")
        train.report({"step": step}, checkpoint=train.Checkpoint.from_directory(d))
    print("persisted %d:%s" % (index, persisted(index, "shard_0.pt") and persisted(index, "optim/state")))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_checkpoint_is_persisted_before_report_returns_and_handed_in_by_index() {
    let storage = tempfile::tempdir().expect("a temp dir");
    let run_dir = storage.path().join("mnist");
    let run_dir_text = utf8(&run_dir);
    with_python("py-checkpoint", |runtime| async move {
        let env = [
            ("TRAINYARD_RUN_DIR", run_dir_text.as_str()),
            ("TRAINYARD_CHECKPOINT_BASE", "3"),
        ];
        let outcome = run_python(&runtime, REPORT_CHECKPOINTS, &env).await;
        assert_eq!(
            outcome.line("persisted 4:"),
            "True",
            "before report returned"
        );
        assert_eq!(
            outcome.line("persisted 6:"),
            "True",
            "before report returned"
        );
        assert_eq!(outcome.reports.len(), 3, "{}", outcome.output());
        for (i, (metrics, hand_in)) in outcome.reports.iter().enumerate() {
            assert_eq!(metrics["step"], i + 1);
            let Some(hand_in) = hand_in else {
                assert_eq!(i, 1, "only the second report has no checkpoint");
                continue;
            };
            assert_eq!(hand_in["status"], "persisted", "{hand_in}");
            assert_eq!(hand_in["index"], 4 + i, "{hand_in}");
            assert_eq!(
                hand_in["files"],
                serde_json::json!(["optim/state", "shard_0.pt"]),
                "{hand_in}"
            );
            assert_eq!(hand_in["bytes"], 14, "{hand_in}");
        }
        assert_eq!(outcome.reports[1].1, None);
        let shard = std::fs::read_to_string(run_dir.join("checkpoint_000006/shard_0.pt"))
            .expect("the files stay in the run folder");
        assert_eq!(shard, "weights 3");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_be_persisted_raises_in_python_and_is_handed_in_as_failed() {
    let script = r#"
from trainyard import train
try:
    train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory("/no/such/checkpoint"))
except train.ReportError as error:
    print("raised %s:%s" % (error.index, error))
else:
    raise SystemExit("report returned although nothing was persisted")
train.report({"step": 2})
print("went on")
"#;
    let storage = tempfile::tempdir().expect("a temp dir");
    let run_dir = storage.path().join("failing");
    let run_dir_text = utf8(&run_dir);
    with_python("py-failed", |runtime| async move {
        let env = [("TRAINYARD_RUN_DIR", run_dir_text.as_str())];
        let outcome = run_python(&runtime, script, &env).await;
        let raised = outcome.line("raised 1:");
        assert!(raised.contains("/no/such/checkpoint"), "{raised}");
        outcome.line("went on");
        assert_eq!(outcome.reports.len(), 2, "{}", outcome.output());
        let hand_in = outcome.reports[0].1.as_ref().expect("a hand-in");
        assert_eq!(hand_in["status"], "failed", "{hand_in}");
        assert_eq!(hand_in["index"], 1, "{hand_in}");
        assert_eq!(hand_in["error"], raised, "Python raises the agent's text");
        assert_eq!(outcome.reports[1].1, None);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_named_by_uri_is_ready_before_the_task_starts() {
    let script = r#"
import os
from trainyard import train
checkpoint = train.get_checkpoint()
with checkpoint.as_directory() as d:
    print("state:" + open(os.path.join(d, "state")).read())
"#;
    let (_storage, uri) = folder_with_state("mnist/checkpoint_000002", "epoch 2");
    with_python("py-resume", |runtime| async move {
        let env = [("TRAINYARD_CHECKPOINT_URI", uri.as_str())];
        let outcome = run_python(&runtime, script, &env).await;
        assert_eq!(outcome.line("state:"), "epoch 2");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_be_fetched_fails_the_task_naming_it() {
    let storage = tempfile::tempdir().expect("a temp dir");
    let gone = storage.path().join("mnist").join("checkpoint_000009");
    let uri = utf8(&gone);
    with_runtime("py-gone", |runtime| async move {
        let env = BTreeMap::from([("TRAINYARD_CHECKPOINT_URI".to_owned(), uri.clone())]);
        let (actor, mut events) = spawn_actor(&runtime, "gone", env).await;
        let names_the_checkpoint = |text: &str| {
            let named = format!("cannot download checkpoint `{uri}`");
            assert!(text.contains(&named), "{text}");
        };
        // A command is refused before it starts.
        let command = TaskSpec::Command {
            program: "true".to_owned(),
            args: Vec::new(),
            env: BTreeMap::new(),
        };
        let refused = runtime.run_task(actor, command).await.expect_err("refused");
        let RuntimeError::TaskRejected {
            rejection: TaskRejection::SpawnFailed { error, .. },
            ..
        } = &refused
        else {
            panic!("expected a rejection that may pass, got {refused}");
        };
        names_the_checkpoint(error);
        // A function starts, and fails as its task.
        let function = TaskSpec::Function {
            name: builtins::ECHO.to_owned(),
            arg: serde_json::json!(1),
            env: BTreeMap::new(),
        };
        runtime.run_task(actor, function).await.expect("started");
        let exit = task_exit(&mut events).await;
        let TaskExit::Failed {
            failure: TaskFailure::Error { message },
        } = &exit
        else {
            panic!("expected the task to fail, got {exit:?}");
        };
        names_the_checkpoint(message);
        runtime.kill(actor, Duration::ZERO).await.expect("kill");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_task_sees_the_checkpoint_fetched_for_it() {
    let (_storage, uri) = folder_with_state("mnist/checkpoint_000001", "epoch 1");
    with_runtime("fn-resume", |runtime| async move {
        let (actor, mut events) = spawn_actor(&runtime, "resume", BTreeMap::new()).await;
        let function = TaskSpec::Function {
            name: builtins::ENV.to_owned(),
            arg: serde_json::Value::Null,
            env: BTreeMap::from([("TRAINYARD_CHECKPOINT_URI".to_owned(), uri.clone())]),
        };
        runtime.run_task(actor, function).await.expect("started");
        let exit = task_exit(&mut events).await;
        let TaskExit::Succeeded { value } = &exit else {
            panic!("expected the task to succeed, got {exit:?}");
        };
        let local = value["TRAINYARD_CHECKPOINT"].as_str().expect("set");
        let state = std::fs::read_to_string(Path::new(local).join("state")).expect("readable");
        assert_eq!(state, "epoch 1");
        runtime.kill(actor, Duration::ZERO).await.expect("kill");
    })
    .await;
}

/// Waits until `dir` is gone, for up to 10 s.
async fn assert_removed(dir: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dir.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} is left behind",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_outright_leaves_no_private_directory() {
    let script = r#"
import os, sys, time
print(os.path.dirname(os.path.dirname(os.environ["MY_ERROR_FILE"])), flush=True)
time.sleep(120)
"#;
    with_python("py-killed", |runtime| async move {
        let (actor, mut events) = spawn_actor(&runtime, "killed", BTreeMap::new()).await;
        runtime
            .run_task(
                actor,
                python_task(
                    script,
                    BTreeMap::from([(ERROR_FILE_VAR.to_owned(), "MY_ERROR_FILE".to_owned())]),
                ),
            )
            .await
            .expect("started");
        let dir = loop {
            match next_event(&mut events).await {
                ActorEvent::Task {
                    event:
                        TaskEvent::Log {
                            stream: Stream::Stdout,
                            line,
                        },
                    ..
                } => break line,
                ActorEvent::TaskExited { exit, .. } => panic!("the script ended: {exit:?}"),
                _ => {}
            }
        };
        assert!(dir.contains("trainyard-agent-"), "{dir}");
        assert!(Path::new(&dir).is_dir());
        let agent = runtime.agent_pids()[0];
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(agent).expect("a pid")),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("killed");
        // The agent's watchdog kills the task and deletes the directory.
        assert_removed(Path::new(&dir)).await;
    })
    .await;
}
