//! Ray Train's `test_backend.py`, ported onto the simulated cluster.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common;

use serde_json::{Value, json};
use trainyard_backend_executor::{
    AttemptFailure, BackendExecutor, ExecutorError, ExecutorOptions, FitReport, SharingRule,
    TrainContext, WorldRank, default_rules,
};
use trainyard_config::{FailureConfig, PlacementStrategy, RunConfig, ScalingConfig};
use trainyard_resources::Resources;
use trainyard_runtime::sim::faults::KillActorAfterCalls;
use trainyard_runtime::sim::{SimNode, SimRuntime};
use trainyard_runtime::{ActorRuntime, DeathCause, FunctionRegistry, TaskFailure, TaskSpec};

/// How many ranks of `preempted_until` wait for their preemption.
static WAITING_FOR_PREEMPTION: AtomicU32 = AtomicU32::new(0);

fn functions() -> FunctionRegistry {
    FunctionRegistry::with_builtins()
        .register("one", |_| async { Ok(json!(1)) })
        .register("ranks", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            Ok(json!({
                "world_rank": ctx.world_rank().0,
                "local_rank": ctx.local_rank(),
                "local_world_size": ctx.local_world_size(),
                "node_rank": ctx.node_rank(),
                "world_size": ctx.world_size(),
                "restart_count": ctx.restart_count(),
            }))
        })
        .register("fail_until", |task| async move {
            // Fails on rank 0 while the restart count is below the argument.
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            let until = ctx.arg().as_u64().unwrap_or(u64::MAX);
            if ctx.world_rank().0 == 0 && u64::from(ctx.restart_count()) < until {
                return Err(format!("attempt {} fails", ctx.restart_count()));
            }
            ctx.report(json!({"restart_count": ctx.restart_count()}))
                .map_err(|e| e.to_string())?;
            Ok(json!(ctx.restart_count()))
        })
        .register("preempted_until", |task| async move {
            // Blocks, to be preempted, while the restart count is below the argument.
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            if u64::from(ctx.restart_count()) < ctx.arg().as_u64().unwrap_or(u64::MAX) {
                WAITING_FOR_PREEMPTION.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1_000_000)).await;
            }
            Ok(json!(ctx.restart_count()))
        })
        .register("rank0_fails_rank1_blocks", |task| async move {
            let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
            if ctx.world_rank().0 == 0 {
                return Err("user error on rank 0".to_owned());
            }
            tokio::time::sleep(Duration::from_secs(1_000_000)).await;
            Ok(Value::Null)
        })
}

fn task(name: &str) -> TaskSpec {
    TaskSpec::function(name, Value::Null)
}

fn fast() -> ExecutorOptions {
    ExecutorOptions {
        poll_interval: Duration::from_millis(2),
        restart_backoff: trainyard_backend_executor::Backoff::NONE,
        placement_timeout: Duration::from_secs(5),
        ..ExecutorOptions::default()
    }
}

fn executor(sim: &SimRuntime, scaling: ScalingConfig) -> BackendExecutor {
    BackendExecutor {
        scaling,
        options: fast(),
        ..BackendExecutor::new(Arc::new(sim.clone()))
    }
}

fn one_node(cpus: u64) -> SimRuntime {
    common::one_node(cpus, functions())
}

/// Two nodes that share one IP address, as a local multi-node test cluster does.
fn two_nodes_same_ip(cpus: u64) -> SimRuntime {
    SimRuntime::new([
        SimNode::new("node-a").ip("127.0.0.1").cpus(cpus),
        SimNode::new("node-b").ip("127.0.0.1").cpus(cpus),
    ])
    .with_functions(functions())
}

/// Runs `name` and returns one field of each rank's return value.
async fn field(sim: &SimRuntime, scaling: ScalingConfig, name: &str, key: &str) -> Vec<u64> {
    let report = executor(sim, scaling)
        .fit(&task(name))
        .await
        .expect("the run succeeds");
    report
        .returns
        .iter()
        .map(|r| r[key].as_u64().expect("a number"))
        .collect()
}

async fn assert_nothing_left(sim: &SimRuntime) {
    assert_eq!(sim.placement_group_count(), 0, "a placement group leaked");
    assert!(
        sim.live_actors().is_empty(),
        "actors leaked: {:?}",
        sim.live_actors()
    );
    let cluster = sim.cluster().await.expect("cluster");
    assert_eq!(
        cluster.available(),
        cluster.total(),
        "resources were not returned"
    );
}

/// Runs `name` with every event kept; the workers of each started attempt, by node.
async fn started_workers(
    sim: &SimRuntime,
    scaling: ScalingConfig,
    name: &str,
) -> Vec<(u32, u32, Vec<trainyard_backend_executor::StartedWorker>)> {
    use trainyard_backend_executor::RunEvent;

    let (events, mut received) = tokio::sync::mpsc::channel(64);
    let executor = BackendExecutor {
        events: Some(events),
        ..executor(sim, scaling)
    };
    executor.fit(&task(name)).await.expect("the run succeeds");
    let mut started = Vec::new();
    while let Ok(event) = received.try_recv() {
        if let RunEvent::AttemptStarted {
            restart_count,
            world_size,
            workers,
        } = event
        {
            started.push((restart_count, world_size, workers));
        }
    }
    started
}

#[tokio::test]
async fn a_run_starts_its_workers_and_releases_them_all() {
    let sim = one_node(2);
    let started = started_workers(&sim, ScalingConfig::default().num_workers(2), "one").await;
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].2.len(), 2);
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn train_returns_each_ranks_value() {
    let sim = one_node(2);
    let report = executor(&sim, ScalingConfig::default().num_workers(2))
        .fit(&task("one"))
        .await
        .expect("fit");
    assert_eq!(report.returns, [json!(1), json!(1)]);
    assert_eq!(report.attempts, 1);
    assert!(report.failures.is_empty());
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn local_ranks_on_one_node() {
    let got = field(
        &one_node(2),
        ScalingConfig::default().num_workers(2),
        "ranks",
        "local_rank",
    )
    .await;
    assert_eq!(
        got.into_iter().collect::<BTreeSet<_>>(),
        BTreeSet::from([0, 1])
    );
}

#[tokio::test]
async fn local_ranks_follow_node_ids_not_ips() {
    let got = field(
        &two_nodes_same_ip(2),
        ScalingConfig::default().num_workers(4),
        "ranks",
        "local_rank",
    )
    .await;
    assert_eq!(got, [0, 1, 0, 1]);
}

/// Three workers spread over two nodes land on nodes 0, 1, 0; sorting groups them by node.
fn three_spread() -> ScalingConfig {
    ScalingConfig::default()
        .num_workers(3)
        .placement_strategy(PlacementStrategy::Spread)
}

#[tokio::test]
async fn local_world_size_after_sorting() {
    let sim = SimRuntime::new([
        SimNode::new("node-0").ip("10.0.0.1").cpus(2),
        SimNode::new("node-1").ip("10.0.0.2").cpus(2),
    ])
    .with_functions(functions());
    assert_eq!(
        field(&sim, three_spread(), "ranks", "local_world_size").await,
        [2, 2, 1]
    );
    assert_eq!(
        field(
            &two_nodes_same_ip(2),
            three_spread(),
            "ranks",
            "local_world_size"
        )
        .await,
        [2, 2, 1]
    );
}

#[tokio::test]
async fn node_ranks_after_sorting() {
    let sim = SimRuntime::new([
        SimNode::new("node-0").ip("10.0.0.1").cpus(2),
        SimNode::new("node-1").ip("10.0.0.2").cpus(2),
    ])
    .with_functions(functions());
    assert_eq!(
        field(&sim, three_spread(), "ranks", "node_rank").await,
        [0, 0, 1]
    );
    assert_eq!(
        field(&two_nodes_same_ip(2), three_spread(), "ranks", "node_rank").await,
        [0, 0, 1]
    );
}

/// The value of `var` on every rank, as sorted id lists (a multiset: Ray's table order
/// depends on its scheduler, ours on PACK filling the first node first).
async fn visible(
    sim: &SimRuntime,
    scaling: ScalingConfig,
    var: &str,
    rules: Option<Vec<SharingRule>>,
) -> Vec<Vec<u32>> {
    // As upstream, GPU sharing is switched on for these tables (the no-op backend leaves it off).
    let options = ExecutorOptions {
        sharing_rules: Some(rules.unwrap_or_else(|| default_rules(true))),
        ..fast()
    };
    let report = BackendExecutor {
        options,
        ..executor(sim, scaling)
    }
    .fit(&task("trainyard.env"))
    .await
    .expect("the run succeeds");
    let mut all: Vec<Vec<u32>> = report
        .returns
        .iter()
        .map(|env| {
            env[var]
                .as_str()
                .unwrap_or_else(|| panic!("{var} is not set: {env}"))
                .split(',')
                .map(|id| id.parse().expect("numeric id"))
                .collect()
        })
        .collect();
    all.sort();
    all
}

/// Rows of (how many workers, which ids each sees).
type Table = &'static [(usize, &'static [u32])];

fn table(rows: Table) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = rows
        .iter()
        .flat_map(|(n, ids)| std::iter::repeat_n(ids.to_vec(), *n))
        .collect();
    out.sort();
    out
}

fn gpu_cluster(gpus: u32) -> SimRuntime {
    SimRuntime::new([
        SimNode::new("node-a").ip("10.0.0.1").cpus(8).gpus(gpus),
        SimNode::new("node-b").ip("10.0.0.2").cpus(8).gpus(gpus),
    ])
    .with_functions(functions())
}

fn gpu_workers(n: u32, gpu: &str) -> ScalingConfig {
    ScalingConfig::default()
        .num_workers(n)
        .use_gpu(true)
        .resources_per_worker(
            format!("GPU={gpu}")
                .parse::<Resources>()
                .expect("resources"),
        )
}

/// Runs each case (a number of workers and the expected table) on a fresh cluster.
async fn check_tables(
    cluster: impl Fn() -> SimRuntime,
    workers: impl Fn(u32) -> ScalingConfig,
    var: &str,
    rules: Option<Vec<SharingRule>>,
    cases: &[(u32, Table)],
) {
    for &(n, expected) in cases {
        let got = visible(&cluster(), workers(n), var, rules.clone()).await;
        assert_eq!(got, table(expected), "{var} with {n} workers");
    }
}

#[tokio::test]
async fn cuda_visible_devices_one_gpu_per_worker() {
    let cases: [(u32, Table); 4] = [
        (1, &[(1, &[0])]),
        (2, &[(2, &[0, 1])]),
        (3, &[(1, &[0]), (2, &[0, 1])]),
        (4, &[(4, &[0, 1])]),
    ];
    check_tables(
        || gpu_cluster(2),
        |n| gpu_workers(n, "1"),
        "CUDA_VISIBLE_DEVICES",
        None,
        &cases,
    )
    .await;
}

#[tokio::test]
async fn cuda_visible_devices_half_a_gpu_per_worker() {
    let cases: [(u32, Table); 8] = [
        (1, &[(1, &[0])]),
        (2, &[(2, &[0])]),
        (3, &[(3, &[0, 1])]),
        (4, &[(4, &[0, 1])]),
        (5, &[(1, &[0]), (4, &[0, 1])]),
        (6, &[(2, &[0]), (4, &[0, 1])]),
        (7, &[(7, &[0, 1])]),
        (8, &[(8, &[0, 1])]),
    ];
    check_tables(
        || gpu_cluster(2),
        |n| gpu_workers(n, "0.5"),
        "CUDA_VISIBLE_DEVICES",
        None,
        &cases,
    )
    .await;
}

#[tokio::test]
async fn cuda_visible_devices_two_gpus_per_worker() {
    let cases: [(u32, Table); 4] = [
        (1, &[(1, &[0, 1])]),
        (2, &[(2, &[0, 1, 2, 3])]),
        (3, &[(1, &[0, 1]), (2, &[0, 1, 2, 3])]),
        (4, &[(4, &[0, 1, 2, 3])]),
    ];
    check_tables(
        || gpu_cluster(4),
        |n| gpu_workers(n, "2"),
        "CUDA_VISIBLE_DEVICES",
        None,
        &cases,
    )
    .await;
}

fn neuron_cluster() -> SimRuntime {
    SimRuntime::new([
        SimNode::new("node-a")
            .ip("10.0.0.1")
            .cpus(8)
            .accelerators("neuron_cores", 2),
        SimNode::new("node-b")
            .ip("10.0.0.2")
            .cpus(8)
            .accelerators("neuron_cores", 2),
    ])
    .with_functions(functions())
}

fn neuron_workers(n: u32) -> ScalingConfig {
    ScalingConfig::default()
        .num_workers(n)
        .resources_per_worker("neuron_cores=1".parse().expect("resources"))
}

#[tokio::test]
async fn neuron_cores_are_shared_per_node_by_default() {
    let cases: [(u32, Table); 4] = [
        (1, &[(1, &[0])]),
        (2, &[(2, &[0, 1])]),
        (3, &[(1, &[0]), (2, &[0, 1])]),
        (4, &[(4, &[0, 1])]),
    ];
    check_tables(
        neuron_cluster,
        neuron_workers,
        "NEURON_RT_VISIBLE_CORES",
        None,
        &cases,
    )
    .await;
}

#[tokio::test]
async fn neuron_cores_with_sharing_disabled_are_each_workers_own() {
    let mut rules = default_rules(true);
    for rule in &mut rules {
        if rule.resource == "neuron_cores" {
            rule.share = false;
        }
    }
    let cases: [(u32, Table); 3] = [
        (2, &[(1, &[0]), (1, &[1])]),
        (3, &[(2, &[0]), (1, &[1])]),
        (4, &[(2, &[0]), (2, &[1])]),
    ];
    check_tables(
        neuron_cluster,
        neuron_workers,
        "NEURON_RT_VISIBLE_CORES",
        Some(rules.clone()),
        &cases,
    )
    .await;
}

#[tokio::test]
async fn workers_that_request_no_gpu_get_no_cuda_visible_devices() {
    let report = executor(&gpu_cluster(2), ScalingConfig::default().num_workers(2))
        .fit(&task("trainyard.env"))
        .await
        .expect("fit");
    assert!(
        report
            .returns
            .iter()
            .all(|env| env.get("CUDA_VISIBLE_DEVICES").is_none())
    );
}

fn four_by_four() -> SimRuntime {
    SimRuntime::new((0..4).map(|i| {
        SimNode::new(&format!("node-{i}"))
            .ip(&format!("10.0.0.{i}"))
            .cpus(4)
    }))
    .with_functions(functions())
}

async fn nodes_used(strategy: PlacementStrategy, n: u32) -> usize {
    let sim = four_by_four();
    let scaling = ScalingConfig::default()
        .num_workers(n)
        .placement_strategy(strategy);
    let started = started_workers(&sim, scaling, "one").await;
    let nodes: BTreeSet<String> = started
        .iter()
        .flat_map(|(_, _, workers)| workers)
        .map(|w| w.node_id.clone())
        .collect();
    assert_nothing_left(&sim).await;
    nodes.len()
}

#[tokio::test]
async fn pack_uses_the_fewest_nodes_and_spread_the_most() {
    for n in [3u32, 4, 5] {
        assert_eq!(
            nodes_used(PlacementStrategy::Pack, n).await,
            (n as usize).div_ceil(4),
            "PACK n={n}"
        );
        assert_eq!(
            nodes_used(PlacementStrategy::Spread, n).await,
            (n as usize).min(4),
            "SPREAD n={n}"
        );
    }
}

async fn fit_with_failures(
    max_failures: FailureConfig,
    fail_attempts: u64,
) -> Result<FitReport, ExecutorError> {
    let sim = one_node(2);
    let result = BackendExecutor {
        run: RunConfig::default().failure_config(max_failures),
        ..executor(&sim, ScalingConfig::default().num_workers(2))
    }
    .fit(&TaskSpec::function("fail_until", json!(fail_attempts)))
    .await;
    assert_nothing_left(&sim).await;
    result
}

#[tokio::test]
async fn max_failures_allows_exactly_that_many_restarts() {
    for n in [0u32, 1, 10] {
        // Failing n times then succeeding works with n restarts ...
        let report = fit_with_failures(FailureConfig::restarts(n), u64::from(n))
            .await
            .expect("succeeds");
        assert_eq!(report.attempts, n + 1);
        assert_eq!(report.failures.len(), n as usize);
        assert_eq!(
            report.returns[0],
            json!(n),
            "the task sees its restart count"
        );
        // ... failing n + 1 times does not.
        match fit_with_failures(FailureConfig::restarts(n), u64::from(n) + 1).await {
            Err(ExecutorError::TrainingFailed { report }) => {
                assert_eq!(report.attempts, n + 1, "n={n}");
                assert_eq!(report.failures.len(), n as usize + 1);
                assert!(report.failures.iter().all(|f| matches!(
                    f,
                    AttemptFailure::TaskFailed {
                        rank: WorldRank(0),
                        ..
                    }
                )));
            }
            other => panic!("n={n}: expected TrainingFailed, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn preemptions_restart_without_counting_against_max_failures() {
    let sim = one_node(2);
    // The scheduler takes a worker back once both ranks of an attempt run, twice.
    let preempter = {
        let sim = sim.clone();
        tokio::spawn(async move {
            loop {
                if WAITING_FOR_PREEMPTION.load(Ordering::SeqCst) >= 2 {
                    WAITING_FOR_PREEMPTION.store(0, Ordering::SeqCst);
                    if let Some(actor) = sim.live_actors().first() {
                        sim.end_actor(*actor, DeathCause::Preempted);
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let report = BackendExecutor {
        run: RunConfig::default().failure_config(FailureConfig::restarts(0)),
        ..executor(&sim, ScalingConfig::default().num_workers(2))
    }
    .fit(&TaskSpec::function("preempted_until", json!(2)))
    .await
    .expect("preemptions are no failures of the run");
    preempter.abort();
    assert_eq!(report.attempts, 3);
    assert_eq!(report.returns, [json!(2), json!(2)]);
    assert_eq!(report.failures.len(), 2);
    assert!(
        report.failures.iter().all(|f| matches!(
            f,
            AttemptFailure::WorkerDied {
                cause: DeathCause::Preempted,
                ..
            }
        )),
        "{:?}",
        report.failures
    );
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn unlimited_failures_keep_restarting_until_success() {
    let report = fit_with_failures(FailureConfig::unlimited(), 12)
        .await
        .expect("succeeds eventually");
    assert_eq!(report.attempts, 13);
    assert_eq!(
        report.metrics[0]
            .as_ref()
            .map(|m| m["restart_count"].clone()),
        Some(json!(12))
    );
}

#[tokio::test]
async fn a_user_error_on_one_rank_ends_the_run_while_others_block() {
    let sim = one_node(2);
    let executor = executor(&sim, ScalingConfig::default().num_workers(2));
    let task = task("rank0_fails_rank1_blocks");
    let result = tokio::time::timeout(Duration::from_secs(30), executor.fit(&task))
        .await
        .expect("no hang");
    match result {
        Err(ExecutorError::TrainingFailed { report }) => assert_eq!(
            report.failures,
            [AttemptFailure::TaskFailed {
                rank: WorldRank(0),
                failure: TaskFailure::Error {
                    message: "user error on rank 0".into()
                },
                last_lines: vec![],
                error: None,
                left_before: vec![],
            }]
        ),
        other => panic!("expected a user error, got {other:?}"),
    }
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn a_worker_death_is_told_apart_from_a_user_error_and_restarts() {
    let sim = one_node(2);
    // The first actor dies once it has answered its metadata call, as its task starts.
    let flaky: Arc<dyn ActorRuntime> =
        Arc::new(KillActorAfterCalls::new(Arc::new(sim.clone()), 0, 1));
    let executor = BackendExecutor {
        scaling: ScalingConfig::default().num_workers(2),
        options: fast(),
        run: RunConfig::default().failure_config(FailureConfig::restarts(1)),
        ..BackendExecutor::new(flaky)
    };
    let report = executor
        .fit(&task("ranks"))
        .await
        .expect("the restart succeeds");
    assert_eq!(report.attempts, 2);
    assert!(
        matches!(
            report.failures.as_slice(),
            [AttemptFailure::WorkerDied {
                rank: Some(WorldRank(0)),
                ..
            }]
        ),
        "{:?}",
        report.failures
    );
    assert_eq!(report.returns[0]["restart_count"], json!(1));
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn an_infeasible_request_fails_at_once_and_is_not_retried() {
    let sim = one_node(2);
    let executor = BackendExecutor {
        run: RunConfig::default().failure_config(FailureConfig::unlimited()),
        ..executor(
            &sim,
            ScalingConfig::default()
                .num_workers(3)
                .placement_strategy(PlacementStrategy::StrictPack),
        )
    };
    let task = task("one");
    let result = tokio::time::timeout(Duration::from_secs(5), executor.fit(&task))
        .await
        .expect("fails fast");
    let err = result.expect_err("cannot be scheduled");
    assert!(matches!(err, ExecutorError::Unschedulable(_)), "{err:?}");
    let text = trainyard_resources::ErrorChain(&err).to_string();
    assert!(text.contains("CPU"), "{text}");
    assert_nothing_left(&sim).await;
}

#[tokio::test(start_paused = true)]
async fn a_placement_timeout_lists_what_was_asked_and_what_is_free_and_removes_the_group() {
    let sim = one_node(2);
    // Something else holds one of the two CPUs.
    let other = trainyard_config::PlacementGroupFactory {
        bundles: vec!["CPU=1".parse().expect("resources")],
        strategy: PlacementStrategy::Pack,
    };
    let other = sim.create_placement_group(&other).await.expect("reserved");
    sim.wait_placement_group_ready(other, Duration::from_secs(1))
        .await
        .expect("ready");
    let options = ExecutorOptions {
        placement_timeout: Duration::from_secs(100),
        ..fast()
    };
    let err = BackendExecutor {
        options,
        ..executor(&sim, ScalingConfig::default().num_workers(2))
    }
    .fit(&task("one"))
    .await
    .expect_err("times out");
    match &err {
        ExecutorError::PlacementTimeout {
            waited,
            requested,
            available,
        } => {
            assert_eq!(*waited, Duration::from_secs(100));
            assert_eq!(requested.to_string(), "CPU=2");
            assert_eq!(available.amount("CPU").to_string(), "1");
        }
        other => panic!("expected a placement timeout, got {other:?}"),
    }
    assert!(err.to_string().contains("CPU=2"), "{err}");
    sim.remove_placement_group(other).await.expect("removed");
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn a_started_attempt_lists_each_worker_with_its_node_and_ranks() {
    use trainyard_backend_executor::RankInfo;

    let sim = SimRuntime::new([SimNode::new("node-a").ip("10.0.0.1").cpus(2)])
        .with_functions(functions());
    let started = started_workers(&sim, ScalingConfig::default().num_workers(2), "one").await;
    assert_eq!(started.len(), 1, "{started:?}");
    let (restart_count, world_size, workers) = &started[0];
    assert_eq!((*restart_count, *world_size), (0, 2));
    let rank = |r: u32| RankInfo {
        world_rank: WorldRank(r),
        world_size: 2,
        local_rank: r,
        local_world_size: 2,
        node_rank: 0,
    };
    assert_eq!(workers.len(), 2);
    for (r, worker) in (0..).zip(workers) {
        assert_eq!(worker.rank, rank(r));
        assert_eq!(
            (worker.node_id.as_str(), worker.node_ip.as_str()),
            ("node-a", "10.0.0.1")
        );
    }
}

/// Polls of worker 0 never answer; everything else passes through.
#[derive(Debug, Default)]
struct HangWorkerZerosPolls {
    worker_zero: std::sync::Mutex<Option<trainyard_runtime::ActorId>>,
}

#[async_trait::async_trait]
impl trainyard_runtime::sim::faults::Fault for HangWorkerZerosPolls {
    async fn spawn(
        &self,
        inner: &dyn ActorRuntime,
        spec: trainyard_runtime::ActorSpec,
    ) -> Result<trainyard_runtime::ActorId, trainyard_runtime::RuntimeError> {
        let is_zero = spec.name.ends_with("-0");
        let actor = inner.spawn(spec).await?;
        if is_zero {
            *self.worker_zero.lock().expect("lock") = Some(actor);
        }
        Ok(actor)
    }

    async fn call(
        &self,
        inner: &dyn ActorRuntime,
        actor: trainyard_runtime::ActorId,
        request: trainyard_runtime::Request,
    ) -> Result<trainyard_runtime::Response, trainyard_runtime::RuntimeError> {
        let hang = matches!(request, trainyard_runtime::Request::Poll)
            && *self.worker_zero.lock().expect("lock") == Some(actor);
        if hang {
            std::future::pending::<()>().await;
        }
        inner.call(actor, request).await
    }
}

#[tokio::test]
async fn a_ranks_failure_is_not_held_up_by_another_ranks_hung_poll() {
    let functions = functions().register("rank1_fails", |task| async move {
        let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
        if ctx.world_rank().0 == 1 {
            return Err("rank 1 fails".to_owned());
        }
        tokio::time::sleep(Duration::from_secs(1_000_000)).await;
        Ok(Value::Null)
    });
    let sim = common::one_node(2, functions);
    let runtime = trainyard_runtime::sim::faults::Faulty::wrap(
        Arc::new(sim.clone()),
        HangWorkerZerosPolls::default(),
    );
    // The health check would only give up on rank 0 after a minute.
    let executor = BackendExecutor {
        scaling: ScalingConfig::default().num_workers(2),
        options: ExecutorOptions {
            shutdown_patience: Duration::from_millis(100),
            ..fast()
        },
        ..BackendExecutor::new(Arc::new(runtime))
    };
    let task = task("rank1_fails");
    let result = tokio::time::timeout(Duration::from_secs(20), executor.fit(&task))
        .await
        .expect("the failure ends the run without waiting for rank 0's poll");
    match result {
        Err(ExecutorError::TrainingFailed { report }) => assert_eq!(
            report.failures,
            [AttemptFailure::TaskFailed {
                rank: WorldRank(1),
                failure: TaskFailure::Error {
                    message: "rank 1 fails".into()
                },
                last_lines: vec![],
                error: None,
                left_before: vec![],
            }]
        ),
        other => panic!("expected rank 1's error, got {other:?}"),
    }
    assert_nothing_left(&sim).await;
}

/// Spawns never finish.
#[derive(Debug)]
struct SpawnsHang;

#[async_trait::async_trait]
impl trainyard_runtime::sim::faults::Fault for SpawnsHang {
    async fn spawn(
        &self,
        _inner: &dyn ActorRuntime,
        _spec: trainyard_runtime::ActorSpec,
    ) -> Result<trainyard_runtime::ActorId, trainyard_runtime::RuntimeError> {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn workers_that_do_not_start_in_time_fail_the_attempt_and_leave_nothing_behind() {
    let sim = one_node(2);
    let runtime = trainyard_runtime::sim::faults::Faulty::wrap(Arc::new(sim.clone()), SpawnsHang);
    let executor = BackendExecutor {
        scaling: ScalingConfig::default().num_workers(2),
        options: ExecutorOptions {
            start_timeout: Duration::from_secs(30),
            ..fast()
        },
        ..BackendExecutor::new(Arc::new(runtime))
    };
    match executor.fit(&task("one")).await {
        Err(ExecutorError::TrainingFailed { report }) => match report.failures.as_slice() {
            [AttemptFailure::StartFailed { reason }] => {
                assert_eq!(reason, "the workers did not finish within 30s");
            }
            other => panic!("expected a start failure, got {other:?}"),
        },
        other => panic!("expected the run to fail, got {other:?}"),
    }
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn without_gpu_sharing_each_gpu_worker_sees_only_its_own_gpu() {
    let cases: [(u32, Table); 3] = [
        (2, &[(1, &[0]), (1, &[1])]),
        (3, &[(2, &[0]), (1, &[1])]),
        (4, &[(2, &[0]), (2, &[1])]),
    ];
    check_tables(
        || gpu_cluster(2),
        |n| gpu_workers(n, "1"),
        "CUDA_VISIBLE_DEVICES",
        Some(default_rules(false)),
        &cases,
    )
    .await;
}

/// A backend whose `on_start` fails as when rank 0 answers a request wrongly.
#[derive(Debug)]
struct FailingStart;

#[async_trait::async_trait]
impl trainyard_backend_executor::Backend for FailingStart {
    fn name(&self) -> &str {
        "failing-start"
    }

    async fn on_start(
        &self,
        _ctx: trainyard_backend_executor::BackendContext<'_>,
    ) -> Result<trainyard_backend_executor::WorkerEnv, trainyard_backend_executor::BackendError>
    {
        Err(trainyard_backend_executor::BackendError::Protocol {
            backend: self.name().to_owned(),
            worker: 0,
            reason: "no port".to_owned(),
        })
    }
}

#[tokio::test]
async fn a_failing_on_start_is_a_retried_start_failure_that_releases_everything() {
    let sim = one_node(2);
    let executor = BackendExecutor {
        backend: Arc::new(FailingStart),
        scaling: ScalingConfig::default().num_workers(2),
        options: fast(),
        run: RunConfig::default().failure_config(FailureConfig::restarts(2)),
        ..BackendExecutor::new(Arc::new(sim.clone()))
    };
    match executor.fit(&task("one")).await {
        Err(ExecutorError::TrainingFailed { report }) => {
            assert_eq!(
                report.attempts, 3,
                "two restarts, then the third failure ends it"
            );
            assert!(report.failures.iter().all(|f| matches!(
                f,
                AttemptFailure::StartFailed { reason } if reason.contains("no port")
            )));
        }
        other => panic!("expected the run to fail, got {other:?}"),
    }
    assert_nothing_left(&sim).await;
}

#[tokio::test]
async fn a_failed_run_keeps_what_was_reported_before_the_failure() {
    let functions = functions().register("report_then_fail", |task| async move {
        let ctx = TrainContext::new(task).map_err(|e| e.to_string())?;
        ctx.report(json!({"step": 7, "rank": ctx.world_rank().0}))
            .map_err(|e| e.to_string())?;
        if ctx.world_rank().0 == 0 {
            return Err("diverged".to_owned());
        }
        tokio::time::sleep(Duration::from_secs(1_000_000)).await;
        Ok(Value::Null)
    });
    let sim = common::one_node(2, functions);
    let err = executor(&sim, ScalingConfig::default().num_workers(2))
        .fit(&task("report_then_fail"))
        .await
        .expect_err("rank 0 fails");
    match err {
        ExecutorError::TrainingFailed { report } => {
            let rank0 = report.metrics[0]
                .as_ref()
                .expect("rank 0 reported before failing");
            assert_eq!(rank0["step"], json!(7));
            assert!(report.last_report.is_some());
            assert!(report.returns.is_empty());
        }
        other => panic!("expected TrainingFailed, got {other:?}"),
    }
    assert_nothing_left(&sim).await;
}
