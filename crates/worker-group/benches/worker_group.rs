//! The life of a large worker group on a simulated cluster: start, one request to every
//! worker, shutdown.

use std::sync::Arc;
use std::time::Duration;

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
                group
                    .shutdown(Duration::from_secs(5))
                    .await
                    .expect("shut down");
            });
        },
    );
}

criterion_group!(benches, start_execute_shutdown);
criterion_main!(benches);
