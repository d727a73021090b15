//! What `trainyard ps` reads: the names of the run folders of a local storage and every
//! run's `run.json`, for 1 000 runs (the day-two commands answer in at most 200 ms there).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt as _;
use trainyard_checkpoint::{CheckpointRecord, RunRecord, Storage, StorageLocation};

const RUNS: usize = 1_000;

/// A storage of `RUNS` runs with three checkpoints each.
fn storage(root: &std::path::Path) -> Storage {
    let storage =
        Storage::open(StorageLocation::Local(root.to_owned()), &BTreeMap::new()).expect("opened");
    for i in 0..RUNS {
        let name = format!("run-{i:04}");
        let dir = root.join(&name);
        std::fs::create_dir_all(&dir).expect("run folder");
        let mut record = RunRecord::new(&name);
        for index in 1..=3 {
            let metrics = serde_json::json!({"loss": 1.0 / index as f64, "epoch": index});
            record.commit(CheckpointRecord {
                index,
                dir: format!("checkpoint_{index:06}"),
                metrics: metrics.as_object().cloned().unwrap_or_default(),
                files: vec!["model.pt".to_owned()],
                bytes: 1 << 20,
                committed_at: 1.0,
            });
        }
        std::fs::write(
            dir.join("run.json"),
            serde_json::to_vec_pretty(&record).expect("JSON"),
        )
        .expect("run.json");
    }
    storage
}

fn list_and_read(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("tempdir");
    let storage = storage(root.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
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
