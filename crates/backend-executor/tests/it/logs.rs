//! What the executor logs, read back through this test binary's one global subscriber
//! ([`trainyard_test_support::logs`]: every test here calls [`capture`] before anything else).

use std::sync::Arc;
use std::time::Duration;

use crate::common;

use serde_json::{Value, json};
use trainyard_backend_executor::{Backend, BackendError, BackendExecutor, ExecutorOptions};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::{ActorRuntime, FunctionRegistry, TaskSpec};
use trainyard_test_support::logs::{LevelFilter, capture, captured};
use trainyard_worker_group::WorkerGroup;

/// A backend whose shutdown hook always fails, as when it calls workers that have died.
#[derive(Debug)]
struct FailingShutdown;

#[async_trait::async_trait]
impl Backend for FailingShutdown {
    fn name(&self) -> &str {
        "failing-shutdown"
    }

    async fn on_shutdown(&self, group: &WorkerGroup) -> Result<(), BackendError> {
        Err(BackendError::Config {
            backend: self.name().to_owned(),
            reason: format!("{} workers are gone", group.len()),
        })
    }
}

#[tokio::test]
async fn a_failing_backend_shutdown_is_logged_and_everything_is_still_released() {
    capture(LevelFilter::WARN);
    let sim = common::one_node(
        2,
        FunctionRegistry::new().register("one", |_| async { Ok(json!(1)) }),
    );
    let storage = tempfile::tempdir().expect("a temporary directory");
    let executor = BackendExecutor {
        backend: Arc::new(FailingShutdown),
        scaling: ScalingConfig::default().num_workers(2),
        run: RunConfig::default().storage_path(storage.path().display().to_string()),
        options: ExecutorOptions {
            poll_interval: Duration::from_millis(2),
            ..ExecutorOptions::default()
        },
        ..BackendExecutor::new(Arc::new(sim.clone()))
    };
    let report = executor
        .fit(&TaskSpec::function("one", Value::Null))
        .await
        .expect("training itself succeeds");
    assert_eq!(report.returns, [json!(1), json!(1)]);
    assert_eq!(sim.placement_group_count(), 0, "a placement group leaked");
    assert!(sim.live_actors().is_empty(), "{:?}", sim.live_actors());
    let cluster = sim.cluster().await.expect("cluster");
    assert_eq!(
        cluster.available(),
        cluster.total(),
        "everything is released"
    );
    let text = captured();
    let warning: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("graceful shutdown of the backend failed"))
        .collect();
    assert_eq!(warning.len(), 1, "logged once: {text}");
    assert!(warning[0].contains("WARN"), "{text}");
    assert!(
        warning[0].contains("backend `failing-shutdown` is misconfigured: 2 workers are gone"),
        "the backend's error is in the log: {text}"
    );
}
