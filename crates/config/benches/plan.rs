//! Planning cost: parse a scaling config from JSON, normalise it and build its placement
//! group, for 1, 1 000 and 100 000 workers. Throughput is per worker, so linear growth shows
//! as a flat elements-per-second figure.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use trainyard_config::ScalingConfig;

const WORKER_COUNTS: [u32; 3] = [1, 1_000, 100_000];

fn config_json(num_workers: u32) -> String {
    format!(
        r#"{{
            "num_workers": {num_workers},
            "use_gpu": true,
            "resources_per_worker": {{"CPU": 4, "GPU": 1, "memory": "16GiB", "custom": 0.5}},
            "trainer_resources": {{"CPU": 1, "memory": "1GB"}},
            "placement_strategy": "SPREAD",
            "accelerator_type": "A100"
        }}"#
    )
}

fn parse_normalise_factory(c: &mut Criterion) {
    let mut group = c.benchmark_group("scaling_config/parse_normalise_factory");
    for n in WORKER_COUNTS {
        let text = config_json(n);
        group.throughput(Throughput::Elements(u64::from(n)));
        group.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, text| {
            b.iter(|| {
                let config = ScalingConfig::from_json_str(black_box(text)).expect("valid config");
                let normalised = config.normalized().expect("valid config");
                let factory = normalised.placement_group_factory().expect("valid config");
                black_box(factory)
            });
        });
    }
    group.finish();
}

fn plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("scaling_config/plan");
    for n in WORKER_COUNTS {
        let config = ScalingConfig::from_json_str(&config_json(n)).expect("valid config");
        group.throughput(Throughput::Elements(u64::from(n)));
        group.bench_with_input(BenchmarkId::from_parameter(n), &config, |b, config| {
            b.iter(|| black_box(config.plan().expect("valid config")));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Defaults only: criterion's flags (`cargo bench -- --measurement-time 10`) override them.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = parse_normalise_factory, plan
}
criterion_main!(benches);
