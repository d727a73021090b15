//! Scaling config files, TOML and JSON: never a panic; a config that validates plans.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trainyard_config::ScalingConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for parsed in [
        ScalingConfig::from_toml_str(text),
        ScalingConfig::from_json_str(text),
    ] {
        if let Ok(config) = parsed {
            let _ = config.plan();
        }
    }
});
