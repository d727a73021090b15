//! Ray Train's `ScalingConfig` tests, ported (reference §1.1 and §7.3).
//!
//! Where trainyard deliberately differs from Ray (an explicit `{"GPU": 0}` with `use_gpu`, and
//! a worker bundle that normalises to `{}`), the test says so and expects the specific error.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use trainyard_config::resources::{ResourceAmount, Resources};
use trainyard_config::{ConfigError, MAX_WORKERS, PlacementStrategy, ScalingConfig};

fn res(text: &str) -> Resources {
    text.parse()
        .unwrap_or_else(|e| panic!("`{text}` should parse: {e}"))
}

fn config(num_workers: u32, use_gpu: bool, per_worker: Option<&str>) -> ScalingConfig {
    let mut config = ScalingConfig::default()
        .num_workers(num_workers)
        .use_gpu(use_gpu);
    config.resources_per_worker = per_worker.map(res);
    config
}

// ---------------------------------------------------------------------------------------------
// A small model of Ray's Python code (python/ray/air/config.py and Tune's
// PlacementGroupFactory), written independently of the crate under test. Dictionaries are
// Python dicts of floats.

type PyDict = BTreeMap<String, f64>;

/// A Python dict literal: `&[("CPU", 1.0)]` is `{"CPU": 1}`.
type Pairs = &'static [(&'static str, f64)];

fn py(pairs: &[(&str, f64)]) -> PyDict {
    pairs.iter().map(|&(k, v)| (k.to_owned(), v)).collect()
}

/// `dict(Counter(a) + Counter(b))`: sums, keeping only positive counts.
fn counter_add(a: &PyDict, b: &PyDict) -> PyDict {
    let mut sum = a.clone();
    for (k, v) in b {
        *sum.entry(k.clone()).or_insert(0.0) += v;
    }
    sum.retain(|_, v| *v > 0.0);
    sum
}

#[derive(Debug, PartialEq)]
enum RayError {
    /// "`use_gpu` is False but `GPU` was found in `resources_per_worker`. ..."
    GpuWithoutUseGpu,
    /// "`use_gpu` is True but `GPU` is set to 0 in `resources_per_worker`. ..."
    UseGpuWithZeroGpu,
    /// "Cannot initialize a ResourceRequest with an empty head and zero worker bundles."
    EmptyHeadAndZeroWorkerBundles,
}

struct RayScalingConfig {
    trainer_resources: Option<PyDict>,
    num_workers: u32,
    use_gpu: bool,
    resources_per_worker: Option<PyDict>,
    accelerator_type: Option<&'static str>,
}

impl RayScalingConfig {
    /// `__post_init__`: runs only when `resources_per_worker` is truthy.
    fn post_init(&self) -> Result<(), RayError> {
        match &self.resources_per_worker {
            Some(given) if !given.is_empty() => {
                let gpus = self
                    .resources_per_worker_not_none()
                    .get("GPU")
                    .copied()
                    .unwrap_or(0.0);
                if !self.use_gpu && gpus > 0.0 {
                    return Err(RayError::GpuWithoutUseGpu);
                }
                if self.use_gpu && gpus == 0.0 {
                    return Err(RayError::UseGpuWithZeroGpu);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn resources_per_worker_not_none(&self) -> PyDict {
        let mut worker = match &self.resources_per_worker {
            None if self.use_gpu => py(&[("GPU", 1.0)]),
            None => py(&[("CPU", 1.0)]),
            Some(given) => given
                .iter()
                .filter(|(_, v)| **v != 0.0)
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        };
        if self.use_gpu {
            worker.entry("GPU".to_owned()).or_insert(1.0);
        }
        if let Some(accelerator) = self.accelerator_type {
            worker
                .entry(format!("accelerator_type:{accelerator}"))
                .or_insert(0.001);
        }
        worker
    }

    /// V1's default is `{"CPU": 1}`; the ported tests pass explicit dictionaries only.
    fn trainer_resources_not_none(&self) -> PyDict {
        match &self.trainer_resources {
            None => py(&[("CPU", 1.0)]),
            Some(given) => given
                .iter()
                .filter(|(_, v)| **v != 0.0)
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        }
    }

    fn total_resources(&self) -> PyDict {
        let mut total = self.trainer_resources_not_none();
        for (k, v) in self.resources_per_worker_not_none() {
            *total.entry(k).or_insert(0.0) += v * f64::from(self.num_workers);
        }
        total
    }

    /// `as_placement_group_factory().bundles`: the PGF drops zero keys and pops an empty head.
    fn placement_group_bundles(&self) -> Result<Vec<PyDict>, RayError> {
        let trainer = self.trainer_resources_not_none();
        let worker = self.resources_per_worker_not_none();
        let combined = counter_add(&trainer, &worker);
        let mut bundles = vec![PyDict::new(), combined];
        for _ in 1..self.num_workers {
            bundles.push(worker.clone());
        }
        let mut bundles: Vec<PyDict> = bundles
            .into_iter()
            .map(|b| b.into_iter().filter(|(_, v)| *v != 0.0).collect())
            .collect();
        if bundles[0].is_empty() {
            bundles.remove(0);
            if bundles.is_empty() {
                return Err(RayError::EmptyHeadAndZeroWorkerBundles);
            }
        }
        Ok(bundles)
    }
}

/// A Python dict as trainyard sees it: exact amounts.
fn to_resources(dict: &PyDict) -> Resources {
    dict.iter()
        .map(|(k, &v)| {
            let amount = ResourceAmount::try_from(v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
            (k.clone(), amount)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Normalisation (`_resources_per_worker_not_none`), reference §1.1 truth table.

#[test]
fn no_dict_without_gpu_normalises_to_one_cpu() {
    assert_eq!(
        config(1, false, None).worker_resources().unwrap(),
        res("CPU=1")
    );
}

#[test]
fn no_dict_with_gpu_normalises_to_one_gpu_and_no_cpu() {
    assert_eq!(
        config(1, true, None).worker_resources().unwrap(),
        res("GPU=1")
    );
}

#[test]
fn an_empty_dict_is_an_empty_worker_error_at_config_time() {
    let err = config(1, false, Some("{}")).worker_resources().unwrap_err();
    assert!(matches!(err, ConfigError::EmptyWorker { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("a worker must request at least one resource"),
        "{err}"
    );
    assert!(matches!(
        config(1, false, Some("{}")).validate(),
        Err(ConfigError::EmptyWorker { .. })
    ));
    assert!(matches!(
        config(2, false, Some("{}")).placement_group_factory(),
        Err(ConfigError::EmptyWorker { .. })
    ));
}

#[test]
fn a_dict_of_only_zero_cpus_is_an_empty_worker_error_at_config_time() {
    let err = config(1, false, Some(r#"{"CPU": 0}"#))
        .validate()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::EmptyWorker { ref given } if given == "{CPU=0}"),
        "{err:?}"
    );
    assert!(matches!(
        config(1, false, Some("CPU=0,GPU=0,custom=0")).total_resources(),
        Err(ConfigError::EmptyWorker { .. })
    ));
}

#[test]
fn use_gpu_adds_one_gpu_to_a_dict_without_gpu() {
    assert_eq!(
        config(1, true, Some(r#"{"CPU": 2}"#))
            .worker_resources()
            .unwrap(),
        res("CPU=2,GPU=1")
    );
}

#[test]
fn use_gpu_keeps_an_explicit_gpu_amount() {
    assert_eq!(
        config(1, true, Some("GPU=0.5")).worker_resources().unwrap(),
        res("GPU=0.5")
    );
    assert_eq!(
        config(1, true, Some("GPU=4,CPU=8"))
            .worker_resources()
            .unwrap(),
        res("CPU=8,GPU=4")
    );
}

#[test]
fn use_gpu_with_an_explicit_zero_gpu_is_an_error_unlike_ray() {
    // Ray silently turns {"CPU": 2, "GPU": 0} into {"CPU": 2, "GPU": 1}; trainyard refuses
    // the contradiction.
    for given in [r#"{"CPU": 2, "GPU": 0}"#, r#"{"GPU": 0}"#] {
        let err = config(1, true, Some(given)).validate().unwrap_err();
        assert!(
            matches!(err, ConfigError::UseGpuWithZeroGpu),
            "{given}: {err:?}"
        );
        assert!(
            err.to_string().contains("`use_gpu` is true but `GPU` is 0"),
            "{err}"
        );
    }
}

#[test]
fn a_user_dict_replaces_the_default_cpu_entirely() {
    assert_eq!(
        config(1, false, Some(r#"{"memory": 1e9}"#))
            .worker_resources()
            .unwrap(),
        res("memory=1000000000")
    );
}

#[test]
fn zero_entries_are_dropped_from_the_worker_dict() {
    assert_eq!(
        config(1, false, Some("CPU=1,GPU=0,memory=0,custom=0"))
            .worker_resources()
            .unwrap(),
        res("CPU=1")
    );
}

#[test]
fn accelerator_type_adds_a_tiny_constraint_unless_present() {
    let mut c = config(1, false, None).accelerator_type("A100");
    assert_eq!(
        c.worker_resources().unwrap(),
        res("CPU=1,accelerator_type:A100=0.001")
    );
    c.resources_per_worker = Some(res("CPU=1,accelerator_type:A100=0.5"));
    assert_eq!(
        c.worker_resources().unwrap(),
        res("CPU=1,accelerator_type:A100=0.5")
    );
}

#[test]
fn an_empty_accelerator_type_is_an_error() {
    let err = config(1, false, None)
        .accelerator_type(" ")
        .validate()
        .unwrap_err();
    assert!(matches!(err, ConfigError::EmptyAcceleratorType), "{err:?}");
}

#[test]
fn the_truth_table_matches_the_ray_model_where_both_accept_the_input() {
    let rows: [(Option<Pairs>, bool); 7] = [
        (None, false),
        (None, true),
        (Some(&[("CPU", 2.0)]), true),
        (Some(&[("memory", 1e9)]), false),
        (Some(&[("CPU", 1.0), ("GPU", 0.0)]), false),
        (Some(&[("GPU", 0.5), ("custom", 3.0)]), true),
        (Some(&[("CPU", 4.0), ("accelerator_type:T4", 0.25)]), false),
    ];
    for (given, use_gpu) in rows {
        for accelerator_type in [None, Some("A100"), Some("T4")] {
            let ray = RayScalingConfig {
                trainer_resources: Some(PyDict::new()),
                num_workers: 1,
                use_gpu,
                resources_per_worker: given.map(py),
                accelerator_type,
            };
            let mut ours = ScalingConfig::default().use_gpu(use_gpu);
            ours.resources_per_worker = given.map(|g| to_resources(&py(g)));
            ours.accelerator_type = accelerator_type.map(str::to_owned);
            assert_eq!(ray.post_init(), Ok(()));
            assert_eq!(
                ours.worker_resources().unwrap(),
                to_resources(&ray.resources_per_worker_not_none()),
                "{given:?} use_gpu={use_gpu} accelerator_type={accelerator_type:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// test_scaling_config_validation and test_scaling_config_accelerator_type.

#[test]
fn use_gpu_with_one_cpu_per_worker_totals_two_cpus_and_two_gpus() {
    let c = config(2, true, Some(r#"{"CPU": 1}"#));
    assert_eq!(c.total_resources().unwrap(), res("CPU=2,GPU=2"));
}

#[test]
fn gpu_in_the_dict_without_use_gpu_is_an_error() {
    let err = config(2, false, Some(r#"{"GPU": 1}"#))
        .validate()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::GpuWithoutUseGpu { ref amount } if amount == "1"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("`use_gpu` is false but `GPU` is 1 in `resources_per_worker`"),
        "{err}"
    );
    let err = config(1, false, Some("CPU=1,GPU=0.5"))
        .total_resources()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::GpuWithoutUseGpu { .. }),
        "{err:?}"
    );
}

#[test]
fn a_zero_gpu_without_use_gpu_is_fine() {
    assert_eq!(
        config(1, false, Some("CPU=1,GPU=0"))
            .worker_resources()
            .unwrap(),
        res("CPU=1")
    );
}

#[test]
fn accelerator_type_a100_with_gpus_on_two_workers() {
    let c = config(2, true, None).accelerator_type("A100");
    assert_eq!(
        c.worker_resources().unwrap(),
        res("GPU=1,accelerator_type:A100=0.001")
    );
    assert_eq!(
        c.total_resources().unwrap(),
        res("GPU=2,accelerator_type:A100=0.002")
    );
    let factory = c.placement_group_factory().unwrap();
    assert_eq!(
        factory.bundles,
        vec![res("GPU=1,accelerator_type:A100=0.001"); 2]
    );
}

#[test]
fn zero_workers_is_an_error() {
    let err = config(0, false, None).validate().unwrap_err();
    assert!(
        matches!(err, ConfigError::NumWorkersOutOfRange(0)),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "`num_workers` must be between 1 and 1000000, got 0"
    );
    assert!(config(0, false, None).placement_group_factory().is_err());
    assert!(config(0, false, None).total_resources().is_err());
}

#[test]
fn default_trainer_resources_reserve_nothing_and_bundles_are_one_per_worker() {
    let c = config(3, false, Some("CPU=2"));
    assert_eq!(c.trainer_bundle().unwrap(), Resources::new());
    let factory = c.placement_group_factory().unwrap();
    assert_eq!(factory.bundles, vec![res("CPU=2"); 3]);
    assert_eq!(factory.strategy, PlacementStrategy::Pack);
    assert_eq!(c.total_resources().unwrap(), res("CPU=6"));
}

#[test]
fn explicit_trainer_resources_merge_into_bundle_zero_only() {
    let c = config(3, false, Some("CPU=2,memory=10")).trainer_resources(res("CPU=1,custom=1"));
    let factory = c.placement_group_factory().unwrap();
    assert_eq!(
        factory.bundles,
        vec![
            res("CPU=3,custom=1,memory=10"),
            res("CPU=2,memory=10"),
            res("CPU=2,memory=10")
        ]
    );
    assert_eq!(
        c.total_resources().unwrap(),
        res("CPU=7,custom=1,memory=30")
    );
}

// ---------------------------------------------------------------------------------------------
// test_scaling_config_pgf_equivalance: the cartesian product.

#[test]
fn placement_group_factory_equals_rays_for_the_whole_product() {
    let trainer_resources: [Pairs; 4] = [
        &[],
        &[("CPU", 1.0)],
        &[("CPU", 2.0), ("GPU", 1.0)],
        &[("CPU", 0.0)],
    ];
    let workers: [(Option<Pairs>, bool); 6] = [
        (None, false),
        (None, true),
        (Some(&[]), false),
        (Some(&[("CPU", 1.0)]), false),
        (Some(&[("CPU", 2.0), ("GPU", 1.0)]), true),
        (Some(&[("CPU", 0.0)]), false),
    ];
    let (mut valid, mut invalid) = (0, 0);
    for trainer in trainer_resources {
        for num_workers in [1u32, 2] {
            for (per_worker, use_gpu) in workers {
                for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
                    let case = format!(
                        "trainer={trainer:?} num_workers={num_workers} per_worker={per_worker:?} use_gpu={use_gpu} {strategy}"
                    );
                    let ray = RayScalingConfig {
                        trainer_resources: Some(py(trainer)),
                        num_workers,
                        use_gpu,
                        resources_per_worker: per_worker.map(py),
                        accelerator_type: None,
                    };
                    let ours = ScalingConfig {
                        num_workers: num_workers.into(),
                        use_gpu,
                        resources_per_worker: per_worker.map(|w| to_resources(&py(w))),
                        trainer_resources: Some(to_resources(&py(trainer))),
                        placement_strategy: strategy,
                        accelerator_type: None,
                        resize_interval: None,
                    };
                    assert_eq!(ray.post_init(), Ok(()), "{case}");
                    let ray_bundles = ray.placement_group_bundles();
                    if ray.resources_per_worker_not_none().is_empty() {
                        // Ray accepts the config and fails later, creating the placement
                        // group; trainyard refuses it up front.
                        invalid += 1;
                        let err = ours.placement_group_factory().unwrap_err();
                        assert!(
                            matches!(err, ConfigError::EmptyWorker { .. }),
                            "{case}: {err:?}"
                        );
                        assert!(
                            matches!(ours.total_resources(), Err(ConfigError::EmptyWorker { .. })),
                            "{case}"
                        );
                        assert!(
                            matches!(ours.validate(), Err(ConfigError::EmptyWorker { .. })),
                            "{case}"
                        );
                        continue;
                    }
                    valid += 1;
                    let expected: Vec<Resources> = ray_bundles
                        .unwrap_or_else(|e| panic!("{case}: {e:?}"))
                        .iter()
                        .map(to_resources)
                        .collect();
                    let factory = ours
                        .placement_group_factory()
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                    assert_eq!(factory.bundles, expected, "{case}");
                    assert_eq!(factory.strategy, strategy, "{case}");
                    let total = ours
                        .total_resources()
                        .unwrap_or_else(|e| panic!("{case}: {e}"));
                    assert_eq!(total, to_resources(&ray.total_resources()), "{case}");
                    assert_eq!(factory.total_resources().unwrap(), total, "{case}");
                }
            }
        }
    }
    assert_eq!((valid, invalid), (64, 32));
}

#[test]
fn the_ray_model_strips_only_an_empty_head_bundle() {
    // The model itself must reproduce Ray's layout, or the product above proves nothing.
    let ray = RayScalingConfig {
        trainer_resources: Some(py(&[("CPU", 1.0)])),
        num_workers: 2,
        use_gpu: false,
        resources_per_worker: Some(py(&[("CPU", 1.0), ("GPU", 0.0)])),
        accelerator_type: None,
    };
    assert_eq!(
        ray.placement_group_bundles(),
        Ok(vec![py(&[("CPU", 2.0)]), py(&[("CPU", 1.0)])])
    );
    assert_eq!(ray.total_resources(), py(&[("CPU", 3.0)]));
    let default_trainer = RayScalingConfig {
        trainer_resources: None,
        ..ray
    };
    assert_eq!(default_trainer.total_resources(), py(&[("CPU", 3.0)]));
    let gpu_without_flag = RayScalingConfig {
        trainer_resources: None,
        num_workers: 1,
        use_gpu: false,
        resources_per_worker: Some(py(&[("GPU", 1.0)])),
        accelerator_type: None,
    };
    assert_eq!(
        gpu_without_flag.post_init(),
        Err(RayError::GpuWithoutUseGpu)
    );
    let zero_gpu_with_flag = RayScalingConfig {
        use_gpu: true,
        resources_per_worker: Some(py(&[("GPU", 0.0)])),
        ..gpu_without_flag
    };
    // Unreachable in Ray: the zero is dropped and GPU defaults to 1 before the check.
    assert_eq!(zero_gpu_with_flag.post_init(), Ok(()));
    assert_eq!(
        zero_gpu_with_flag.resources_per_worker_not_none(),
        py(&[("GPU", 1.0)])
    );
    assert_eq!(
        counter_add(&py(&[("CPU", 1.0), ("GPU", 0.0)]), &py(&[("CPU", 0.0)])),
        py(&[("CPU", 1.0)])
    );
}

// ---------------------------------------------------------------------------------------------
// Loading from TOML and JSON (test_scaling_config: non-config values are rejected).

fn parse_error_text(result: Result<ScalingConfig, ConfigError>) -> String {
    match result {
        Ok(config) => panic!("should be rejected, got {config:?}"),
        Err(err) => {
            assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
            err.to_string()
        }
    }
}

const FIELDS: [&str; 6] = [
    "num_workers",
    "use_gpu",
    "resources_per_worker",
    "trainer_resources",
    "placement_strategy",
    "accelerator_type",
];

#[test]
fn an_unknown_toml_field_is_named_and_the_valid_fields_are_listed() {
    let text = parse_error_text(ScalingConfig::from_toml_str(
        "num_workers = 2\nnum_wrokers = 3\n",
    ));
    assert!(text.contains("unknown field `num_wrokers`"), "{text}");
    for field in FIELDS {
        assert!(
            text.contains(&format!("`{field}`")),
            "{field} missing from: {text}"
        );
    }
}

#[test]
fn an_unknown_json_field_is_named_and_the_valid_fields_are_listed() {
    let text = parse_error_text(ScalingConfig::from_json_str(
        r#"{"num_workers": 2, "gpus": 1}"#,
    ));
    assert!(text.contains("unknown field `gpus`"), "{text}");
    for field in FIELDS {
        assert!(
            text.contains(&format!("`{field}`")),
            "{field} missing from: {text}"
        );
    }
}

#[test]
fn zero_or_negative_num_workers_in_a_file_is_an_error_naming_num_workers() {
    for (result, value) in [
        (ScalingConfig::from_toml_str("num_workers = 0"), "0"),
        (ScalingConfig::from_toml_str("num_workers = -1"), "-1"),
        (ScalingConfig::from_json_str(r#"{"num_workers": 0}"#), "0"),
        (ScalingConfig::from_json_str(r#"{"num_workers": -1}"#), "-1"),
    ] {
        let text = parse_error_text(result);
        assert!(
            text.contains("`num_workers` must be between 1 and 1000000"),
            "{text}"
        );
        assert!(text.contains(&format!("got {value}")), "{text}");
    }
}

#[test]
fn more_workers_than_the_maximum_is_an_error_naming_the_field_value_and_range() {
    let err = config(MAX_WORKERS + 1, false, None).validate().unwrap_err();
    assert!(
        matches!(err, ConfigError::NumWorkersOutOfRange(1_000_001)),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "`num_workers` must be between 1 and 1000000, got 1000001"
    );
    assert!(config(MAX_WORKERS + 1, false, None).plan().is_err());
    assert!(
        config(u32::MAX, false, None)
            .placement_group_factory()
            .is_err()
    );
    assert!(config(MAX_WORKERS, false, None).validate().is_ok());
    for result in [
        ScalingConfig::from_toml_str("num_workers = 4000000000"),
        ScalingConfig::from_json_str(r#"{"num_workers": 99999999999}"#),
    ] {
        let text = parse_error_text(result);
        assert!(
            text.contains("`num_workers` must be between 1 and 1000000, got"),
            "{text}"
        );
    }
}

#[test]
fn a_toml_syntax_error_is_one_line_with_its_position() {
    let text = parse_error_text(ScalingConfig::from_toml_str(
        "num_workers = 2\nresources_per_worker = { CPU = 1\n",
    ));
    assert!(!text.contains('\n'), "{text:?}");
    assert!(text.contains("at line 2, column "), "{text}");
}

#[test]
fn a_bad_placement_strategy_in_a_file_is_an_error_listing_the_strategies() {
    for result in [
        ScalingConfig::from_toml_str(r#"placement_strategy = "RANDOM""#),
        ScalingConfig::from_json_str(r#"{"placement_strategy": "RANDOM"}"#),
    ] {
        let text = parse_error_text(result);
        assert!(text.contains("`RANDOM`"), "{text}");
        for strategy in ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] {
            assert!(text.contains(strategy), "{text}");
        }
    }
    let ok = ScalingConfig::from_toml_str(r#"placement_strategy = "STRICT_SPREAD""#).unwrap();
    assert_eq!(ok.placement_strategy, PlacementStrategy::StrictSpread);
}

#[test]
fn memory_with_units_in_toml_becomes_bytes() {
    let c = ScalingConfig::from_toml_str(
        r#"
        num_workers = 2
        resources_per_worker = { CPU = 1, memory = "10GB", object_store_memory = "512MiB" }
        trainer_resources = { memory = "1.5 GiB" }
        "#,
    )
    .unwrap();
    assert_eq!(
        c.worker_resources().unwrap(),
        res("CPU=1,memory=10000000000,object_store_memory=536870912")
    );
    assert_eq!(c.trainer_bundle().unwrap(), res("memory=1610612736"));
    assert_eq!(
        c.total_resources().unwrap(),
        res("CPU=2,memory=21610612736,object_store_memory=1073741824")
    );
}

#[test]
fn a_bad_memory_value_in_a_file_names_the_key_and_the_value() {
    let text = parse_error_text(ScalingConfig::from_toml_str(
        r#"resources_per_worker = { memory = "ten GB" }"#,
    ));
    assert!(
        text.contains("`memory`") && text.contains("ten GB"),
        "{text}"
    );
}

#[test]
fn cross_field_checks_run_after_loading() {
    let err = ScalingConfig::from_toml_str("resources_per_worker = { GPU = 1 }").unwrap_err();
    assert!(
        matches!(err, ConfigError::GpuWithoutUseGpu { .. }),
        "{err:?}"
    );
    let err = ScalingConfig::from_json_str(r#"{"resources_per_worker": {}}"#).unwrap_err();
    assert!(matches!(err, ConfigError::EmptyWorker { .. }), "{err:?}");
}

#[test]
fn values_that_are_not_a_config_object_are_rejected_and_an_empty_object_is_the_default() {
    for text in [r#""invalid""#, "false", "true", "1"] {
        parse_error_text(ScalingConfig::from_json_str(text));
    }
    assert_eq!(
        ScalingConfig::from_json_str("{}").unwrap(),
        ScalingConfig::default()
    );
    assert_eq!(
        ScalingConfig::from_toml_str("").unwrap(),
        ScalingConfig::default()
    );
}

/// A file in a directory of its own under the system temp dir, removed on drop.
struct TempFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "trainyard-config-test-{}-{}",
            std::process::id(),
            name.replace('.', "-")
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("temp file");
        Self { dir, path }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn files_are_read_as_toml_or_as_json_by_extension() {
    let toml = TempFile::new(
        "scaling.toml",
        "num_workers = 4\nuse_gpu = true\nplacement_strategy = \"SPREAD\"\naccelerator_type = \"A100\"\n",
    );
    let json = TempFile::new(
        "scaling.json",
        r#"{"num_workers": 4, "use_gpu": true, "placement_strategy": "SPREAD", "accelerator_type": "A100"}"#,
    );
    let expected = config(4, true, None)
        .placement_strategy(PlacementStrategy::Spread)
        .accelerator_type("A100");
    assert_eq!(ScalingConfig::from_path(toml.path()).unwrap(), expected);
    assert_eq!(ScalingConfig::from_path(json.path()).unwrap(), expected);
}

#[test]
fn a_file_with_an_unknown_field_names_the_file_and_the_field() {
    let file = TempFile::new("unknown-field.toml", "num_workers = 2\nbogus = 1\n");
    let err = ScalingConfig::from_path(file.path()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("unknown-field.toml") && text.contains("unknown field `bogus`"),
        "{text}"
    );
}

#[test]
fn a_missing_file_is_a_read_error_naming_the_path() {
    let err = ScalingConfig::from_path("/nonexistent/trainyard.toml").unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/trainyard.toml"),
        "{err}"
    );
}
