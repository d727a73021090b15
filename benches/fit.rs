//! A full simulated `fit()`: reserve, start, rank, set up torch, train, shut down. Run
//! folders go to a temporary directory, not `~/trainyard_results`.
#![allow(
    clippy::disallowed_methods,
    reason = "benches make scratch files of their own"
)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use trainyard::prelude::*;
use trainyard::runtime::sim::{SimNode, SimRuntime};

fn cluster() -> SimRuntime {
    let functions = FunctionRegistry::new().register("train", |task| async move {
        let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
        ctx.report(json!({"rank": ctx.world_rank().0}))
            .map_err(|e| e.to_string())?;
        Ok(Value::Null)
    });
    SimRuntime::new((0..8).map(|i| {
        SimNode::new(&format!("node-{i}"))
            .ip(&format!("10.0.0.{i}"))
            .cpus(8)
    }))
    .with_functions(functions)
}

fn fit(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let sim = cluster();
    let storage = tempfile::tempdir().expect("a temporary directory");
    let run = RunConfig::default().storage_path(storage.path().display().to_string());
    c.bench_function("torch_fit/64_workers", |b| {
        b.to_async(&runtime).iter(|| async {
            let result = Trainer::builder(Arc::new(sim.clone()))
                .backend(&TorchConfig::default())
                .scaling_config(ScalingConfig::default().num_workers(64))
                .run_config(run.clone())
                .executor_options(ExecutorOptions {
                    poll_interval: Duration::from_millis(1),
                    ..ExecutorOptions::default()
                })
                .fit(&TaskSpec::function("train", Value::Null))
                .await
                .expect("fit");
            assert_eq!(result.returns.len(), 64);
        });
    });
}

/// The whole executor at scale: 1 000 and 10 000 simulated workers, to see that the cost
/// grows about linearly (a tenfold run should take about ten times as long).
fn fit_at_scale(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let functions = FunctionRegistry::new().register("noop", |_| async { Ok(Value::Null) });
    let sim = SimRuntime::new((0..100).map(|i| {
        SimNode::new(&format!("node-{i}"))
            .ip(&format!("10.0.{}.{}", i / 256, i % 256))
            .cpus(128)
    }))
    .with_functions(functions);
    let storage = tempfile::tempdir().expect("a temporary directory");
    let run = RunConfig::default().storage_path(storage.path().display().to_string());
    let mut group = c.benchmark_group("fit_at_scale");
    for workers in [1_000u32, 10_000] {
        group.bench_function(format!("{workers}_workers"), |b| {
            b.to_async(&runtime).iter(|| async {
                let task = TaskSpec::function("noop", Value::Null);
                let result = Trainer::builder(Arc::new(sim.clone()))
                    .backend(&NoBackend)
                    .scaling_config(ScalingConfig::default().num_workers(workers))
                    .run_config(run.clone())
                    .executor_options(ExecutorOptions {
                        poll_interval: Duration::from_millis(1),
                        ..ExecutorOptions::default()
                    })
                    .fit(&task)
                    .await
                    .expect("fit");
                assert_eq!(result.returns.len(), workers as usize);
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Defaults only: criterion's flags (`cargo bench -- --sample-size 50`) override them.
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(5));
    targets = fit, fit_at_scale
}
criterion_main!(benches);
