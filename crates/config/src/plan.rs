//! [`Plan`]: everything a scaling config resolves to before anything is started.

use serde::Serialize;
use trainyard_resources::{ActorOptions, Resources};

use crate::scaling::total_of;
use crate::{ConfigError, PlacementGroupFactory, ScalingConfig};

/// What a scaling config resolves to: the normalised config, the total reservation, the
/// placement group, and each worker's actor options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The configuration with both dictionaries normalised.
    pub scaling_config: ScalingConfig,
    /// Everything reserved: trainer + workers.
    pub total_resources: Resources,
    /// The bundles and the strategy.
    pub placement_group_factory: PlacementGroupFactory,
    /// One entry per worker, in bundle order.
    pub workers: Vec<WorkerPlan>,
}

/// One worker of a [`Plan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerPlan {
    /// The bundle the worker is pinned to.
    pub bundle_index: usize,
    /// The options the worker actor is started with.
    pub actor_options: ActorOptions,
}

impl ScalingConfig {
    /// Resolves the configuration into a [`Plan`].
    ///
    /// # Errors
    /// As [`ScalingConfig::validate`].
    pub fn plan(&self) -> Result<Plan, ConfigError> {
        let worker = self.worker_resources()?;
        let trainer = self.trainer_bundle()?;
        let actor_options = ActorOptions::try_from(&worker)
            .map_err(ConfigError::resources("resources_per_worker"))?;
        let total_resources = total_of(&worker, trainer.clone(), self.num_workers)?;
        let placement_group_factory = self.factory_of(worker.clone(), trainer.clone())?;
        let workers = (0..placement_group_factory.bundles.len())
            .map(|bundle_index| WorkerPlan {
                bundle_index,
                actor_options: actor_options.clone(),
            })
            .collect();
        Ok(Plan {
            scaling_config: Self {
                resources_per_worker: Some(worker),
                trainer_resources: Some(trainer),
                ..self.clone()
            },
            total_resources,
            placement_group_factory,
            workers,
        })
    }
}
