//! The scenario that made `memory` a first-class per-worker resource: two PyTorch workers,
//! each asking for `{"memory": 10000}` (bytes), trained with a `TorchConfig` backend on this machine.
//!
//! Ray once refused `resources_per_worker={"memory": ...}`; here the dictionary goes to the
//! worker group as it is, `memory` becomes the actor option it is, and each worker sees the
//! torch environment.
//!
//! ```sh
//! cargo run --example seed_memory
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{Value, json};
use trainyard::prelude::*;

/// The training function every worker runs: it checks its torch environment and reports.
fn functions() -> FunctionRegistry {
    FunctionRegistry::new().register("train", |task| async move {
        let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
        let var = |name: &str| ctx.var(name).unwrap_or("unset").to_owned();
        ctx.print(format!(
            "RANK={} LOCAL_RANK={} WORLD_SIZE={} MASTER_ADDR={} MASTER_PORT={}",
            var("RANK"),
            var("LOCAL_RANK"),
            var("WORLD_SIZE"),
            var("MASTER_ADDR"),
            var("MASTER_PORT")
        ));
        let metrics =
            json!({"rank": ctx.world_rank().0, "loss": 1.0 / f64::from(ctx.world_rank().0 + 1)});
        ctx.report(metrics).map_err(|e| e.to_string())?;
        Ok(json!(ctx.world_rank().0))
    })
}

fn main() -> ExitCode {
    if let Some(code) = trainyard::run_if_agent(functions()) {
        return code;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(train()) {
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

async fn train() -> Result<(), Box<dyn std::error::Error>> {
    let local = LocalRuntime::start(LocalConfig::detect("seed-memory")?).await?;
    let scaling = ScalingConfig::default()
        .num_workers(2)
        .resources_per_worker(r#"{"memory": 10000}"#.parse()?);
    let (events, mut received) = tokio::sync::mpsc::channel(1024);
    let printer = tokio::spawn(async move {
        while let Some(event) = received.recv().await {
            if let RunEvent::Log {
                rank, pid, line, ..
            } = event
            {
                println!("(rank={rank}, pid={pid}) {line}");
            }
        }
    });
    let result = Trainer::builder(Arc::new(local.clone()))
        .backend(&TorchConfig::default())
        .scaling_config(scaling)
        .events(events)
        .fit(&TaskSpec::function("train", Value::Null))
        .await;
    local.shutdown().await;
    let _ = printer.await;
    let result = result?;
    println!("returns: {:?}", result.returns);
    println!("last report: {:?}", result.last_report);
    Ok(())
}
