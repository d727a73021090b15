//! The conformance suite on the simulated cluster.

use trainyard_runtime::conformance;
use trainyard_runtime::sim::{SimNode, SimRuntime};

fn cluster() -> SimRuntime {
    SimRuntime::new([
        SimNode::new("node-a")
            .ip("10.0.0.1")
            .cpus(4)
            .memory(8_000_000_000)
            .gpus(2),
        SimNode::new("node-b")
            .ip("10.0.0.2")
            .cpus(2)
            .memory(4_000_000_000),
        SimNode::new("node-c").ip("10.0.0.2").cpus(1),
    ])
}

#[tokio::test]
async fn the_simulated_cluster_passes_the_whole_conformance_suite() {
    let sim = cluster();
    conformance::run_all(&sim).await;
    assert!(sim.live_actors().is_empty(), "the suite leaked actors");
    assert_eq!(
        sim.placement_group_count(),
        0,
        "the suite leaked placement groups"
    );
}

#[tokio::test(start_paused = true)]
async fn the_suite_passes_on_a_single_node_of_one_cpu_with_paused_time() {
    let sim = SimRuntime::new([SimNode::new("only").cpus(1)]);
    conformance::run_all(&sim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_passes_on_a_multi_threaded_runtime() {
    conformance::run_all(&cluster()).await;
}
