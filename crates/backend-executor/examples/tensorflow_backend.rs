//! A custom backend outside the crate: TensorFlow's `TF_CONFIG`.
//!
//! Every worker gets the same cluster spec (`{"cluster": {"worker": ["ip:port", ...]}}`) and
//! its own task index, as Ray Train's TensorFlow backend does. Run with
//! `cargo run -p trainyard-backend-executor --example tensorflow_backend`.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::try_join_all;
use serde_json::json;
use trainyard_backend_executor::{
    Backend, BackendContext, BackendError, BackendExecutor, FitReport, WorkerEnv,
};
use trainyard_config::ScalingConfig;
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{FunctionRegistry, Request, Response, TaskSpec};

/// Sets `TF_CONFIG` for `tf.distribute.MultiWorkerMirroredStrategy`.
#[derive(Debug, Default)]
struct TensorflowBackend;

#[async_trait]
impl Backend for TensorflowBackend {
    fn name(&self) -> &str {
        "tensorflow"
    }

    async fn on_start(&self, ctx: BackendContext<'_>) -> Result<WorkerEnv, BackendError> {
        let group = ctx.group;
        let ports = (0..group.len()).map(|i| group.execute_single(i, Request::FindFreePort));
        let ports = try_join_all(ports)
            .await
            .map_err(|source| BackendError::workers(self.name().to_owned(), source))?;
        let addresses: Vec<String> = group
            .workers()
            .iter()
            .zip(ports)
            .enumerate()
            .map(|(i, (worker, port))| match port {
                Response::Port { port } => Ok(format!("{}:{port}", worker.metadata.node_ip)),
                _ => Err(BackendError::Protocol {
                    backend: "tensorflow".to_owned(),
                    worker: i,
                    reason: "find_free_port was not answered with a port".to_owned(),
                }),
            })
            .collect::<Result<_, _>>()?;
        Ok(ctx
            .ranks
            .iter()
            .map(|rank| {
                let tf_config = json!({
                    "cluster": {"worker": addresses},
                    "task": {"type": "worker", "index": rank.world_rank.0},
                });
                BTreeMap::from([("TF_CONFIG".to_owned(), tf_config.to_string())])
            })
            .collect())
    }
}

/// Runs four workers on two simulated nodes; each returns the `TF_CONFIG` it saw.
async fn run(num_workers: u32) -> Result<FitReport, Box<dyn std::error::Error>> {
    let functions = FunctionRegistry::new().register("tf_config", |task| async move {
        let raw = task.var("TF_CONFIG").ok_or("TF_CONFIG is not set")?;
        serde_json::from_str(raw).map_err(|e| e.to_string())
    });
    let cluster = SimRuntime::new([
        SimNode::new("node-a").ip("10.0.0.1").cpus(2),
        SimNode::new("node-b").ip("10.0.0.2").cpus(2),
    ])
    .with_functions(functions);
    let task = TaskSpec::Function {
        name: "tf_config".into(),
        arg: json!(null),
        env: BTreeMap::new(),
    };
    let mut executor = BackendExecutor::new(
        Arc::new(cluster),
        Arc::new(TensorflowBackend),
        ScalingConfig::default().num_workers(num_workers),
    )?;
    Ok(executor.fit(&task).await?)
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
        let indexes: BTreeSet<u64> = report
            .returns
            .iter()
            .map(|c| c["task"]["index"].as_u64().expect("an index"))
            .collect();
        assert_eq!(indexes, BTreeSet::from([0, 1, 2, 3]));
        assert!(report.returns.iter().all(|c| c["task"]["type"] == "worker"));
    }
}
