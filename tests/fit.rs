//! End-to-end runs of the facade on the simulated runtime.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use trainyard::backend::{AttemptFailure, ExecutorError};
use trainyard::prelude::*;
use trainyard::runtime::TaskFailure;
use trainyard::runtime::sim::{SimNode, SimRuntime};

fn functions() -> FunctionRegistry {
    FunctionRegistry::with_builtins().register("train", |task| async move {
        let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
        for epoch in 0..3u32 {
            let loss = 1.0 / f64::from(epoch + 1 + ctx.world_rank().0);
            ctx.report(json!({"epoch": epoch, "loss": loss}))
                .map_err(|e| e.to_string())?;
            ctx.print(format!("epoch {epoch} done"));
        }
        if ctx.restart_count() == 0
            && ctx.arg() == &json!("fail first attempt")
            && ctx.world_rank().0 == 1
        {
            return Err("rank 1 lost its data loader".to_owned());
        }
        Ok(json!({"rank": ctx.world_rank().0, "master": ctx.var("MASTER_ADDR")}))
    })
}

fn cluster() -> SimRuntime {
    SimRuntime::new([
        SimNode::new("node-a")
            .ip("10.0.0.1")
            .cpus(2)
            .memory(2_000_000_000),
        SimNode::new("node-b")
            .ip("10.0.0.2")
            .cpus(2)
            .memory(2_000_000_000),
    ])
    .with_functions(functions())
}

fn options() -> ExecutorOptions {
    ExecutorOptions {
        poll_interval: Duration::from_millis(2),
        restart_backoff: trainyard::backend::Backoff::NONE,
        ..ExecutorOptions::default()
    }
}

#[tokio::test]
async fn torch_trainer_fits_with_memory_per_worker_and_streams_reports() {
    let sim = cluster();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let result = Trainer::builder(Arc::new(sim.clone()))
        .backend(&TorchConfig::default())
        .scaling_config(
            ScalingConfig::default()
                .num_workers(4)
                .resources_per_worker("CPU=1,memory=1GB".parse().expect("dict")),
        )
        .executor_options(options())
        .events(tx)
        .fit(&TaskSpec::function("train", Value::Null))
        .await
        .expect("the run succeeds");
    assert_eq!(result.attempts, 1);
    assert!(result.failures.is_empty());
    assert_eq!(result.returns.len(), 4);
    for (rank, value) in result.returns.iter().enumerate() {
        assert_eq!(value["rank"], json!(rank));
        assert_eq!(value["master"], json!("10.0.0.1"));
    }
    for (rank, metrics) in result.metrics.iter().enumerate() {
        let metrics = metrics.as_ref().expect("every rank reported");
        assert_eq!(metrics["epoch"], json!(2));
        assert_eq!(metrics["loss"], json!(1.0 / (3.0 + rank as f64)));
    }
    assert!(result.last_report.is_some());
    let mut reports = 0;
    let mut logs = 0;
    while let Ok(event) = rx.try_recv() {
        match event {
            RunEvent::Report { .. } => reports += 1,
            RunEvent::Log { line, .. } => {
                assert!(line.starts_with("epoch "));
                logs += 1;
            }
            _ => {}
        }
    }
    assert_eq!((reports, logs), (12, 12));
    assert_eq!(sim.placement_group_count(), 0);
    assert!(sim.live_actors().is_empty());
}

#[tokio::test]
async fn a_failed_attempt_is_restarted_and_recorded() {
    let sim = cluster();
    let result = Trainer::builder(Arc::new(sim.clone()))
        .backend(&TorchConfig::default())
        .scaling_config(ScalingConfig::default().num_workers(2))
        .run_config(RunConfig::default().failure_config(FailureConfig::restarts(1)))
        .executor_options(options())
        .fit(&TaskSpec::function("train", json!("fail first attempt")))
        .await
        .expect("the second attempt succeeds");
    assert_eq!(result.attempts, 2);
    assert_eq!(
        result.failures,
        [AttemptFailure::TaskFailed {
            rank: WorldRank(1),
            failure: TaskFailure::Error {
                message: "rank 1 lost its data loader".into()
            },
            last_lines: vec![
                "epoch 0 done".into(),
                "epoch 1 done".into(),
                "epoch 2 done".into()
            ],
            error: None,
            // Rank 0 had finished its epochs when rank 1 failed.
            left_before: vec![WorldRank(0)],
        }]
    );
}

#[tokio::test]
async fn errors_wrap_the_layer_error_as_their_source() {
    let sim = cluster();
    let err = Trainer::builder(Arc::new(sim.clone()))
        .backend(&NoBackend)
        .scaling_config(
            ScalingConfig::default()
                .num_workers(1)
                .resources_per_worker("memory=10GB".parse().expect("dict")),
        )
        .executor_options(options())
        .fit(&TaskSpec::function("train", Value::Null))
        .await
        .expect_err("10 GB fits on no node");
    assert!(
        matches!(err, Error::Executor(ExecutorError::Unschedulable(_))),
        "{err:?}"
    );
    let text = trainyard::resources::ErrorChain(&err).to_string();
    assert!(text.contains("memory"), "{text}");
    assert_eq!(sim.placement_group_count(), 0);

    let err = Trainer::builder(Arc::new(sim))
        .backend(&NoBackend)
        .scaling_config(ScalingConfig::default().num_workers(0))
        .fit(&TaskSpec::function("train", Value::Null))
        .await
        .expect_err("no workers");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(
        err.source()
            .is_some_and(|s| s.to_string().contains("`num_workers`")),
        "{err:?}"
    );
}
