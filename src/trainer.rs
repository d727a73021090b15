use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::mpsc::Sender;
use trainyard_backend_executor::{
    Backend, BackendConfig, BackendExecutor, ExecutorError, ExecutorOptions, FitReport, RunEvent,
    StacksTrigger, StopTrigger,
};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::{ActorRuntime, TaskSpec};

use crate::Result;

/// A task that runs the Rust function registered under `name` with `arg`.
#[must_use]
pub fn function_task(name: impl Into<String>, arg: serde_json::Value) -> TaskSpec {
    TaskSpec::Function {
        name: name.into(),
        arg,
        env: BTreeMap::new(),
    }
}

/// A task that runs `program` with `args` (for example `python train.py`).
#[must_use]
pub fn command_task<I, S>(program: impl Into<String>, args: I) -> TaskSpec
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    TaskSpec::Command {
        program: program.into(),
        args: args.into_iter().map(Into::into).collect(),
        env: BTreeMap::new(),
    }
}

/// A training run: a task, a backend, a scaling config, a run config and a runtime.
///
/// Build one with [`Trainer::new`] (any backend, a custom one included) or
/// [`Trainer::torch`] (PyTorch's environment), set what differs from the defaults, then
/// [`fit`](Trainer::fit):
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
/// let result = Trainer::new(Arc::new(cluster), &NoBackend, function_task("train", serde_json::Value::Null))
///     .scaling_config(ScalingConfig::default().num_workers(2))
///     .fit()
///     .await?;
/// assert_eq!(result.returns, [serde_json::json!(0), serde_json::json!(1)]);
/// assert_eq!(result.attempts, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Trainer {
    runtime: Arc<dyn ActorRuntime>,
    backend: Arc<dyn Backend>,
    task: TaskSpec,
    scaling: ScalingConfig,
    run: RunConfig,
    options: ExecutorOptions,
    events: Option<Sender<RunEvent>>,
    stacks: Option<StacksTrigger>,
    stop: Option<StopTrigger>,
}

impl Trainer {
    /// A trainer running `task` with `backend` on `runtime`, one CPU worker by default.
    ///
    /// `backend` is a [`Backend`] that is `Clone` (such as
    /// [`NoBackend`](trainyard_backend_executor::NoBackend) or your own), or a configuration
    /// that builds one (such as `TorchConfig`).
    #[must_use]
    pub fn new(
        runtime: Arc<dyn ActorRuntime>,
        backend: &dyn BackendConfig,
        task: TaskSpec,
    ) -> Self {
        Self {
            runtime,
            backend: backend.build(),
            task,
            scaling: ScalingConfig::default(),
            run: RunConfig::default(),
            options: ExecutorOptions::default(),
            events: None,
            stacks: None,
            stop: None,
        }
    }

    /// A trainer running `task` on `runtime` with PyTorch's process-group environment (the
    /// default [`TorchConfig`](trainyard_torch_backend::TorchConfig); pass another one to
    /// [`Trainer::new`]).
    #[cfg(feature = "torch")]
    #[must_use]
    pub fn torch(runtime: Arc<dyn ActorRuntime>, task: TaskSpec) -> Self {
        Self::new(
            runtime,
            &trainyard_torch_backend::TorchConfig::default(),
            task,
        )
    }

    /// Sets the scaling config.
    #[must_use]
    pub fn scaling_config(mut self, scaling: ScalingConfig) -> Self {
        self.scaling = scaling;
        self
    }

    /// Sets the run config (name, failure policy, environment).
    #[must_use]
    pub fn run_config(mut self, run: RunConfig) -> Self {
        self.run = run;
        self
    }

    /// Sets the executor's knobs (placement timeout, patience, poll interval).
    #[must_use]
    pub fn executor_options(mut self, options: ExecutorOptions) -> Self {
        self.options = options;
        self
    }

    /// Streams reports, log lines and restarts to `events` as they happen (see
    /// [`BackendExecutor::with_events`]: lines are dropped and counted when the channel is
    /// full; everything else waits for room).
    #[must_use]
    pub fn events(mut self, events: Sender<RunEvent>) -> Self {
        self.events = Some(events);
        self
    }

    /// Captures and streams every rank's stacks ([`RunEvent::Stacks`]) whenever `trigger` is
    /// pulled while the run goes on (see [`BackendExecutor::with_stacks_trigger`]).
    #[must_use]
    pub fn stacks_trigger(mut self, trigger: StacksTrigger) -> Self {
        self.stacks = Some(trigger);
        self
    }

    /// Stops the run gracefully when `trigger` is pulled: the tasks are stopped while their
    /// last output is still streamed, and [`fit`](Trainer::fit) returns
    /// `ExecutorError::Interrupted` (see [`BackendExecutor::with_stop_trigger`]).
    #[must_use]
    pub fn stop_trigger(mut self, trigger: StopTrigger) -> Self {
        self.stop = Some(trigger);
        self
    }

    /// Runs the task on every worker until it finishes, restarting failed attempts as the
    /// run's failure config allows. Nothing is left reserved or running afterwards.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for invalid configs, and
    /// [`Error::Executor`](crate::Error::Executor) when the run cannot be scheduled or fails
    /// beyond `max_failures` (its `TrainingFailed` report names the failed ranks).
    pub async fn fit(self) -> Result<FitReport> {
        let config_error = |e| match e {
            ExecutorError::Config(e) => crate::Error::Config(e),
            other => crate::Error::Executor(other),
        };
        let executor = BackendExecutor {
            backend: self.backend,
            scaling: self.scaling,
            run: self.run,
            options: self.options,
            events: self.events,
            stacks_trigger: self.stacks.unwrap_or_default(),
            stop_trigger: self.stop.unwrap_or_default(),
            ..BackendExecutor::new(self.runtime)
        };
        executor.fit(&self.task).await.map_err(config_error)
    }
}
