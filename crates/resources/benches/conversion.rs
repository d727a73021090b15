//! Cost of the one conversion from a resource dictionary into actor options, and of parsing a
//! dictionary from the two user syntaxes, for a 20-key dictionary.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use trainyard_resources::{ActorOptions, Resources};

/// 20 entries: the four reserved names and 16 custom ones.
fn twenty_keys() -> Vec<(String, String)> {
    let mut entries = vec![
        ("CPU".to_owned(), "8".to_owned()),
        ("GPU".to_owned(), "0.5".to_owned()),
        ("memory".to_owned(), "16GiB".to_owned()),
        ("object_store_memory".to_owned(), "2GB".to_owned()),
        ("accelerator_type:A100".to_owned(), "0.001".to_owned()),
    ];
    entries.extend((0..15).map(|i| (format!("custom_{i:02}"), format!("{}.25", i + 1))));
    entries
}

fn json_text() -> String {
    let body: Vec<String> = twenty_keys()
        .into_iter()
        .map(|(k, v)| {
            if v.chars().all(|c| c.is_ascii_digit() || c == '.') {
                format!("\"{k}\": {v}")
            } else {
                format!("\"{k}\": \"{v}\"")
            }
        })
        .collect();
    format!("{{{}}}", body.join(", "))
}

fn pairs_text() -> String {
    let body: Vec<String> = twenty_keys()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    body.join(",")
}

fn conversion(c: &mut Criterion) {
    let json = json_text();
    let pairs = pairs_text();
    let dict = Resources::parse_json(&json).expect("valid dictionary");
    assert_eq!(dict.len(), 20);
    assert_eq!(
        Resources::parse_pairs(&pairs).expect("valid dictionary"),
        dict
    );

    let mut group = c.benchmark_group("resources/20_keys");
    group.throughput(Throughput::Elements(20));
    group.bench_function("into_actor_options", |b| {
        b.iter(|| black_box(ActorOptions::try_from(black_box(&dict)).expect("valid dictionary")));
    });
    group.bench_function("parse_json", |b| {
        b.iter(|| black_box(Resources::parse_json(black_box(&json)).expect("valid dictionary")));
    });
    group.bench_function("parse_pairs", |b| {
        b.iter(|| black_box(Resources::parse_pairs(black_box(&pairs)).expect("valid dictionary")));
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Defaults only: criterion's flags (`cargo bench -- --measurement-time 10`) override them.
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = conversion
}
criterion_main!(benches);
