//! What the torch backend logs, read back through this test binary's one global subscriber
//! ([`trainyard_test_support::logs`]: every test here calls [`capture`] before anything else).
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use trainyard_backend_executor::{BackendConfig, BackendExecutor, ExecutorOptions};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{FunctionRegistry, TaskSpec};
use trainyard_test_support::logs::{LevelFilter, capture, captured};
use trainyard_torch_backend::TorchConfig;

#[tokio::test]
async fn rank_zero_logs_the_process_group_setup_as_ray_does() {
    capture(LevelFilter::INFO);
    let sim = SimRuntime::new([
        SimNode::new("node-a").ip("10.0.0.1").cpus(4),
        SimNode::new("node-b").ip("10.0.0.2").cpus(4),
    ])
    .with_functions(FunctionRegistry::with_builtins());
    let storage = tempfile::tempdir().expect("a temporary directory");
    let run = RunConfig::default().storage_path(storage.path().display().to_string());
    BackendExecutor {
        backend: TorchConfig::default().build(),
        scaling: ScalingConfig::default().num_workers(2),
        run,
        options: ExecutorOptions {
            poll_interval: Duration::from_millis(2),
            ..ExecutorOptions::default()
        },
        ..BackendExecutor::new(Arc::new(sim))
    }
    .fit(&TaskSpec::Function {
        name: "trainyard.env".to_owned(),
        arg: Value::Null,
        env: BTreeMap::new(),
    })
    .await
    .expect("the run succeeds");
    let text = captured();
    let setup: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Setting up process group"))
        .collect();
    assert_eq!(setup.len(), 1, "only rank 0 logs at info level: {text}");
    assert!(
        setup[0].contains("Setting up process group for: env:// [rank=0, world_size=2]"),
        "{text}"
    );
    assert!(
        text.contains("Started distributed worker processes:"),
        "{text}"
    );
    assert!(
        text.contains("world_rank=1, local_rank=1, node_rank=0"),
        "{text}"
    );
}
