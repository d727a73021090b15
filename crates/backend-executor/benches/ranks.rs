//! Rank assignment and accelerator sharing for large worker groups.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use trainyard_backend_executor::{assign_ranks, shared_ids};

fn nodes(workers: usize, per_node: usize) -> Vec<String> {
    (0..workers)
        .map(|i| format!("node-{:06}", i / per_node))
        .collect()
}

fn ranks(c: &mut Criterion) {
    let mut group = c.benchmark_group("assign_ranks");
    for workers in [1_000usize, 100_000] {
        let nodes = nodes(workers, 8);
        group.throughput(Throughput::Elements(workers as u64));
        group.bench_with_input(BenchmarkId::from_parameter(workers), &nodes, |b, nodes| {
            b.iter(|| assign_ranks(black_box(nodes)));
        });
    }
    group.finish();
}

fn sharing(c: &mut Criterion) {
    let workers: Vec<(String, Vec<String>)> = nodes(100_000, 8)
        .into_iter()
        .enumerate()
        .map(|(i, node)| (node, vec![(i % 8).to_string()]))
        .collect();
    c.bench_function("shared_ids/100000", |b| {
        b.iter(|| shared_ids(black_box(&workers)))
    });
}

criterion_group! {
    name = benches;
    // Defaults only: criterion's flags (`cargo bench -- --sample-size 50`) override them.
    config = Criterion::default().sample_size(20);
    targets = ranks, sharing
}
criterion_main!(benches);
