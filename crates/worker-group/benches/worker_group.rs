//! The life of a large worker group on a simulated cluster: start, one request to every
//! worker, shutdown; and the start and shutdown of a very large group, where releasing the
//! actors must stay linear in their number.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use trainyard_resources::Resources;
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{ActorRuntime, PlacementGroupFactory, PlacementStrategy, Request};
use trainyard_worker_group::WorkerGroup;

const NODES: u64 = 16;
const CPUS_PER_NODE: u64 = 16;
const WORKERS: usize = 256;

fn start_execute_shutdown(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let sim =
        SimRuntime::new((0..NODES).map(|i| SimNode::new(&format!("node-{i}")).cpus(CPUS_PER_NODE)));
    let runtime: Arc<dyn ActorRuntime> = Arc::new(sim);
    let per_worker: Resources = "CPU=1".parse().expect("valid resources");
    let factory = PlacementGroupFactory {
        bundles: vec![per_worker.clone(); WORKERS],
        strategy: PlacementStrategy::Pack,
    };
    let pg = tokio.block_on(async {
        let pg = runtime
            .create_placement_group(&factory)
            .await
            .expect("feasible");
        runtime
            .wait_placement_group_ready(pg, Duration::from_secs(10))
            .await
            .expect("ready");
        pg
    });

    c.bench_function(
        "worker_group/start_execute_shutdown/256_workers_16_nodes",
        |b| {
            b.to_async(&tokio).iter(|| async {
                let mut group =
                    WorkerGroup::new(Arc::clone(&runtime), pg, vec![per_worker.clone(); WORKERS])
                        .expect("valid group");
                group.start().await.expect("started");
                group.sort_workers_by_node_and_gpu(None);
                let answers = group.execute(Request::NodeInfo).await.expect("answers");
                assert_eq!(answers.len(), WORKERS);
                group.shutdown(Duration::from_secs(5)).await;
            });
        },
    );
}

/// Workers of the very large group: releasing them one `retain` each would take
/// 10 000 × 10 000 steps.
const MANY_WORKERS: usize = 10_000;
const MANY_NODES: u64 = 100;

fn start_and_shutdown_10_000_workers(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let cpus_per_node = u64::try_from(MANY_WORKERS).expect("small") / MANY_NODES;
    let sim = SimRuntime::new(
        (0..MANY_NODES).map(|i| SimNode::new(&format!("node-{i}")).cpus(cpus_per_node)),
    );
    let runtime: Arc<dyn ActorRuntime> = Arc::new(sim);
    let per_worker: Resources = "CPU=1".parse().expect("valid resources");
    let factory = PlacementGroupFactory {
        bundles: vec![per_worker.clone(); MANY_WORKERS],
        strategy: PlacementStrategy::Pack,
    };
    let pg = tokio.block_on(async {
        let pg = runtime
            .create_placement_group(&factory)
            .await
            .expect("feasible");
        runtime
            .wait_placement_group_ready(pg, Duration::from_secs(10))
            .await
            .expect("ready");
        pg
    });

    let new_group = || {
        WorkerGroup::new(
            Arc::clone(&runtime),
            pg,
            vec![per_worker.clone(); MANY_WORKERS],
        )
        .expect("valid group")
    };

    let mut bench = c.benchmark_group("worker_group/10_000_workers_100_nodes");
    bench.sample_size(10);
    bench.bench_function("start_shutdown", |b| {
        b.to_async(&tokio).iter(|| async {
            let mut workers = new_group();
            workers.start().await.expect("started");
            assert_eq!(workers.len(), MANY_WORKERS);
            workers.shutdown(Duration::from_secs(5)).await;
            assert!(workers.is_empty());
        });
    });
    // The shutdown alone (the start is not timed): every actor stops, or is killed.
    for (name, patience) in [
        ("shutdown_stop", Duration::from_secs(5)),
        ("shutdown_kill", Duration::ZERO),
    ] {
        bench.bench_function(name, |b| {
            b.to_async(&tokio).iter_custom(|iters| {
                let new_group = &new_group;
                async move {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let mut workers = new_group();
                        workers.start().await.expect("started");
                        let began = Instant::now();
                        workers.shutdown(patience).await;
                        timed += began.elapsed();
                        assert!(workers.is_empty());
                    }
                    timed
                }
            });
        });
    }
    bench.finish();
}

criterion_group!(
    benches,
    start_execute_shutdown,
    start_and_shutdown_10_000_workers
);
criterion_main!(benches);
