//! What `trainyard ps` reads: the names of the run folders of a local storage and every
//! run's `run.json`, for 1 000 runs (the day-two commands answer in at most 200 ms there).
#![allow(
    clippy::disallowed_methods,
    reason = "benches make scratch files of their own"
)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt as _;
use trainyard_checkpoint::{Storage, StorageLocation};

const RUNS: usize = 1_000;

/// A storage of `RUNS` runs with three checkpoints each.
fn storage(root: &std::path::Path) -> Storage {
    trainyard_test_support::runs::write_runs(root, RUNS);
    Storage::open(StorageLocation::Local(root.to_owned()), &BTreeMap::new()).expect("opened")
}

fn list_and_read(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = storage(root.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let one = runtime.block_on(storage.run("run-0000").load());
    assert!(
        matches!(one, Ok(Some(_))),
        "the fixture's run.json reads: {one:?}"
    );
    let mut group = c.benchmark_group("storage/runs");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("list_and_read_1000", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let names = storage.run_names().await.expect("listed");
                let records: Vec<_> = futures::stream::iter(names)
                    .map(|name| {
                        let storage = &storage;
                        async move { storage.run(&name).load().await }
                    })
                    .buffer_unordered(32)
                    .collect()
                    .await;
                black_box(records.len())
            })
        });
    });
    group.finish();
}

criterion_group!(benches, list_and_read);
criterion_main!(benches);
