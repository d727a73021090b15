use std::sync::Arc;

use tokio::sync::mpsc::Sender;
use trainyard_backend_executor::{
    BackendConfig, BackendExecutor, ExecutorError, ExecutorOptions, FitReport, Reporter, RunEvent,
    StacksTrigger, StopTrigger,
};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::{ActorRuntime, TaskSpec};

use crate::Result;

/// A training run: a runtime, a backend, a scaling config, a run config and the knobs.
///
/// Start from [`Trainer::builder`] (no backend, one CPU worker, the default run config),
/// set what differs, then [`fit`](Trainer::fit) a task:
///
/// ```
/// use std::sync::Arc;
/// use trainyard::prelude::*;
/// use trainyard::runtime::sim::{SimNode, SimRuntime};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> trainyard::Result<()> {
/// let functions = FunctionRegistry::new().register("train", |task| async move {
///     let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
///     ctx.report(serde_json::json!({"rank": ctx.world_rank().0})).map_err(|e| e.to_string())?;
///     Ok(serde_json::json!(ctx.world_rank().0))
/// });
/// let cluster = SimRuntime::new([SimNode::new("node-0").cpus(2)]).with_functions(functions);
/// let result = Trainer::builder(Arc::new(cluster))
///     .backend(&NoBackend)
///     .scaling_config(ScalingConfig::default().num_workers(2))
///     .fit(&TaskSpec::function("train", serde_json::Value::Null))
///     .await?;
/// assert_eq!(result.returns, [serde_json::json!(0), serde_json::json!(1)]);
/// assert_eq!(result.attempts, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Trainer {
    executor: BackendExecutor,
}

impl Trainer {
    /// A trainer on `runtime` with the defaults: no backend
    /// ([`NoBackend`](trainyard_backend_executor::NoBackend)), one CPU worker, the default
    /// run config and knobs.
    #[must_use]
    pub fn builder(runtime: Arc<dyn ActorRuntime>) -> Self {
        Self {
            executor: BackendExecutor::new(runtime),
        }
    }

    /// Sets the backend: a [`Backend`](trainyard_backend_executor::Backend) that is `Clone`
    /// (such as [`NoBackend`](trainyard_backend_executor::NoBackend) or your own), or a
    /// configuration that builds one (such as `TorchConfig`, PyTorch's process-group
    /// environment).
    #[must_use]
    pub fn backend(mut self, backend: &dyn BackendConfig) -> Self {
        self.executor.backend = backend.build();
        self
    }

    /// Sets the scaling config.
    #[must_use]
    pub fn scaling_config(mut self, scaling: ScalingConfig) -> Self {
        self.executor.scaling = scaling;
        self
    }

    /// Sets the run config (name, failure policy, storage, environment).
    #[must_use]
    pub fn run_config(mut self, run: RunConfig) -> Self {
        self.executor.run = run;
        self
    }

    /// Sets the executor's knobs (placement timeout, patience, poll interval).
    #[must_use]
    pub fn executor_options(mut self, options: ExecutorOptions) -> Self {
        self.executor.options = options;
        self
    }

    /// Streams reports, log lines and restarts to `events` as they happen. The channel is
    /// bounded: when it is full, output lines are dropped and counted
    /// ([`RunEvent::LogsDropped`]); every other event waits for room.
    #[must_use]
    pub fn events(mut self, events: Sender<RunEvent>) -> Self {
        self.executor.events = Some(events);
        self
    }

    /// Adds `reporter`: it takes the run's events as they happen, in order, and finishes
    /// before [`fit`](Trainer::fit) returns (see [`Reporter`]).
    #[must_use]
    pub fn reporter(mut self, reporter: Box<dyn Reporter>) -> Self {
        self.executor.reporters.push(reporter);
        self
    }

    /// Captures and streams every rank's stacks ([`RunEvent::Stacks`]) whenever `trigger` is
    /// pulled while the run goes on.
    #[must_use]
    pub fn stacks_trigger(mut self, trigger: StacksTrigger) -> Self {
        self.executor.stacks_trigger = trigger;
        self
    }

    /// Stops the run gracefully when `trigger` is pulled: the tasks are stopped while their
    /// last output is still streamed, and [`fit`](Trainer::fit) returns
    /// `ExecutorError::Interrupted`.
    #[must_use]
    pub fn stop_trigger(mut self, trigger: StopTrigger) -> Self {
        self.executor.stop_trigger = trigger;
        self
    }

    /// Runs `task` on every worker until it finishes, restarting failed attempts as the
    /// run's failure config allows. Nothing is left reserved or running afterwards.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for invalid configs, and
    /// [`Error::Executor`](crate::Error::Executor) when the run cannot be scheduled or fails
    /// beyond `max_failures` (its `TrainingFailed` report names the failed ranks).
    pub async fn fit(self, task: &TaskSpec) -> Result<FitReport> {
        self.executor.fit(task).await.map_err(|e| match e {
            ExecutorError::Config(e) => crate::Error::Config(e),
            other => crate::Error::Executor(other),
        })
    }
}
