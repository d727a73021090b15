//! A data-parallel toy on this machine: every worker takes its shard of the data, fits a
//! line to it by gradient descent for a few epochs, and reports its loss each epoch; the
//! driver combines the ranks' final reports.
//!
//! ```sh
//! cargo run --example data_parallel -- 3
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{Value, json};
use trainyard::prelude::*;

/// Points of y = 3x + 1, x in [0, 1).
const POINTS: u32 = 10_000;
const EPOCHS: u32 = 5;

fn train_shard(rank: u32, world: u32) -> impl Iterator<Item = (f64, f64)> {
    (0..POINTS).filter(move |i| i % world == rank).map(|i| {
        let x = f64::from(i) / f64::from(POINTS);
        (x, 3.0 * x + 1.0)
    })
}

fn functions() -> FunctionRegistry {
    FunctionRegistry::new().register("fit_line", |task| async move {
        let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
        let (rank, world) = (ctx.world_rank().0, ctx.world_size());
        let (mut w, mut b) = (0.0_f64, 0.0_f64);
        let mut loss = f64::NAN;
        for epoch in 0..EPOCHS {
            for _ in 0..200 {
                let (mut gw, mut gb, mut n) = (0.0, 0.0, 0.0);
                for (x, y) in train_shard(rank, world) {
                    let err = w * x + b - y;
                    gw += err * x;
                    gb += err;
                    n += 1.0;
                }
                w -= 0.5 * gw / n;
                b -= 0.5 * gb / n;
            }
            let (mut total, mut n) = (0.0, 0.0);
            for (x, y) in train_shard(rank, world) {
                total += (w * x + b - y).powi(2);
                n += 1.0;
            }
            loss = total / n;
            let metrics = json!({"epoch": epoch, "loss": loss, "w": w, "b": b});
            ctx.report(metrics).map_err(|e| e.to_string())?;
        }
        ctx.print(format!("rank {rank}: w={w:.3} b={b:.3} loss={loss:.2e}"));
        Ok(json!({"w": w, "b": b}))
    })
}

fn main() -> ExitCode {
    if let Some(code) = trainyard::run_if_agent(functions()) {
        return code;
    }
    let workers: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(train(workers)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "error: {}",
                trainyard::resources::ErrorChain(error.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

async fn train(workers: u32) -> Result<(), Box<dyn std::error::Error>> {
    let local = LocalRuntime::start(LocalConfig::detect("data-parallel")?).await?;
    let (events, mut received) = tokio::sync::mpsc::channel(1024);
    let printer = tokio::spawn(async move {
        while let Some(event) = received.recv().await {
            match event {
                RunEvent::Log {
                    rank, pid, line, ..
                } => println!("(rank={rank}, pid={pid}) {line}"),
                RunEvent::Report { rank, metrics, .. } => {
                    println!("(rank={rank}) report {}", Value::Object(metrics))
                }
                _ => {}
            }
        }
    });
    let scaling = ScalingConfig::default()
        .num_workers(workers)
        .resources_per_worker("CPU=0.5,memory=64MiB".parse()?);
    let result = Trainer::builder(Arc::new(local.clone()))
        .backend(&NoBackend)
        .scaling_config(scaling)
        .events(events)
        .fit(&TaskSpec::function("fit_line", Value::Null))
        .await;
    local.shutdown().await;
    let _ = printer.await;
    let result = result?;
    let n = result.returns.len() as f64;
    let w: f64 = result
        .returns
        .iter()
        .filter_map(|r| r["w"].as_f64())
        .sum::<f64>()
        / n;
    let b: f64 = result
        .returns
        .iter()
        .filter_map(|r| r["b"].as_f64())
        .sum::<f64>()
        / n;
    println!(
        "averaged over {} ranks: y = {w:.3}x + {b:.3} (truth: y = 3x + 1)",
        result.returns.len()
    );
    Ok(())
}
