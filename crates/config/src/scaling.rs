//! [`ScalingConfig`] and the [`PlacementGroupFactory`] it produces.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use trainyard_resources::{CPU, GPU, ResourceAmount, Resources};

use crate::run::{deserialize_duration, serialize_duration};
use crate::{
    ConfigError, DEFAULT_RESIZE_INTERVAL, NumWorkers, PlacementStrategy, parse_resize_interval,
};

/// Prefix of the tiny constraint resource that pins workers to an accelerator type.
pub const ACCELERATOR_TYPE_PREFIX: &str = "accelerator_type:";

/// The amount of `accelerator_type:<T>` each worker requests: enough to require such a
/// node, too little to limit how many workers fit on it.
pub const ACCELERATOR_TYPE_AMOUNT: ResourceAmount = ResourceAmount::from_steps(10);

/// How many workers to run and what each of them needs.
///
/// Normalisation follows Ray Train: without `resources_per_worker` a worker asks for
/// `{CPU: 1}`, or `{GPU: 1}` (no CPU) with `use_gpu`; a user dictionary replaces that default
/// entirely; zero entries are dropped; `use_gpu` adds `GPU: 1` when missing; and
/// `accelerator_type: T` adds `accelerator_type:T = 0.001`.
///
/// ```
/// use trainyard_config::ScalingConfig;
///
/// let config = ScalingConfig::default()
///     .num_workers(2)
///     .resources_per_worker(r#"{"memory": "10GB"}"#.parse()?);
/// assert_eq!(config.worker_resources()?.to_string(), "memory=10000000000");
/// assert_eq!(config.placement_group_factory()?.bundles.len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScalingConfig {
    /// Number of workers, from 1 to [`MAX_WORKERS`]: fixed, or an elastic range.
    pub num_workers: NumWorkers,
    /// Whether each worker gets a GPU (1 unless `resources_per_worker` says otherwise).
    pub use_gpu: bool,
    /// What each worker requests; `None` means the default (`{CPU: 1}` or `{GPU: 1}`).
    pub resources_per_worker: Option<Resources>,
    /// What the coordinator reserves next to rank 0; `None` and `{}` reserve nothing.
    pub trainer_resources: Option<Resources>,
    /// How bundles are laid over nodes.
    pub placement_strategy: PlacementStrategy,
    /// Accelerator type every worker's node must have (such as `A100`).
    pub accelerator_type: Option<String>,
    /// How often an elastic run looks for room to grow; [`DEFAULT_RESIZE_INTERVAL`] when
    /// `None`. Runtimes that can tell when room appears (the local runtime, from its
    /// ledger) wake the run sooner.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_duration",
        deserialize_with = "deserialize_resize_interval"
    )]
    pub resize_interval: Option<Duration>,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        Self {
            num_workers: NumWorkers::fixed(1),
            use_gpu: false,
            resources_per_worker: None,
            trainer_resources: None,
            placement_strategy: PlacementStrategy::Pack,
            accelerator_type: None,
            resize_interval: None,
        }
    }
}

/// The largest accepted `num_workers`: far beyond any real cluster, and small enough that
/// a plan with one bundle per worker fits in memory.
pub const MAX_WORKERS: u32 = 1_000_000;

/// `value` as a number of workers, when it is in `1..=MAX_WORKERS`.
///
/// ```
/// use trainyard_config::{ConfigError, checked_num_workers};
///
/// assert_eq!(checked_num_workers(4)?, 4);
/// assert!(matches!(
///     checked_num_workers(4_000_000_000),
///     Err(ConfigError::NumWorkersOutOfRange(4_000_000_000))
/// ));
/// # Ok::<(), ConfigError>(())
/// ```
///
/// # Errors
/// [`ConfigError::NumWorkersOutOfRange`] naming the value.
pub fn checked_num_workers(value: i64) -> Result<u32, ConfigError> {
    u32::try_from(value)
        .ok()
        .filter(|n| (1..=MAX_WORKERS).contains(n))
        .ok_or(ConfigError::NumWorkersOutOfRange(value))
}

fn deserialize_resize_interval<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    deserialize_duration(d, parse_resize_interval)
}

/// The bundles of a placement group and how to lay them over nodes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementGroupFactory {
    /// One dictionary per bundle; bundle `i` hosts worker `i`.
    pub bundles: Vec<Resources>,
    /// How the bundles are laid over nodes.
    pub strategy: PlacementStrategy,
}

impl PlacementGroupFactory {
    /// The sum of all bundles.
    ///
    /// # Errors
    /// [`ConfigError::Resources`] when a sum overflows.
    pub fn total_resources(&self) -> Result<Resources, ConfigError> {
        let mut total = Resources::new();
        for bundle in &self.bundles {
            total
                .checked_add_assign(bundle)
                .map_err(ConfigError::resources("bundles"))?;
        }
        Ok(total)
    }
}

/// Trainer + `num_workers` × worker, for an already normalised worker and trainer: the sum
/// of the bundles, without building them.
pub(crate) fn total_of(
    worker: &Resources,
    mut trainer: Resources,
    num_workers: u32,
) -> Result<Resources, ConfigError> {
    let workers = worker
        .checked_mul(u64::from(num_workers))
        .map_err(ConfigError::resources("resources_per_worker"))?;
    trainer
        .checked_add_assign(&workers)
        .map_err(ConfigError::resources("resources_per_worker"))?;
    Ok(trainer)
}

impl ScalingConfig {
    /// Sets `num_workers`: a number (`4`) or an elastic range (`2..=8`).
    #[must_use]
    pub fn num_workers(mut self, num_workers: impl Into<NumWorkers>) -> Self {
        self.num_workers = num_workers.into();
        self
    }

    /// Sets `resize_interval`.
    #[must_use]
    pub fn resize_interval(mut self, interval: Duration) -> Self {
        self.resize_interval = Some(interval);
        self
    }

    /// How often an elastic run looks for room to grow.
    #[must_use]
    pub fn resize_every(&self) -> Duration {
        self.resize_interval.unwrap_or(DEFAULT_RESIZE_INTERVAL)
    }

    /// Sets `use_gpu`.
    #[must_use]
    pub fn use_gpu(mut self, use_gpu: bool) -> Self {
        self.use_gpu = use_gpu;
        self
    }

    /// Sets `resources_per_worker`.
    #[must_use]
    pub fn resources_per_worker(mut self, resources: Resources) -> Self {
        self.resources_per_worker = Some(resources);
        self
    }

    /// Sets `trainer_resources`.
    #[must_use]
    pub fn trainer_resources(mut self, resources: Resources) -> Self {
        self.trainer_resources = Some(resources);
        self
    }

    /// Sets `placement_strategy`.
    #[must_use]
    pub fn placement_strategy(mut self, strategy: PlacementStrategy) -> Self {
        self.placement_strategy = strategy;
        self
    }

    /// Sets `accelerator_type`.
    #[must_use]
    pub fn accelerator_type(mut self, accelerator_type: impl Into<String>) -> Self {
        self.accelerator_type = Some(accelerator_type.into());
        self
    }

    /// Checks the whole configuration.
    ///
    /// # Errors
    /// The first [`ConfigError`] found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.worker_resources().map(drop)?;
        self.trainer_bundle().map(drop)
    }

    /// The normalised dictionary of one worker.
    ///
    /// # Errors
    /// `num_workers` outside `1..=MAX_WORKERS`, contradictory GPU settings, an empty
    /// accelerator type, invalid amounts, or a worker that normalises to an empty dictionary.
    pub fn worker_resources(&self) -> Result<Resources, ConfigError> {
        self.num_workers.validate()?;
        let mut worker = match &self.resources_per_worker {
            None if self.use_gpu => Resources::new().with(GPU, ResourceAmount::ONE),
            None => Resources::new().with(CPU, ResourceAmount::ONE),
            Some(given) => {
                given
                    .validate()
                    .map_err(ConfigError::resources("resources_per_worker"))?;
                match given.get(GPU) {
                    Some(gpu) if !gpu.is_zero() && !self.use_gpu => {
                        return Err(ConfigError::GpuWithoutUseGpu {
                            amount: gpu.to_string(),
                        });
                    }
                    Some(gpu) if gpu.is_zero() && self.use_gpu => {
                        return Err(ConfigError::UseGpuWithZeroGpu);
                    }
                    _ => {}
                }
                given.clone().without_zeros()
            }
        };
        if self.use_gpu && !worker.contains(GPU) {
            worker.insert(GPU, ResourceAmount::ONE);
        }
        if let Some(accelerator) = &self.accelerator_type {
            if accelerator.trim().is_empty() {
                return Err(ConfigError::EmptyAcceleratorType);
            }
            let name = format!("{ACCELERATOR_TYPE_PREFIX}{accelerator}");
            if !worker.contains(&name) {
                worker.insert(name, ACCELERATOR_TYPE_AMOUNT);
            }
        }
        if worker.is_empty() {
            let given = self.resources_per_worker.clone().unwrap_or_default();
            return Err(ConfigError::empty_worker(&given));
        }
        Ok(worker)
    }

    /// The normalised coordinator reservation: `{}` unless given, zero entries dropped.
    ///
    /// # Errors
    /// Invalid amounts in `trainer_resources`.
    pub fn trainer_bundle(&self) -> Result<Resources, ConfigError> {
        let Some(given) = &self.trainer_resources else {
            return Ok(Resources::new());
        };
        given
            .validate()
            .map_err(ConfigError::resources("trainer_resources"))?;
        Ok(given.clone().without_zeros())
    }

    /// The placement group: `[trainer ⊕ worker₀, worker₁, …]` (just `[worker; n]` when the
    /// trainer reserves nothing), with the configured strategy.
    ///
    /// # Errors
    /// As [`ScalingConfig::worker_resources`] and [`ScalingConfig::trainer_bundle`].
    pub fn placement_group_factory(&self) -> Result<PlacementGroupFactory, ConfigError> {
        self.factory_of(self.worker_resources()?, self.trainer_bundle()?)
    }

    /// The placement group of an attempt with `world_size` workers (an elastic run's
    /// attempts each choose theirs within the range).
    ///
    /// # Errors
    /// As [`ScalingConfig::placement_group_factory`].
    pub fn placement_group_factory_for(
        &self,
        world_size: u32,
    ) -> Result<PlacementGroupFactory, ConfigError> {
        Self {
            num_workers: NumWorkers::fixed(world_size),
            ..self.clone()
        }
        .placement_group_factory()
    }

    /// Everything the run reserves at most: trainer + `num_workers` (its maximum) × worker.
    ///
    /// # Errors
    /// As [`ScalingConfig::placement_group_factory`], and overflow.
    pub fn total_resources(&self) -> Result<Resources, ConfigError> {
        total_of(
            &self.worker_resources()?,
            self.trainer_bundle()?,
            self.num_workers.max(),
        )
    }

    /// The placement group for an already normalised worker and trainer.
    pub(crate) fn factory_of(
        &self,
        worker: Resources,
        trainer: Resources,
    ) -> Result<PlacementGroupFactory, ConfigError> {
        let n = self.num_workers.max() as usize;
        let mut bundles = Vec::with_capacity(n);
        let mut first = trainer;
        first
            .checked_add_assign(&worker)
            .map_err(ConfigError::resources("trainer_resources"))?;
        bundles.push(first);
        bundles.resize(n, worker);
        Ok(PlacementGroupFactory {
            bundles,
            strategy: self.placement_strategy,
        })
    }

    /// The same configuration with both dictionaries normalised and made explicit.
    ///
    /// # Errors
    /// As [`ScalingConfig::validate`].
    pub fn normalized(&self) -> Result<Self, ConfigError> {
        Ok(Self {
            resources_per_worker: Some(self.worker_resources()?),
            trainer_resources: Some(self.trainer_bundle()?),
            ..self.clone()
        })
    }
}
