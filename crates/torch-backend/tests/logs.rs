//! What the torch backend logs, read back through this test binary's one global subscriber.
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
use std::collections::BTreeMap;
use std::sync::{Arc, Once};
use std::time::Duration;

use serde_json::Value;
use trainyard_backend_executor::{BackendConfig, BackendExecutor, ExecutorOptions};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{FunctionRegistry, TaskSpec};
use trainyard_torch_backend::TorchConfig;

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

/// Installs the global subscriber (info and above, once per process) and starts capturing
/// what this thread logs.
fn capture() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| ThisThread)
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
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

#[tokio::test]
async fn rank_zero_logs_the_process_group_setup_as_ray_does() {
    capture();
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
