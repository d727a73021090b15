//! A custom backend built on trainyard: TensorFlow's `TF_CONFIG`.
//!
//! Every worker gets the same cluster spec (`{"cluster": {"worker": ["ip:port", ...]}}`) and
//! its own task index, as Ray Train's TensorFlow backend does. It runs on the simulated
//! cluster:
//!
//! ```sh
//! cargo run --example tensorflow_backend --features sim
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use trainyard::async_trait;
use trainyard::backend::{Backend, BackendContext, BackendError, WorkerEnv};
use trainyard::prelude::*;
use trainyard::runtime::sim::{SimNode, SimRuntime};

/// Sets `TF_CONFIG` for `tf.distribute.MultiWorkerMirroredStrategy`.
#[derive(Debug, Clone, Default)]
struct TensorflowBackend;

#[async_trait]
impl Backend for TensorflowBackend {
    fn name(&self) -> &str {
        "tensorflow"
    }

    async fn on_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
        let workers: Vec<String> = ctx
            .worker_addresses()
            .await?
            .iter()
            .map(ToString::to_string)
            .collect();
        Ok(ctx
            .ranks
            .iter()
            .map(|rank| {
                let tf_config = json!({
                    "cluster": {"worker": workers},
                    "task": {"type": "worker", "index": rank.world_rank.0},
                });
                BTreeMap::from([("TF_CONFIG".to_owned(), tf_config.to_string())])
            })
            .collect())
    }
}

/// Runs `num_workers` workers on two simulated nodes; each returns the `TF_CONFIG` it saw.
async fn run(num_workers: u32) -> trainyard::Result<FitReport> {
    let functions = FunctionRegistry::new().register("tf_config", |task| async move {
        let raw = task.var("TF_CONFIG").ok_or("TF_CONFIG is not set")?;
        serde_json::from_str(raw).map_err(|e| e.to_string())
    });
    let cluster = SimRuntime::new([
        SimNode::new("node-a").ip("10.0.0.1").cpus(2),
        SimNode::new("node-b").ip("10.0.0.2").cpus(2),
    ])
    .with_functions(functions);
    Trainer::builder(Arc::new(cluster))
        .backend(&TensorflowBackend)
        .scaling_config(ScalingConfig::default().num_workers(num_workers))
        .fit(&TaskSpec::function("tf_config", Value::Null))
        .await
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    for (rank, tf_config) in run(4).await?.returns.iter().enumerate() {
        println!("rank {rank}: TF_CONFIG={tf_config}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[tokio::test]
    async fn every_worker_sees_the_same_cluster_and_a_unique_task_index() {
        let report = run(4).await.expect("the run succeeds");
        assert_eq!(report.returns.len(), 4);
        let clusters: BTreeSet<String> = report
            .returns
            .iter()
            .map(|c| c["cluster"].to_string())
            .collect();
        assert_eq!(clusters.len(), 1, "cluster specs differ: {clusters:?}");
        let workers = report.returns[0]["cluster"]["worker"]
            .as_array()
            .expect("a worker list");
        assert_eq!(workers.len(), 4);
        assert!(
            workers
                .iter()
                .filter_map(Value::as_str)
                .all(|w| w.starts_with("10.0.0.1:") || w.starts_with("10.0.0.2:")),
            "{workers:?}"
        );
        let indexes: BTreeSet<u64> = report
            .returns
            .iter()
            .map(|c| c["task"]["index"].as_u64().expect("an index"))
            .collect();
        assert_eq!(indexes, BTreeSet::from([0, 1, 2, 3]));
        assert!(report.returns.iter().all(|c| c["task"]["type"] == "worker"));
    }
}
