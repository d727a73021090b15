//! What several test modules of this binary share: a whole `fit` of two workers on a simulated
//! cluster, with the events it streamed.

use std::sync::Arc;
use std::time::Duration;

use trainyard_backend_executor::{
    BackendExecutor, Backoff, ExecutorError, ExecutorOptions, FitReport, RunEvent, StacksTrigger,
};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{ActorRuntime, FunctionRegistry, TaskSpec};

/// One node of four CPUs that serves `functions` (and the built-ins).
pub(crate) fn sim_serving(functions: FunctionRegistry) -> SimRuntime {
    one_node(4, functions)
}

/// One node, `node-0`, of `cpus` CPUs that serves `functions` (and the built-ins).
pub(crate) fn one_node(cpus: u64, functions: FunctionRegistry) -> SimRuntime {
    SimRuntime::new([SimNode::new("node-0").cpus(cpus)])
        .with_functions(FunctionRegistry::with_builtins().merge(functions))
}

/// Runs `task` on two workers of `sim` to its end (restarting at once), with `trigger` for
/// stacks when given; the result, and every event streamed.
pub(crate) async fn fit_two(
    sim: &SimRuntime,
    run: RunConfig,
    task: &TaskSpec,
    trigger: Option<StacksTrigger>,
) -> (Result<FitReport, ExecutorError>, Vec<RunEvent>) {
    fit_two_on(Arc::new(sim.clone()), run, task, trigger, Backoff::NONE).await
}

/// [`fit_two`] on `runtime` (a simulated cluster behind a fault, say), with `backoff` before
/// the restarts of a crash loop.
pub(crate) async fn fit_two_on(
    runtime: Arc<dyn ActorRuntime>,
    run: RunConfig,
    task: &TaskSpec,
    trigger: Option<StacksTrigger>,
    backoff: Backoff,
) -> (Result<FitReport, ExecutorError>, Vec<RunEvent>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(10_000);
    let executor = BackendExecutor {
        scaling: ScalingConfig::default().num_workers(2),
        options: ExecutorOptions {
            restart_backoff: backoff,
            ..ExecutorOptions::default()
        },
        run,
        events: Some(tx),
        stacks_trigger: trigger.unwrap_or_default(),
        ..BackendExecutor::new(runtime)
    };
    let result = tokio::time::timeout(Duration::from_secs(60), executor.fit(task))
        .await
        .expect("the run ends within a minute");
    let mut events = Vec::new();
    while let Ok(event) = rx.try_recv() {
        events.push(event);
    }
    (result, events)
}
