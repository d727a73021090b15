//! [`Setup`]: what every attempt of a run is made with, shared by the run loop, its attempts
//! and the crew of workers they run on.

use std::sync::Arc;

use tracing::warn;
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::{ActorRuntime, PlacementGroupId};

use crate::Backend;
use crate::options::ExecutorOptions;

/// What every attempt of a run is made with: the runtime, the backend and the run's
/// configuration.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) runtime: Arc<dyn ActorRuntime>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) scaling: ScalingConfig,
    pub(crate) run: RunConfig,
    /// The run's name (its folder's: `name-2` under `resume: never`).
    pub(crate) run_name: String,
    pub(crate) options: ExecutorOptions,
}

impl Setup {
    /// Removes a placement group, logging what went wrong.
    pub(crate) async fn remove_placement_group(&self, pg: PlacementGroupId) {
        let limit = self.options.health_check_timeout;
        match tokio::time::timeout(limit, self.runtime.remove_placement_group(pg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(%pg, error = %e, "removing the placement group failed"),
            Err(_) => warn!(%pg, "removing the placement group timed out"),
        }
    }
}
