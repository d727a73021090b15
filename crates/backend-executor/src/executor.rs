//! [`BackendExecutor`]: what a run is made of, and [`BackendExecutor::fit`], which opens
//! the run's folder and hands everything to the run loop.

use std::sync::Arc;

use tokio::sync::mpsc::Sender;
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::{ActorRuntime, TaskSpec};

use crate::options::{ExecutorOptions, unique_run_name};
use crate::report::{FitReport, RunEvent};
use crate::reporter::{Reporter, Reporters};
use crate::run_loop::{Controls, RunLoop};
use crate::setup::Setup;
use crate::sink::Sink;
use crate::triggers::{StacksTrigger, StopTrigger};
use crate::{Backend, ExecutorError, NoBackend};

/// A training run on one [`ActorRuntime`] through one [`Backend`]: the configuration is
/// data (fill in what differs from [`BackendExecutor::new`]'s defaults), and
/// [`fit`](BackendExecutor::fit) runs it.
///
/// ```
/// use std::sync::Arc;
/// use trainyard_backend_executor::BackendExecutor;
/// use trainyard_config::ScalingConfig;
/// use trainyard_runtime::sim::{SimNode, SimRuntime};
///
/// let cluster = Arc::new(SimRuntime::new([SimNode::new("node-a").cpus(2)]));
/// let executor = BackendExecutor {
///     scaling: ScalingConfig::default().num_workers(2),
///     ..BackendExecutor::new(cluster)
/// };
/// assert_eq!(executor.scaling.num_workers.max(), 2);
/// ```
#[derive(Debug)]
pub struct BackendExecutor {
    /// Where the workers run.
    pub runtime: Arc<dyn ActorRuntime>,
    /// The framework's hooks ([`NoBackend`] by default).
    pub backend: Arc<dyn Backend>,
    /// How many workers, and what each needs (one CPU worker by default).
    pub scaling: ScalingConfig,
    /// The run's name, failure policy, storage and environment.
    pub run: RunConfig,
    /// The knobs, with Ray Train's defaults.
    pub options: ExecutorOptions,
    /// Where [`RunEvent`]s go as they happen. The channel is bounded: when it is full,
    /// output lines are dropped and counted ([`RunEvent::LogsDropped`]); every other event
    /// waits for room, so a listener that stops reading holds the run back.
    pub events: Option<Sender<RunEvent>>,
    /// What takes the run's events besides the listener, in order: the console, a webhook,
    /// a tracker of your own. Those its run config asks for (TensorBoard's
    /// [`tensorboard_dir`](RunConfig::tensorboard_dir), MLflow's
    /// [`mlflow`](RunConfig::mlflow)) are added after these.
    pub reporters: Vec<Box<dyn Reporter>>,
    /// Captures and streams every rank's stacks ([`RunEvent::Stacks`]) whenever pulled
    /// while an attempt runs, stopping nothing.
    pub stacks_trigger: StacksTrigger,
    /// Stops the run gracefully when pulled: see [`StopTrigger`].
    pub stop_trigger: StopTrigger,
}

impl BackendExecutor {
    /// A run on `runtime` with the defaults: no backend, one CPU worker, the default run
    /// config and knobs, no listener.
    #[must_use]
    pub fn new(runtime: Arc<dyn ActorRuntime>) -> Self {
        Self {
            runtime,
            backend: Arc::new(NoBackend),
            scaling: ScalingConfig::default(),
            run: RunConfig::default(),
            options: ExecutorOptions::default(),
            events: None,
            reporters: Vec::new(),
            stacks_trigger: StacksTrigger::new(),
            stop_trigger: StopTrigger::new(),
        }
    }

    /// Runs `task` on every worker to completion with the run's failure policy (Ray Train
    /// v2's `max_failures`: N restarts, unlimited with `None`): a failed attempt shuts
    /// everything down, releases the placement group, waits out the [restart
    /// backoff](ExecutorOptions::restart_backoff) if the run is in a crash loop (after an
    /// attempt that made progress it does not wait) and starts again from scratch, with
    /// `TRAINYARD_RESTART_COUNT` one higher. A failure that [`classify`](crate::classify)
    /// calls fatal ends the run at once, whatever the budget. The run gets a [unique
    /// name](unique_run_name) unless its run config names it. Nothing is left reserved or
    /// running afterwards.
    ///
    /// # Errors
    /// [`ExecutorError::Config`] when the scaling or run config is invalid;
    /// [`ExecutorError::TrainingFailed`] when failures exceed the policy or one is fatal, or a
    /// fatal error (cannot be scheduled, backend misconfigured, storage unusable) at once;
    /// [`ExecutorError::Interrupted`] when the [stop trigger](Self::stop_trigger) was pulled.
    pub async fn fit(self, task: &TaskSpec) -> Result<FitReport, ExecutorError> {
        let mut reporters = self.reporters;
        reporters.extend(crate::reporters::configured(&self.run));
        let sink = Sink::new(self.events, Reporters::new(reporters));
        let controls = Controls {
            sink: sink.clone(),
            stacks: self.stacks_trigger,
            stop: self.stop_trigger,
        };
        let run = async {
            self.scaling.validate()?;
            self.run.validate()?;
            let run_name = self.run.name.clone().unwrap_or_else(unique_run_name);
            let setup = Setup {
                runtime: self.runtime,
                backend: self.backend,
                scaling: self.scaling,
                run: self.run,
                run_name,
                options: self.options,
            };
            RunLoop::open(setup, controls).await?.run(task).await
        };
        let result = run.await;
        sink.emit(RunEvent::end_of(&result)).await;
        sink.finish().await;
        result
    }
}
