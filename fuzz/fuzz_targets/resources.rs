//! Resource specs as users write them (`CPU=1,memory=10GB`, or a JSON object): never a panic;
//! a parsed dictionary prints back to a spec that parses to the same dictionary, and converts
//! to actor options or says why not.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trainyard_resources::{ActorOptions, Resources};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for parsed in [Resources::parse_pairs(text), Resources::parse_json(text)] {
        if let Ok(resources) = parsed {
            let again: Resources = resources.to_string().parse().expect("a spec prints back");
            assert_eq!(again, resources, "{text:?}");
            let _ = ActorOptions::try_from(&resources);
        }
    }
});
