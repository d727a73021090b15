//! `ResourceAmount` from text and from floats: never a panic; whatever parses prints back to
//! text that parses to the same amount.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trainyard_resources::ResourceAmount;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(amount) = text.parse::<ResourceAmount>() {
        let again: ResourceAmount = amount.to_string().parse().expect("an amount prints back");
        assert_eq!(again, amount, "{text:?}");
    }
    if let Ok(bytes) = <[u8; 8]>::try_from(data.get(..8).unwrap_or_default()) {
        let _ = ResourceAmount::try_from(f64::from_le_bytes(bytes));
    }
});
