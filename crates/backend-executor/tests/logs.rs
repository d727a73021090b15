//! What the executor logs, read back through this test binary's one global subscriber.
//!
//! Every test here calls [`capture`] before anything else. tracing decides once per log
//! statement whether anyone listens, and with a thread-local subscriber (`set_default`) it
//! asks only the thread that reaches the statement first: when another test's thread gets
//! there first, the statement stays off for every thread, and the test that listens sees
//! nothing. One global subscriber, installed before any test logs, listens on every thread;
//! each test reads back what was logged on its own thread, where its `#[tokio::test]`
//! runtime runs every task. So the outcome depends neither on the order of the tests nor on
//! the runner (`cargo test` runs them as threads of one process, nextest one per process).

use std::cell::RefCell;
use std::sync::{Arc, Once};
use std::time::Duration;

mod common;

use serde_json::{Value, json};
use trainyard_backend_executor::{Backend, BackendError, BackendExecutor, ExecutorOptions};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::{ActorRuntime, FunctionRegistry, TaskSpec};
use trainyard_worker_group::WorkerGroup;

thread_local! {
    /// What was logged on this thread since it called [`capture`].
    static LOGGED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Writes into [`LOGGED`] of the thread that logs, when that thread captures.
struct ThisThread;

impl std::io::Write for ThisThread {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        LOGGED.with_borrow_mut(|logged| {
            if let Some(logged) = logged {
                logged.extend_from_slice(bytes);
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the global subscriber (warnings and above, once per process) and starts
/// capturing what this thread logs.
fn capture() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| ThisThread)
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("nothing else in this test binary sets a subscriber");
    });
    LOGGED.with_borrow_mut(|logged| *logged = Some(Vec::new()));
}

/// What this thread logged since it called [`capture`].
fn captured() -> String {
    let bytes = LOGGED.with_borrow(|logged| logged.clone().unwrap_or_default());
    String::from_utf8(bytes).expect("UTF-8")
}

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
    capture();
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
