//! Properties of normalisation and placement for arbitrary valid scaling configs.

use std::collections::BTreeMap;

use proptest::prelude::*;
use trainyard_config::resources::{ResourceAmount, Resources, STEPS_PER_UNIT};
use trainyard_config::{ConfigError, PlacementStrategy, ScalingConfig};

/// Exact amounts in 0.0001 steps, keyed by resource name: the model's dictionaries.
type Steps = BTreeMap<String, u128>;

#[derive(Debug, Clone, Copy)]
enum Gpu {
    Absent,
    Zero,
    Some(u128),
}

/// GPU steps that are valid: fractional up to 1, whole above.
fn positive_gpu() -> impl Strategy<Value = u128> {
    prop_oneof![
        (1..=STEPS_PER_UNIT),
        (1u128..=16).prop_map(|units| units * STEPS_PER_UNIT),
    ]
}

fn gpu() -> impl Strategy<Value = Gpu> {
    prop_oneof![
        Just(Gpu::Absent),
        Just(Gpu::Zero),
        positive_gpu().prop_map(Gpu::Some)
    ]
}

/// An amount on the 0.0001 grid, zero included, up to 100 000 units.
fn amount_steps() -> impl Strategy<Value = u128> {
    prop_oneof![Just(0u128), 0..=1_000_000_000u128]
}

/// CPU, memory (whole bytes) and custom entries, zeros included.
fn other_entries() -> impl Strategy<Value = Steps> {
    (
        proptest::option::of(amount_steps()),
        proptest::option::of((0u128..=1_000_000_000_000).prop_map(|bytes| bytes * STEPS_PER_UNIT)),
        proptest::collection::btree_map(
            "custom_[a-z]{1,4}|accelerator_type:[A-Z][0-9]{1,3}",
            amount_steps(),
            0..4,
        ),
    )
        .prop_map(|(cpu, memory, mut custom)| {
            if let Some(steps) = cpu {
                custom.insert("CPU".to_owned(), steps);
            }
            if let Some(steps) = memory {
                custom.insert("memory".to_owned(), steps);
            }
            custom
        })
}

fn to_resources(steps: &Steps) -> Resources {
    steps
        .iter()
        .map(|(k, &s)| (k.clone(), ResourceAmount::from_steps(s)))
        .collect()
}

#[derive(Debug, Clone)]
struct Case {
    num_workers: u32,
    use_gpu: bool,
    per_worker: Option<Steps>,
    trainer: Option<Steps>,
    strategy: PlacementStrategy,
    accelerator_type: Option<String>,
}

/// Arbitrary valid configs: `use_gpu` agrees with the GPU entry of the worker dict, and the
/// worker requests something.
fn case() -> impl Strategy<Value = Case> {
    (
        1u32..50,
        any::<bool>(),
        proptest::option::of((gpu(), other_entries())),
        proptest::option::of((gpu(), other_entries())),
        proptest::sample::select(PlacementStrategy::ALL.to_vec()),
        proptest::option::of("[A-Z][0-9]{2,3}"),
    )
        .prop_map(
            |(num_workers, coin, per_worker, trainer, strategy, accelerator_type)| {
                let mut use_gpu = coin;
                let per_worker = per_worker.map(|(gpu, mut dict)| {
                    match gpu {
                        Gpu::Absent => {}
                        Gpu::Zero => {
                            use_gpu = false;
                            dict.insert("GPU".to_owned(), 0);
                        }
                        Gpu::Some(steps) => {
                            use_gpu = true;
                            dict.insert("GPU".to_owned(), steps);
                        }
                    }
                    dict
                });
                let trainer = trainer.map(|(gpu, mut dict)| {
                    match gpu {
                        Gpu::Absent => {}
                        Gpu::Zero => {
                            dict.insert("GPU".to_owned(), 0);
                        }
                        Gpu::Some(steps) => {
                            dict.insert("GPU".to_owned(), steps);
                        }
                    }
                    dict
                });
                Case {
                    num_workers,
                    use_gpu,
                    per_worker,
                    trainer,
                    strategy,
                    accelerator_type,
                }
            },
        )
        .prop_filter("a worker must request something", |case| {
            !case.model_worker().is_empty()
        })
}

impl Case {
    fn config(&self) -> ScalingConfig {
        ScalingConfig {
            num_workers: self.num_workers.into(),
            use_gpu: self.use_gpu,
            resources_per_worker: self.per_worker.as_ref().map(to_resources),
            trainer_resources: self.trainer.as_ref().map(to_resources),
            placement_strategy: self.strategy,
            accelerator_type: self.accelerator_type.clone(),
            resize_interval: None,
        }
    }

    /// Ray's `_resources_per_worker_not_none`, on exact steps.
    fn model_worker(&self) -> Steps {
        let mut worker: Steps = match &self.per_worker {
            None if self.use_gpu => [("GPU".to_owned(), STEPS_PER_UNIT)].into(),
            None => [("CPU".to_owned(), STEPS_PER_UNIT)].into(),
            Some(given) => given
                .iter()
                .filter(|(_, s)| **s != 0)
                .map(|(k, s)| (k.clone(), *s))
                .collect(),
        };
        if self.use_gpu {
            worker.entry("GPU".to_owned()).or_insert(STEPS_PER_UNIT);
        }
        if let Some(accelerator) = &self.accelerator_type {
            worker
                .entry(format!("accelerator_type:{accelerator}"))
                .or_insert(10);
        }
        worker
    }

    fn model_trainer(&self) -> Steps {
        self.trainer
            .iter()
            .flatten()
            .filter(|(_, s)| **s != 0)
            .map(|(k, s)| (k.clone(), *s))
            .collect()
    }
}

fn add(into: &mut Steps, other: &Steps, times: u128) {
    for (k, s) in other {
        *into.entry(k.clone()).or_insert(0) += s * times;
    }
}

proptest! {
    #[test]
    fn bundle_sums_equal_total_resources(case in case()) {
        let config = case.config();
        let factory = config.placement_group_factory().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let total = config.total_resources().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let mut sum = Resources::new();
        for bundle in &factory.bundles {
            sum.checked_add_assign(bundle).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        }
        prop_assert_eq!(&sum, &total);
        prop_assert_eq!(factory.total_resources().map_err(|e| TestCaseError::fail(format!("{e}")))?, total);
    }

    #[test]
    fn bundles_are_trainer_plus_worker_then_one_worker_each(case in case()) {
        let config = case.config();
        let factory = config.placement_group_factory().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let worker = case.model_worker();
        let mut first = case.model_trainer();
        add(&mut first, &worker, 1);
        prop_assert_eq!(factory.bundles.len(), case.num_workers as usize);
        prop_assert_eq!(&factory.bundles[0], &to_resources(&first));
        for bundle in &factory.bundles[1..] {
            prop_assert_eq!(bundle, &to_resources(&worker));
        }
        prop_assert!(factory.bundles.iter().all(|b| !b.is_empty() && b.iter().all(|(_, a)| !a.is_zero())));
        prop_assert_eq!(factory.strategy, case.strategy);
        let mut total = case.model_trainer();
        add(&mut total, &worker, u128::from(case.num_workers));
        prop_assert_eq!(config.total_resources().map_err(|e| TestCaseError::fail(format!("{e}")))?, to_resources(&total));
    }

    #[test]
    fn normalising_twice_changes_nothing(case in case()) {
        let config = case.config();
        let once = config.normalized().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(once.normalized().map_err(|e| TestCaseError::fail(format!("{e}")))?, once.clone());
        prop_assert_eq!(
            once.placement_group_factory().map_err(|e| TestCaseError::fail(format!("{e}")))?,
            config.placement_group_factory().map_err(|e| TestCaseError::fail(format!("{e}")))?
        );
    }

    #[test]
    fn a_config_survives_json_and_toml_round_trips(case in case()) {
        let config = case.config();
        let json = serde_json::to_string(&config).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(ScalingConfig::from_json_str(&json).map_err(|e| TestCaseError::fail(format!("{json}: {e}")))?, config.clone());
        let toml = toml::to_string(&config).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(ScalingConfig::from_toml_str(&toml).map_err(|e| TestCaseError::fail(format!("{toml}: {e}")))?, config);
    }

    #[test]
    fn a_worker_that_normalises_to_nothing_is_always_refused(
        num_workers in 1u32..50,
        zeros in proptest::collection::btree_map("CPU|memory|custom_[a-z]{1,3}", Just(0u128), 0..4),
    ) {
        let config = ScalingConfig::default()
            .num_workers(num_workers)
            .resources_per_worker(to_resources(&zeros));
        let validated = config.validate();
        prop_assert!(matches!(validated, Err(ConfigError::EmptyWorker { .. })), "{:?}", validated);
        let factory = config.placement_group_factory();
        prop_assert!(matches!(factory, Err(ConfigError::EmptyWorker { .. })), "{:?}", factory);
    }
}
