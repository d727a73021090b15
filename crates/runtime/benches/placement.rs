//! Placement of large groups: 10 000 bundles over 1 000 nodes.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ResourceAmount, Resources};
use trainyard_runtime::placement::{check_feasible, place};

fn nodes(count: usize, cpus: u64) -> Vec<Resources> {
    vec![
        Resources::new()
            .with("CPU", cpus)
            .with("memory", 64_000_000_000u64);
        count
    ]
}

fn bundles(count: usize, strategy: PlacementStrategy) -> PlacementGroupFactory {
    PlacementGroupFactory {
        bundles: vec![Resources::new().with("CPU", ResourceAmount::ONE); count],
        strategy,
    }
}

fn placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("placement");

    // Room for every bundle: 1 000 nodes of 16 CPUs.
    let roomy = nodes(1_000, 16);
    // Exactly full: 4 000 bundles on 1 000 nodes of 4 CPUs.
    let tight = nodes(1_000, 4);
    for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
        let big = bundles(10_000, strategy);
        assert!(place(&roomy, &big).is_some(), "{strategy} fits");
        group.bench_function(
            format!("place {strategy} 10k bundles on 1k nodes x 16 CPU"),
            |b| {
                b.iter(|| place(black_box(&roomy), black_box(&big)));
            },
        );
        let full = bundles(4_000, strategy);
        assert!(
            place(&tight, &full).is_some(),
            "{strategy} fills the cluster"
        );
        group.bench_function(
            format!("place {strategy} 4k bundles on 1k nodes x 4 CPU"),
            |b| {
                b.iter(|| place(black_box(&tight), black_box(&full)));
            },
        );
        // More bundles than CPUs: refused on the cluster's totals before any search.
        assert!(
            place(&tight, &big).is_none(),
            "{strategy} cannot fit 10k on 4k CPUs"
        );
        group.bench_function(
            format!("place {strategy} 10k bundles on 1k nodes x 4 CPU (no room)"),
            |b| {
                b.iter(|| place(black_box(&tight), black_box(&big)));
            },
        );
    }

    let spread = bundles(1_000, PlacementStrategy::StrictSpread);
    assert!(place(&roomy, &spread).is_some());
    group.bench_function("place STRICT_SPREAD 1k bundles on 1k nodes", |b| {
        b.iter(|| place(black_box(&roomy), black_box(&spread)));
    });

    let big = bundles(10_000, PlacementStrategy::Pack);
    assert!(check_feasible(&roomy, &big).is_ok());
    group.bench_function(
        "check_feasible PACK 10k bundles on 1k nodes x 16 CPU",
        |b| {
            b.iter(|| check_feasible(black_box(&roomy), black_box(&big)));
        },
    );
    assert!(check_feasible(&tight, &big).is_err());
    group.bench_function(
        "check_feasible PACK 10k bundles on 1k nodes x 4 CPU (infeasible)",
        |b| {
            b.iter(|| check_feasible(black_box(&tight), black_box(&big)));
        },
    );
    group.finish();
}

criterion_group! {
    name = benches;
    // Defaults only: criterion's flags (`cargo bench -- --sample-size 50`) override them.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500));
    targets = placement
}
criterion_main!(benches);
