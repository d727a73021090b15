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

mod broken {
    //! Runtimes broken on purpose: each fails the conformance check named for its defect,
    //! which shows the suite can fail.

    use std::collections::BTreeMap;
    use std::panic::AssertUnwindSafe;
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use futures::FutureExt;
    use trainyard_config::PlacementGroupFactory;
    use trainyard_runtime::sim::faults::{Fault, Faulty};
    use trainyard_runtime::{
        ActorId, ActorRuntime, PlacementGroupId, Request, Response, RuntimeError, TaskSpec,
        conformance,
    };

    use super::cluster;

    /// Kills nothing: actors live on and keep what they hold.
    #[derive(Debug)]
    struct IgnoresKills;

    #[async_trait]
    impl Fault for IgnoresKills {
        async fn kill(
            &self,
            _inner: &dyn ActorRuntime,
            _actor: ActorId,
            _grace: Duration,
        ) -> Result<(), RuntimeError> {
            Ok(())
        }
    }

    /// Waits instead of refusing a group that can never fit.
    #[derive(Debug)]
    struct WaitsForeverWhenInfeasible;

    #[async_trait]
    impl Fault for WaitsForeverWhenInfeasible {
        async fn create_placement_group(
            &self,
            inner: &dyn ActorRuntime,
            factory: &PlacementGroupFactory,
        ) -> Result<PlacementGroupId, RuntimeError> {
            match inner.create_placement_group(factory).await {
                Err(RuntimeError::Infeasible(_)) => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Err(RuntimeError::UnknownPlacementGroup(PlacementGroupId(
                        u64::MAX,
                    )))
                }
                other => other,
            }
        }
    }

    /// Loses the task's own environment on the way.
    #[derive(Debug)]
    struct DropsTaskEnv;

    #[async_trait]
    impl Fault for DropsTaskEnv {
        async fn call(
            &self,
            inner: &dyn ActorRuntime,
            actor: ActorId,
            request: Request,
        ) -> Result<Response, RuntimeError> {
            let request = match request {
                Request::RunTask {
                    attempt,
                    task: TaskSpec::Function { name, arg, .. },
                } => Request::RunTask {
                    attempt,
                    task: TaskSpec::Function {
                        name,
                        arg,
                        env: BTreeMap::new(),
                    },
                },
                other => other,
            };
            inner.call(actor, request).await
        }
    }

    /// The panic message of a check that must fail.
    async fn failure_of(check: impl Future<Output = ()>) -> String {
        match AssertUnwindSafe(check).catch_unwind().await {
            Ok(()) => panic!("the check passed on a broken runtime"),
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_whose_kills_free_nothing_fails_the_accounting_check() {
        let runtime = Faulty::wrap(Arc::new(cluster()), IgnoresKills);
        let message = failure_of(conformance::accounting(&runtime)).await;
        assert!(message.contains("accounting:"), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_that_waits_on_an_infeasible_group_fails_the_fail_fast_check() {
        let runtime = Faulty::wrap(Arc::new(cluster()), WaitsForeverWhenInfeasible);
        let message = failure_of(conformance::infeasible_fails_fast(&runtime)).await;
        assert!(message.contains("infeasible_fails_fast:"), "{message}");
    }

    #[tokio::test]
    async fn a_runtime_that_loses_the_task_env_fails_the_env_check() {
        let runtime = Faulty::wrap(Arc::new(cluster()), DropsTaskEnv);
        let message = failure_of(conformance::env_reaches_actor(&runtime)).await;
        assert!(message.contains("env_reaches_actor:"), "{message}");
    }

    #[tokio::test]
    async fn the_simulated_cluster_fails_the_command_checks_it_cannot_run() {
        let message = failure_of(conformance::command_sees_its_environment(&cluster())).await;
        assert!(
            message.contains("command_sees_its_environment:"),
            "{message}"
        );
    }
}
