//! The edge cases of turning a worker's resource dictionary into actor options, as Ray Train
//! handles them (reference §2.4), with trainyard's deliberate differences.

use std::error::Error;

use trainyard_resources::{
    ActorOptions, AmountError, ByteSizeError, ResourceAmount, ResourceError, Resources,
};

fn dict(text: &str) -> Resources {
    text.parse()
        .unwrap_or_else(|e| panic!("`{text}` should parse: {e}"))
}

fn options(text: &str) -> ActorOptions {
    ActorOptions::try_from(&dict(text)).unwrap_or_else(|e| panic!("`{text}` should convert: {e}"))
}

fn amount(text: &str) -> ResourceAmount {
    text.parse()
        .unwrap_or_else(|e| panic!("`{text}` should be an amount: {e}"))
}

/// An error and its sources on one line, as a user sees it.
fn chain(error: &dyn Error) -> String {
    trainyard_resources::ErrorChain(error).to_string()
}

fn parse_error(text: &str) -> ResourceError {
    match text.parse::<Resources>() {
        Ok(parsed) => panic!("`{text}` should be rejected, got {parsed:?}"),
        Err(e) => e,
    }
}

#[test]
fn missing_cpu_becomes_zero_num_cpus_not_the_actor_default() {
    let o = options("GPU=1");
    assert_eq!(o.num_cpus, ResourceAmount::ZERO);
    assert_eq!(o.num_gpus, ResourceAmount::ONE);
}

#[test]
fn missing_gpu_becomes_zero_num_gpus() {
    let o = options("CPU=2");
    assert_eq!(o.num_cpus, amount("2"));
    assert_eq!(o.num_gpus, ResourceAmount::ZERO);
}

#[test]
fn memory_is_passed_as_actor_option_not_custom_resource() {
    let o = options(r#"{"memory": 10000}"#);
    assert_eq!(o.memory, 10_000);
    assert!(o.resources.is_empty(), "{:?}", o.resources);
    assert!(o.num_cpus.is_zero() && o.num_gpus.is_zero());
}

#[test]
fn memory_with_units_becomes_whole_bytes() {
    assert_eq!(options("memory=10GB").memory, 10_000_000_000);
    assert_eq!(options(r#"{"memory": "1.5 GiB"}"#).memory, 1_610_612_736);
    assert_eq!(options(r#"{"memory": 1e9}"#).memory, 1_000_000_000);
    // Ray casts memory to `int`, rounding toward zero.
    assert_eq!(options("memory=1000.9").memory, 1000);
}

#[test]
fn missing_memory_becomes_zero_memory() {
    assert_eq!(options("CPU=1").memory, 0);
}

#[test]
fn object_store_memory_is_its_own_option_and_never_a_custom_resource() {
    let o = options(r#"{"CPU": 1, "object_store_memory": "2GB"}"#);
    assert_eq!(o.object_store_memory, Some(2_000_000_000));
    assert!(!o.resources.contains("object_store_memory"));
    assert!(o.resources.is_empty(), "{:?}", o.resources);
}

#[test]
fn missing_object_store_memory_is_none_not_zero() {
    assert_eq!(options("CPU=1,memory=1").object_store_memory, None);
}

#[test]
fn the_v2_docstring_example_splits_as_ray_does() {
    // bundle_to_remote_args({"GPU": 1, "memory": 1, "custom": 0.1})
    //   == {'num_cpus': 0, 'num_gpus': 1, 'memory': 1, 'resources': {'custom': 0.1}}
    let o = options(r#"{"GPU": 1, "memory": 1, "custom": 0.1}"#);
    assert_eq!(
        o,
        ActorOptions {
            num_cpus: ResourceAmount::ZERO,
            num_gpus: ResourceAmount::ONE,
            memory: 1,
            object_store_memory: None,
            resources: dict("custom=0.1"),
        }
    );
}

#[test]
fn fractional_gpu_of_one_half_is_allowed() {
    let o = options(r#"{"GPU": 0.5}"#);
    assert_eq!(o.num_gpus, amount("0.5"));
    assert_eq!(o.num_gpus.to_string(), "0.5");
}

#[test]
fn whole_gpus_above_one_are_allowed() {
    assert_eq!(options("GPU=4").num_gpus, amount("4"));
}

#[test]
fn gpu_of_one_and_a_half_is_rejected_with_rays_message() {
    let message = "GPU quantities above 1 must be whole numbers, got 1.5";
    assert_eq!(parse_error("GPU=1.5").to_string(), message);
    // Through JSON the message is wrapped, but it is still the whole cause.
    let json = parse_error(r#"{"GPU": 1.5}"#).to_string();
    assert!(json.contains(message), "{json}");
    // A dictionary built in code is checked by the conversion itself.
    let built = Resources::new().with("GPU", amount("1.5"));
    let err = ActorOptions::try_from(&built).unwrap_err();
    assert_eq!(err.to_string(), message);
    assert!(
        matches!(err, ResourceError::FractionalAccelerator { ref name, value } if name == "GPU" && value == amount("1.5"))
    );
}

#[test]
fn other_accelerators_above_one_must_be_whole_too() {
    assert_eq!(
        parse_error("neuron_cores=2.5").to_string(),
        "neuron_cores quantities above 1 must be whole numbers, got 2.5"
    );
    assert_eq!(options("TPU=4").resources, dict("TPU=4"));
}

#[test]
fn custom_and_accelerator_type_keys_go_to_resources() {
    let o = options(
        r#"{"CPU": 1, "custom": 2, "accelerator_type:A100": 0.001, "neuron_cores": 2, "TPU": 0.5}"#,
    );
    assert_eq!(o.num_cpus, ResourceAmount::ONE);
    assert_eq!(
        o.resources,
        dict("custom=2,accelerator_type:A100=0.001,neuron_cores=2,TPU=0.5")
    );
}

#[test]
fn resource_names_are_case_sensitive_so_lower_case_cpu_is_custom() {
    let o = options("cpu=2,Memory=3,gpu=1");
    assert!(o.num_cpus.is_zero() && o.num_gpus.is_zero());
    assert_eq!(o.memory, 0);
    assert_eq!(o.resources, dict("cpu=2,Memory=3,gpu=1"));
}

#[test]
fn zero_amounts_pass_through_the_conversion() {
    let o = options("CPU=0,GPU=0,memory=0,custom=0");
    assert!(o.num_cpus.is_zero() && o.num_gpus.is_zero());
    assert_eq!(o.memory, 0);
    assert_eq!(o.resources, dict("custom=0"));
}

#[test]
fn empty_dict_gives_all_zero_options() {
    assert_eq!(options("{}"), ActorOptions::default());
    assert_eq!(options(""), ActorOptions::default());
}

#[test]
fn negative_amounts_are_rejected_naming_the_key_and_the_value() {
    let err = parse_error("CPU=-1");
    assert_eq!(
        err,
        ResourceError::InvalidAmount {
            name: "CPU".into(),
            source: AmountError::Negative("-1".into())
        }
    );
    assert_eq!(
        chain(&err),
        "invalid amount for resource `CPU`: amount must not be negative, got -1"
    );
    for (text, key, value) in [
        ("custom=-0.5", "`custom`", "-0.5"),
        (r#"{"GPU": -1}"#, "`GPU`", "-1"),
        (
            r#"{"accelerator_type:A100": -0.001}"#,
            "`accelerator_type:A100`",
            "-0.001",
        ),
        ("memory=-1GB", "`memory`", "-1GB"),
        (
            r#"{"object_store_memory": -5}"#,
            "`object_store_memory`",
            "-5",
        ),
    ] {
        let message = chain(&parse_error(text));
        assert!(
            message.contains(key) && message.contains(value),
            "{text}: {message}"
        );
        assert!(message.contains("negative"), "{text}: {message}");
    }
    assert!(matches!(
        ResourceAmount::try_from(-1.0),
        Err(AmountError::Negative(_))
    ));
}

#[test]
fn precision_finer_than_a_ten_thousandth_is_rejected() {
    let err = parse_error("CPU=0.00001");
    assert_eq!(
        err,
        ResourceError::InvalidAmount {
            name: "CPU".into(),
            source: AmountError::TooPrecise("0.00001".into())
        }
    );
    assert_eq!(
        chain(&err),
        "invalid amount for resource `CPU`: the precision of a fractional amount cannot go beyond 0.0001, got 0.00001"
    );
    let json = chain(&parse_error(r#"{"custom": 0.00015}"#));
    assert!(
        json.contains("`custom`") && json.contains("0.00015"),
        "{json}"
    );
    let gpu = chain(&parse_error("GPU=0.12345"));
    assert!(gpu.contains("`GPU`") && gpu.contains("0.12345"), "{gpu}");
    // The finest step itself is fine.
    assert_eq!(
        options("custom=0.0001").resources.amount("custom"),
        ResourceAmount::STEP
    );
}

#[test]
fn memory_that_is_not_a_byte_size_is_rejected_naming_the_key_and_the_value() {
    let err = parse_error("memory=ten GB");
    assert_eq!(
        err,
        ResourceError::InvalidByteSize {
            name: "memory".into(),
            source: ByteSizeError::Syntax("ten GB".into())
        }
    );
    for text in [
        r#"{"memory": "ten GB"}"#,
        "memory=10XB",
        r#"{"object_store_memory": "lots"}"#,
    ] {
        let message = chain(&parse_error(text));
        let (key, value) = if text.contains("object_store") {
            ("`object_store_memory`", "lots")
        } else if text.contains("XB") {
            ("`memory`", "10XB")
        } else {
            ("`memory`", "ten GB")
        };
        assert!(
            message.contains(key) && message.contains(value),
            "{text}: {message}"
        );
        assert!(message.contains("byte size"), "{text}: {message}");
    }
    let err = chain(&parse_error(r#"{"memory": true}"#));
    assert!(
        err.contains("`memory`") && err.contains("a boolean"),
        "{err}"
    );
}

#[test]
fn a_fractional_byte_count_built_in_code_is_rejected_by_the_conversion() {
    let built = Resources::new().with("memory", amount("0.5"));
    let err = ActorOptions::try_from(&built).unwrap_err();
    assert_eq!(
        err.to_string(),
        "resource `memory` must be a whole number of bytes, got 0.5"
    );
}

#[test]
fn options_serialise_as_json_numbers_with_integer_bytes() {
    let json = serde_json::to_value(options(
        r#"{"CPU": 1, "GPU": 0.5, "memory": "1KiB", "accelerator_type:A100": 0.001}"#,
    ))
    .unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "num_cpus": 1,
            "num_gpus": 0.5,
            "memory": 1024,
            "object_store_memory": null,
            "resources": {"accelerator_type:A100": 0.001}
        })
    );
}
