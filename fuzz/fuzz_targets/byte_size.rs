//! `ByteSize` from text (`10GB`, `1.5 GiB`, `1e9`): never a panic; a parsed size prints back,
//! in its short form too, to the same number of bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use trainyard_resources::ByteSize;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(size) = text.parse::<ByteSize>() {
        let plain: ByteSize = size.to_string().parse().expect("bytes print back");
        let short: ByteSize = format!("{size:#}")
            .parse()
            .expect("the short form prints back");
        assert_eq!((plain, short), (size, size), "{text:?}");
    }
});
