//! Properties of amounts, dictionaries and the conversion into actor options.

use proptest::prelude::*;
use trainyard_resources::{
    ActorOptions, AmountError, RESERVED, ResourceAmount, Resources, STEPS_PER_UNIT, WHOLE_ABOVE_ONE,
};

/// Amounts with at most 15 significant digits: every `f64` text of them is exact.
const MAX_F64_EXACT_STEPS: u128 = 1_000_000_000_000_000;

/// The most bytes a byte resource may hold: [`ResourceAmount::MAX`]'s whole part.
const MAX_BYTES: u64 = 922_337_203_685_477;

/// An amount with a whole part below 1000 and any fraction: where `whole + frac` in
/// floating point would round twice.
fn small_amount() -> impl Strategy<Value = ResourceAmount> {
    (0..1000u128, 0..STEPS_PER_UNIT)
        .prop_map(|(whole, steps)| ResourceAmount::from_steps(whole * STEPS_PER_UNIT + steps))
}

/// An amount whose `f64` text is exact, with small whole parts as often as large ones.
fn f64_exact_amount() -> impl Strategy<Value = ResourceAmount> {
    prop_oneof![
        small_amount(),
        (0..MAX_F64_EXACT_STEPS).prop_map(ResourceAmount::from_steps),
    ]
}

fn custom_name() -> impl Strategy<Value = String> {
    "(accelerator_type:)?[A-Za-z][A-Za-z0-9_]{0,12}".prop_filter(
        "reserved names and whole-above-one accelerators have their own rules",
        |name| !RESERVED.contains(&name.as_str()) && !WHOLE_ABOVE_ONE.contains(&name.as_str()),
    )
}

/// A GPU amount that is valid: fractional up to 1, whole above.
fn gpu_amount() -> impl Strategy<Value = ResourceAmount> {
    prop_oneof![
        (0..=STEPS_PER_UNIT).prop_map(ResourceAmount::from_steps),
        (1u64..=64).prop_map(ResourceAmount::from_units),
    ]
}

/// A valid resource dictionary over reserved and custom names, zero amounts included.
fn valid_dict() -> impl Strategy<Value = Resources> {
    (
        proptest::option::of(0..=100_000_000u128),
        proptest::option::of(gpu_amount()),
        proptest::option::of(0..=MAX_BYTES),
        proptest::option::of(0..=MAX_BYTES),
        proptest::collection::btree_map(custom_name(), 0..=MAX_F64_EXACT_STEPS, 0..6),
    )
        .prop_map(|(cpu, gpu, memory, object_store, custom)| {
            let mut dict = Resources::new();
            if let Some(steps) = cpu {
                dict.insert("CPU", ResourceAmount::from_steps(steps));
            }
            if let Some(gpu) = gpu {
                dict.insert("GPU", gpu);
            }
            if let Some(bytes) = memory {
                dict.insert("memory", ResourceAmount::from_units(bytes));
            }
            if let Some(bytes) = object_store {
                dict.insert("object_store_memory", ResourceAmount::from_units(bytes));
            }
            for (name, steps) in custom {
                dict.insert(name, ResourceAmount::from_steps(steps));
            }
            dict
        })
}

/// About one small amount in a thousand rounds twice when computed as `whole + frac`, so the
/// properties over small amounts need many cases to meet one.
const SMALL_AMOUNT_CASES: u32 = 20_000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(SMALL_AMOUNT_CASES))]

    #[test]
    fn amounts_with_small_whole_parts_survive_a_json_round_trip(original in small_amount()) {
        let json = serde_json::to_string(&original).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let back: ResourceAmount = serde_json::from_str(&json).map_err(|e| TestCaseError::fail(format!("{json}: {e}")))?;
        prop_assert_eq!(back, original, "{}", json);
        prop_assert_eq!(json, original.to_string());
    }

    #[test]
    fn amounts_with_small_whole_parts_survive_conversion_through_f64(original in small_amount()) {
        prop_assert_eq!(ResourceAmount::try_from(original.as_f64()), Ok(original));
    }

    #[test]
    fn displayed_amounts_survive_conversion_from_f64(original in f64_exact_amount()) {
        let float: f64 = original.to_string().parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(ResourceAmount::try_from(float), Ok(original));
        prop_assert_eq!(original.as_f64(), float);
    }
}

proptest! {
    #[test]
    fn amounts_survive_parse_display_parse(steps in 0..=ResourceAmount::MAX.steps()) {
        let original = ResourceAmount::from_steps(steps);
        let text = original.to_string();
        let parsed: ResourceAmount = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(parsed, original);
        prop_assert_eq!(parsed.to_string(), text);
    }

    #[test]
    fn amounts_above_the_largest_are_refused_by_name(steps in ResourceAmount::MAX.steps() + 1..) {
        let text = ResourceAmount::from_steps(steps).to_string();
        prop_assert_eq!(text.parse::<ResourceAmount>(), Err(AmountError::TooLarge(text.clone())));
    }

    #[test]
    fn user_text_with_trailing_zeros_and_exponents_parses_to_its_value(
        whole in 0u64..1_000_000_000,
        fraction in 0u32..10_000,
        padding in 0usize..4,
        exponent in 0u32..4,
    ) {
        let text = format!("{whole}.{fraction:04}{}", "0".repeat(padding));
        let parsed: ResourceAmount = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let expected = u128::from(whole) * STEPS_PER_UNIT + u128::from(fraction);
        prop_assert_eq!(parsed.steps(), expected);
        prop_assert_eq!(parsed.to_string().parse::<ResourceAmount>(), Ok(parsed));
        // `W.Fe+k` is the same number written with an exponent.
        let scaled: ResourceAmount = format!("{whole}e{exponent}").parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(scaled.steps(), u128::from(whole) * 10u128.pow(exponent) * STEPS_PER_UNIT);
    }

    #[test]
    fn a_fifth_decimal_digit_is_rejected_never_rounded(
        whole in 0u64..1_000_000,
        fraction in 0u32..100_000,
    ) {
        prop_assume!(fraction % 10 != 0);
        let text = format!("{whole}.{fraction:05}");
        prop_assert_eq!(text.parse::<ResourceAmount>(), Err(AmountError::TooPrecise(text.clone())));
        let float: f64 = text.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert!(matches!(ResourceAmount::try_from(float), Err(AmountError::TooPrecise(_))), "{}", text);
    }

    #[test]
    fn sums_of_tenths_never_drift(tenths in proptest::collection::vec(0u32..=10, 1..200)) {
        let sum: ResourceAmount = tenths
            .iter()
            .map(|&t| ResourceAmount::try_from(f64::from(t) / 10.0).expect("a tenth is on the grid"))
            .sum();
        let expected: u32 = tenths.iter().sum();
        prop_assert_eq!(sum.steps(), u128::from(expected) * STEPS_PER_UNIT / 10);
    }

    #[test]
    fn resources_display_parses_back_to_the_same_dictionary(dict in valid_dict()) {
        let text = dict.to_string();
        let parsed: Resources = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(parsed, dict);
    }

    #[test]
    fn resources_json_parses_back_to_the_same_dictionary(dict in valid_dict()) {
        let json = serde_json::to_string(&dict).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let parsed = Resources::parse_json(&json).map_err(|e| TestCaseError::fail(format!("{json}: {e}")))?;
        prop_assert_eq!(parsed, dict);
    }

    #[test]
    fn conversion_never_puts_a_reserved_key_into_resources(dict in valid_dict()) {
        let options = ActorOptions::try_from(&dict).map_err(|e| TestCaseError::fail(format!("{dict:?}: {e}")))?;
        for reserved in RESERVED {
            prop_assert!(!options.resources.contains(reserved), "{} in {:?}", reserved, options.resources);
        }
        prop_assert_eq!(options.num_cpus, dict.amount("CPU"));
        prop_assert_eq!(options.num_gpus, dict.amount("GPU"));
        prop_assert_eq!(u128::from(options.memory) * STEPS_PER_UNIT, dict.amount("memory").steps());
        prop_assert_eq!(
            options.object_store_memory.map(ResourceAmount::from_units),
            dict.get("object_store_memory")
        );
        for (name, amount) in options.resources.iter() {
            prop_assert_eq!(dict.get(name), Some(amount));
        }
        prop_assert_eq!(
            options.resources.len() + RESERVED.iter().filter(|r| dict.contains(r)).count(),
            dict.len()
        );
    }

    #[test]
    fn actor_options_give_back_the_dictionary_without_zeros(dict in valid_dict()) {
        let options = ActorOptions::try_from(&dict).map_err(|e| TestCaseError::fail(format!("{dict:?}: {e}")))?;
        let back = Resources::from(&options);
        prop_assert!(back.iter().all(|(_, amount)| !amount.is_zero()), "{:?}", back);
        prop_assert_eq!(back, dict.without_zeros());
    }
}
