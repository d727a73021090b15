//! End-to-end runs of the facade on the local runtime: real agent processes that run Rust
//! functions registered in this very test binary. The binary re-executes itself as each
//! worker's agent by running only the test `agent_entry`, which hands over to
//! `trainyard::run_if_agent` when the runtime started it as an agent.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use trainyard::backend::{AttemptFailure, Backoff, ExecutorError};
use trainyard::local::AgentCommand;
use trainyard::local::detect::{Machine, Overrides, plan_nodes};
use trainyard::prelude::*;
use trainyard::resources::ResourceAmount;
use trainyard::runtime::{DeathCause, TaskFailure};

fn functions() -> FunctionRegistry {
    FunctionRegistry::new()
        .register("train", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            for step in 0..3u32 {
                let metrics = json!({"step": step, "rank": ctx.world_rank().0});
                ctx.report(metrics).map_err(|e| e.to_string())?;
            }
            ctx.print(format!("rank {} done", ctx.world_rank()));
            Ok(json!({
                "rank": ctx.world_rank().0,
                "master": ctx.var("MASTER_ADDR"),
                "port": ctx.var("MASTER_PORT"),
                "pid": std::process::id(),
            }))
        })
        .register("fail_on_rank_1", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            if ctx.world_rank().0 == 1 && ctx.restart_count() == 0 {
                return Err("rank 1 lost its data loader".to_owned());
            }
            Ok(json!(ctx.restart_count()))
        })
        .register("train_a_while", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(json!({"rank": ctx.world_rank().0, "restart": ctx.restart_count()}))
        })
        .register("checkpoint_epochs", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            checkpoint_epochs(&ctx).await
        })
        .register("sleep_on_rank_1", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            ctx.print(format!("rank {} ready", ctx.world_rank()));
            if ctx.world_rank().0 == 1 {
                // Blocks its thread, as a stuck data loader would.
                std::thread::sleep(Duration::from_secs(600));
            } else {
                // Waits for rank 1, as a collective would.
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
            Ok(Value::Null)
        })
        .register("print_rank", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            let rank = ctx.world_rank().0;
            println!("hello from rank {rank}");
            eprintln!("rank {rank} is done");
            print!("no line end from rank {rank}");
            Ok(Value::Null)
        })
        .register("exit_abruptly", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            if ctx.world_rank().0 == 0 {
                std::process::exit(9);
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Value::Null)
        })
}

/// Five epochs from the checkpoint it is given, a shard per rank handed in after each; in the
/// first attempt rank 1's process exits after epoch 3. Returns the epochs it ran.
async fn checkpoint_epochs(ctx: &TrainContext) -> Result<Value, String> {
    let rank = ctx.world_rank().0;
    let start = match ctx.checkpoint() {
        Some(dir) => {
            let text = std::fs::read_to_string(dir.join(format!("epoch_{rank}")))
                .map_err(|e| e.to_string())?;
            text.parse::<u64>().map_err(|e| e.to_string())? + 1
        }
        None => 1,
    };
    let scratch = std::env::temp_dir().join(format!("ty-epochs-{}", std::process::id()));
    let mut ran = Vec::new();
    for epoch in start..=5 {
        ran.push(epoch);
        std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
        std::fs::write(scratch.join(format!("epoch_{rank}")), epoch.to_string())
            .map_err(|e| e.to_string())?;
        let metrics = json!({"epoch": epoch})
            .as_object()
            .cloned()
            .unwrap_or_default();
        ctx.report_checkpoint(metrics, &scratch)
            .await
            .map_err(|e| e.to_string())?;
        if epoch == 3 && rank == 1 && ctx.restart_count() == 0 {
            // The other rank hands in epoch 3 meanwhile.
            tokio::time::sleep(Duration::from_millis(500)).await;
            std::process::exit(9);
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(json!(ran))
}

/// Not a test of its own: the entry point of this binary's agents.
#[test]
fn agent_entry() {
    if let Some(code) = trainyard::run_if_agent(functions()) {
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
}

async fn local(cpus: u32, nodes: u32) -> LocalRuntime {
    let overrides = Overrides {
        num_cpus: Some(ResourceAmount::from(cpus)),
        memory: Some(8 << 30),
        ..Overrides::default()
    };
    let nodes = plan_nodes(&Machine::detect(), &overrides, nodes).expect("nodes");
    let exe = std::env::current_exe().expect("this test binary");
    let agent = AgentCommand::new(
        exe,
        [
            "--exact",
            "agent_entry",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ],
    );
    let config = LocalConfig::new(nodes, "facade-local")
        .expect("config")
        .with_agent(agent)
        .ledger(trainyard::local::ledger::LedgerLocation::Off);
    LocalRuntime::start(config)
        .await
        .expect("the local runtime starts")
}

fn options() -> ExecutorOptions {
    ExecutorOptions {
        restart_backoff: Backoff::NONE,
        shutdown_patience: Duration::from_secs(2),
        ..ExecutorOptions::default()
    }
}

#[tokio::test]
async fn the_seed_scenario_runs_torch_workers_with_memory_per_worker_as_processes() {
    let runtime = local(4, 2).await;
    let (events, mut received) = tokio::sync::mpsc::channel(1024);
    let result = Trainer::builder(Arc::new(runtime.clone()))
        .backend(&TorchConfig::default())
        .scaling_config(
            ScalingConfig::default()
                .num_workers(2)
                .resources_per_worker(r#"{"memory": 10000}"#.parse().expect("dict")),
        )
        .executor_options(options())
        .events(events)
        .fit(&TaskSpec::function("train", Value::Null))
        .await
        .expect("the run succeeds");
    assert_eq!(result.returns.len(), 2);
    let pids: Vec<u64> = result
        .returns
        .iter()
        .map(|r| r["pid"].as_u64().expect("pid"))
        .collect();
    assert_ne!(pids[0], pids[1], "each rank is its own process");
    assert!(!pids.contains(&u64::from(std::process::id())));
    for (rank, value) in result.returns.iter().enumerate() {
        assert_eq!(value["rank"], json!(rank));
        assert_eq!(value["master"], json!("127.0.0.1"));
    }
    assert_eq!(result.returns[0]["port"], result.returns[1]["port"]);
    let mut reports = 0;
    let mut lines = Vec::new();
    while let Ok(event) = received.try_recv() {
        match event {
            RunEvent::Report { .. } => reports += 1,
            RunEvent::Log { line, .. } => lines.push(line),
            _ => {}
        }
    }
    assert_eq!(reports, 6, "every report of both ranks arrives");
    lines.sort();
    assert_eq!(lines, ["rank 0 done", "rank 1 done"]);
    runtime.shutdown().await;
    assert!(runtime.agent_pids().is_empty());
}

#[tokio::test]
async fn what_a_rust_function_prints_is_its_ranks_output_on_its_stream() {
    use trainyard::runtime::Stream;

    let runtime = local(2, 1).await;
    let (events, mut received) = tokio::sync::mpsc::channel(1024);
    Trainer::builder(Arc::new(runtime.clone()))
        .backend(&NoBackend)
        .scaling_config(ScalingConfig::default().num_workers(2))
        .executor_options(options())
        .events(events)
        .fit(&TaskSpec::function("print_rank", Value::Null))
        .await
        .expect("the run succeeds");
    runtime.shutdown().await;
    let mut lines = Vec::new();
    while let Ok(event) = received.try_recv() {
        if let RunEvent::Log {
            rank, stream, line, ..
        } = event
        {
            lines.push((rank.0, stream, line));
        }
    }
    for rank in 0..2u32 {
        let of_rank = |stream: Stream| -> Vec<&str> {
            lines
                .iter()
                .filter(|(r, s, _)| *r == rank && *s == stream)
                .map(|(_, _, line)| line.as_str())
                .collect()
        };
        assert_eq!(
            of_rank(Stream::Stdout),
            [
                format!("hello from rank {rank}"),
                format!("no line end from rank {rank}")
            ],
            "{lines:?}"
        );
        assert_eq!(
            of_rank(Stream::Stderr),
            [format!("rank {rank} is done")],
            "{lines:?}"
        );
    }
}

#[tokio::test]
async fn a_hung_rust_function_is_stopped_with_its_threads_state() {
    let runtime = local(2, 1).await;
    let storage = tempfile::tempdir().expect("a temporary directory");
    let (events, mut received) = tokio::sync::mpsc::channel(1024);
    let started = std::time::Instant::now();
    let result = Trainer::builder(Arc::new(runtime.clone()))
        .backend(&NoBackend)
        .scaling_config(ScalingConfig::default().num_workers(2))
        .run_config(
            RunConfig::default()
                .name("hung-function")
                .storage_path(storage.path().display().to_string())
                .hang_timeout(Duration::from_secs(2)),
        )
        .executor_options(options())
        .events(events)
        .fit(&TaskSpec::function("sleep_on_rank_1", Value::Null))
        .await;
    let took = started.elapsed();
    let Err(trainyard::Error::Executor(ExecutorError::TrainingFailed { report })) = result else {
        panic!("the hang fails the run: {result:?}");
    };
    assert!(
        matches!(report.failures.as_slice(), [AttemptFailure::Hung { ranks, .. }] if ranks.len() == 2),
        "{:?}",
        report.failures
    );
    assert!(took < Duration::from_secs(2 + 3 + 10), "{took:?}");
    let mut stacks = None;
    while let Ok(event) = received.try_recv() {
        if let RunEvent::Stacks { ranks, .. } = event {
            stacks = Some(ranks);
        }
    }
    let stacks = stacks.expect("every rank's stacks were streamed");
    let rank_1 = stacks[1].stacks.as_ref().expect("rank 1's stacks");
    let (_, thread) = rank_1.focus().expect("a thread");
    assert_eq!(
        thread.name, "trainyard-task",
        "the task's thread comes first"
    );
    assert_eq!(thread.state, "S");
    assert!(
        thread.wchan.as_deref().is_some_and(|w| w.contains("sleep")),
        "std::thread::sleep waits in the kernel's nanosleep: {}",
        stacks[1].summary()
    );
    runtime.shutdown().await;
    assert!(runtime.agent_pids().is_empty());
}

#[tokio::test]
async fn a_user_error_restarts_and_the_retry_succeeds() {
    let runtime = local(2, 1).await;
    let result = Trainer::builder(Arc::new(runtime.clone()))
        .backend(&NoBackend)
        .scaling_config(ScalingConfig::default().num_workers(2))
        .run_config(RunConfig::default().failure_config(FailureConfig::restarts(1)))
        .executor_options(options())
        .fit(&TaskSpec::function("fail_on_rank_1", Value::Null))
        .await
        .expect("the second attempt succeeds");
    assert_eq!(result.attempts, 2);
    assert!(
        matches!(
            &result.failures[..],
            [AttemptFailure::TaskFailed {
                rank: WorldRank(1),
                failure: TaskFailure::Error { message },
                ..
            }] if message == "rank 1 lost its data loader"
        ),
        "{:?}",
        result.failures
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_worker_process_that_exits_is_a_death_with_its_exit_code() {
    let runtime = local(2, 1).await;
    let error = Trainer::builder(Arc::new(runtime.clone()))
        .backend(&NoBackend)
        .scaling_config(ScalingConfig::default().num_workers(2))
        .executor_options(options())
        .fit(&TaskSpec::function("exit_abruptly", Value::Null))
        .await
        .expect_err("rank 0's process exits");
    let trainyard::Error::Executor(ExecutorError::TrainingFailed { report }) = &error else {
        panic!("expected a failed run, got {error:?}");
    };
    assert!(
        matches!(
            &report.failures[..],
            [AttemptFailure::WorkerDied {
                rank: Some(WorldRank(0)),
                cause: DeathCause::ProcessExited { code: Some(9), .. }
            }]
        ),
        "{:?}",
        report.failures
    );
    runtime.shutdown().await;
    assert!(runtime.agent_pids().is_empty());
}

/// Fault injection on real agent processes: the second worker's agent is killed after it
/// has answered 0, 1 or 2 of the driver's calls (as it starts, once its node is known, once
/// its task runs: mid-training), then after 3 (the stop at the end of a successful run). Each time the death is reported as such, the restart budget of one is spent exactly
/// once (or not at all for the kill during shutdown), and afterwards no agent process and
/// no reservation is left.
#[tokio::test]
async fn a_worker_killed_at_each_step_restarts_once_and_leaves_nothing() {
    use trainyard::runtime::sim::faults::KillActorAfterCalls;

    for calls in 0..=3 {
        let runtime = local(2, 1).await;
        let total = runtime.cluster().await.expect("cluster").total();
        let faulty = KillActorAfterCalls::new(Arc::new(runtime.clone()), 1, calls);
        let result = Trainer::builder(Arc::new(faulty))
            .backend(&NoBackend)
            .scaling_config(ScalingConfig::default().num_workers(2))
            .run_config(RunConfig::default().failure_config(FailureConfig::restarts(1)))
            .executor_options(options())
            .fit(&TaskSpec::function("train_a_while", Value::Null))
            .await
            .unwrap_or_else(|e| panic!("killed after {calls} calls: the run fails: {e:?}"));
        // Calls to the second worker: its node, its task (with its environment), the stop.
        let (attempts, restarts) = if calls < 3 { (2, 1) } else { (1, 0) };
        assert_eq!(result.attempts, attempts, "killed after {calls} calls");
        assert_eq!(result.failures.len(), restarts, "{:?}", result.failures);
        for failure in &result.failures {
            assert!(
                matches!(
                    failure,
                    AttemptFailure::WorkerDied {
                        cause: DeathCause::Killed,
                        ..
                    } | AttemptFailure::StartFailed { .. }
                ),
                "killed after {calls} calls: {failure:?}"
            );
        }
        for (rank, value) in result.returns.iter().enumerate() {
            assert_eq!(value["rank"], json!(rank));
            assert_eq!(value["restart"], json!(restarts));
        }
        runtime.shutdown().await;
        assert!(runtime.agent_pids().is_empty(), "after {calls} calls");
        assert_eq!(
            runtime.cluster().await.expect("cluster").available(),
            total,
            "nothing stays reserved after {calls} calls"
        );
    }
}

#[tokio::test]
async fn rust_function_tasks_resume_from_the_latest_checkpoint_after_a_worker_dies() {
    let runtime = local(2, 1).await;
    let storage = tempfile::tempdir().expect("tempdir");
    let (events, mut received) = tokio::sync::mpsc::channel(1024);
    let result = Trainer::builder(Arc::new(runtime.clone()))
        .backend(&NoBackend)
        .scaling_config(ScalingConfig::default().num_workers(2))
        .run_config(
            RunConfig::default()
                .name("rust-resume")
                .storage_path(storage.path().display().to_string())
                .failure_config(FailureConfig::restarts(1)),
        )
        .executor_options(options())
        .events(events)
        .fit(&TaskSpec::function("checkpoint_epochs", Value::Null))
        .await
        .expect("the second attempt succeeds");
    assert_eq!(result.attempts, 2);
    assert!(
        matches!(
            &result.failures[..],
            [AttemptFailure::WorkerDied { .. } | AttemptFailure::TaskFailed { .. }]
        ),
        "{:?}",
        result.failures
    );
    assert_eq!(
        result.returns,
        vec![json!([4, 5]), json!([4, 5])],
        "every rank resumes at epoch 4"
    );
    let latest = result.checkpoint.expect("a latest checkpoint");
    assert_eq!(latest.index, 5);
    let dir = storage.path().join("rust-resume/checkpoint_000005");
    for rank in 0..2 {
        assert_eq!(
            std::fs::read_to_string(dir.join(format!("epoch_{rank}"))).expect("shard"),
            "5"
        );
    }
    let mut resumed = Vec::new();
    while let Ok(event) = received.try_recv() {
        if let RunEvent::Resuming { checkpoint, .. } = event {
            resumed.push(checkpoint.index);
        }
    }
    assert_eq!(resumed, vec![3]);
    runtime.shutdown().await;
    assert!(runtime.agent_pids().is_empty());
}
