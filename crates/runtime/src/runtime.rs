//! The [`ActorRuntime`] trait: the seam between trainyard's scheduling logic and whatever
//! runs its workers.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use trainyard_config::PlacementGroupFactory;
use trainyard_resources::ActorOptions;

use crate::events::TaskEvents;
use crate::{
    ActorId, AttemptNumber, ClusterSnapshot, Endpoint, NodeId, PlacementGroupId, PollResult,
    Request, Response, RuntimeError, TaskSpec, WorkerInfo,
};

/// Everything needed to start one actor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorSpec {
    /// A name for logs and errors (such as `worker-3`).
    pub name: String,
    /// What the actor holds while it lives.
    pub options: ActorOptions,
    /// The placement group and bundle the actor is pinned to; `None` schedules it anywhere.
    pub placement: Option<(PlacementGroupId, usize)>,
    /// Environment variables of the actor's process and of every task it runs.
    pub env: BTreeMap<String, String>,
}

/// Where each bundle of a ready placement group was put.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementInfo {
    /// The node of each bundle, in bundle order.
    pub bundle_nodes: Vec<NodeId>,
}

/// A place that runs actors: a simulated cluster, this machine, a Ray cluster.
///
/// Object safe; used as `Arc<dyn ActorRuntime>`. Every implementation shares the placement
/// semantics of [`crate::placement`] and passes the conformance suite.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait ActorRuntime: Send + Sync + Debug + 'static {
    /// The nodes with their total and available resources.
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError>;

    /// Asks for a placement group. Fails at once with [`RuntimeError::Infeasible`] when the
    /// group can never fit on the cluster as it is; otherwise it becomes ready when the
    /// resources are free (all bundles at once, or none).
    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError>;

    /// Waits up to `timeout` for the group to be reserved.
    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError>;

    /// Releases the group's reservation; actors still in it are killed.
    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError>;

    /// Starts an actor and returns once it can take calls.
    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError>;

    /// Sends one request to an actor and waits for its answer.
    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError>;

    /// Stops an actor: asks it to exit, and kills it after `grace`. Killing an actor that is
    /// already dead succeeds.
    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError>;

    /// The actor's task events, pushed as they happen: reports, output lines, the end of
    /// each task, and the actor's death. Events from before the call are kept (in a bounded
    /// buffer) for it. One stream per actor: a second call may fail.
    ///
    /// A runtime that can only be polled returns `Ok(None)` (the default), and callers use
    /// [`events::polled_events`](crate::events::polled_events) instead, as
    /// [`events::subscribe`](crate::events::subscribe) does.
    async fn task_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        let _ = actor;
        Ok(None)
    }

    /// Waits at most `timeout` for what is free on the cluster to change (another run
    /// released or took resources, a node joined or left), for runtimes that can tell
    /// sooner than a look at [`ActorRuntime::cluster`] every `timeout` would. Elastic runs
    /// look for room to grow when it returns. The default waits out the timeout.
    async fn free_changed(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
    }

    /// Where this runtime's workers reach the driver (an agent runtime's hub), for messages
    /// that name it; `None` (the default) where there is no such address.
    fn driver_address(&self) -> Option<Endpoint> {
        None
    }
}

/// Typed helpers over [`ActorRuntime::call`], for every runtime.
#[async_trait]
pub trait ActorRuntimeExt: ActorRuntime {
    /// [`Request::NodeInfo`].
    async fn node_info(&self, actor: ActorId) -> Result<WorkerInfo, RuntimeError> {
        match self.call(actor, Request::NodeInfo).await? {
            Response::NodeInfo(info) => Ok(info),
            _ => Err(RuntimeError::UnexpectedResponse {
                actor,
                request: "node_info",
            }),
        }
    }

    /// [`Request::FindFreePort`].
    async fn find_free_port(&self, actor: ActorId) -> Result<u16, RuntimeError> {
        match self.call(actor, Request::FindFreePort).await? {
            Response::Port { port } => Ok(port),
            _ => Err(RuntimeError::UnexpectedResponse {
                actor,
                request: "find_free_port",
            }),
        }
    }

    /// [`Request::SetEnv`].
    async fn set_env(
        &self,
        actor: ActorId,
        vars: BTreeMap<String, String>,
    ) -> Result<(), RuntimeError> {
        expect_done(
            actor,
            "set_env",
            self.call(actor, Request::SetEnv { vars }).await?,
        )
    }

    /// [`Request::RunTask`] for the first attempt ([`AttemptNumber`]'s default), as an
    /// actor that runs one task does; the task's process id when it has one of its own.
    async fn run_task(&self, actor: ActorId, task: TaskSpec) -> Result<Option<u32>, RuntimeError> {
        self.run_attempt(actor, AttemptNumber::default(), task)
            .await
    }

    /// [`Request::RunTask`] for `attempt`; the task's process id when it has one of its own.
    async fn run_attempt(
        &self,
        actor: ActorId,
        attempt: AttemptNumber,
        task: TaskSpec,
    ) -> Result<Option<u32>, RuntimeError> {
        match self.call(actor, Request::RunTask { attempt, task }).await? {
            Response::TaskStarted { pid } => Ok(pid),
            _ => Err(RuntimeError::UnexpectedResponse {
                actor,
                request: "run_task",
            }),
        }
    }

    /// [`Request::Poll`].
    async fn poll(&self, actor: ActorId) -> Result<PollResult, RuntimeError> {
        match self.call(actor, Request::Poll).await? {
            Response::Poll(result) => Ok(result),
            _ => Err(RuntimeError::UnexpectedResponse {
                actor,
                request: "poll",
            }),
        }
    }

    /// [`Request::Stacks`].
    async fn stacks(&self, actor: ActorId) -> Result<crate::stacks::TaskStacks, RuntimeError> {
        match self.call(actor, Request::Stacks).await? {
            Response::Stacks(stacks) => Ok(stacks),
            _ => Err(RuntimeError::UnexpectedResponse {
                actor,
                request: "stacks",
            }),
        }
    }

    /// [`Request::Stop`].
    async fn stop(&self, actor: ActorId) -> Result<(), RuntimeError> {
        expect_done(actor, "stop", self.call(actor, Request::Stop).await?)
    }

    /// [`Request::StopTask`].
    async fn stop_task(&self, actor: ActorId) -> Result<(), RuntimeError> {
        expect_done(
            actor,
            "stop_task",
            self.call(actor, Request::StopTask).await?,
        )
    }
}

impl<T: ActorRuntime + ?Sized> ActorRuntimeExt for T {}

fn expect_done(
    actor: ActorId,
    request: &'static str,
    response: Response,
) -> Result<(), RuntimeError> {
    match response {
        Response::Done => Ok(()),
        _ => Err(RuntimeError::UnexpectedResponse { actor, request }),
    }
}
