//! Interaction tests: what the worker group asks of its runtime, checked with
//! `MockActorRuntime`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use mockall::predicate::{always, eq};
use trainyard_resources::{ActorOptions, ResourceAmount, ResourceError, Resources};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorSpec, ClusterSnapshot, DeathCause, MockActorRuntime, NodeId,
    PlacementGroupFactory, PlacementGroupId, PlacementInfo, Request, Response, RuntimeError,
    WorkerInfo,
};
use trainyard_worker_group::{KILL_TIMEOUT, WorkerGroup, WorkerGroupError};

const PG: PlacementGroupId = PlacementGroupId(7);
/// A bound for every test that waits; with paused time it costs nothing.
const BOUND: Duration = Duration::from_secs(3600);

fn cpu() -> Resources {
    "CPU=1".parse().expect("valid resources")
}

fn info(actor: ActorId) -> WorkerInfo {
    WorkerInfo {
        node_id: NodeId::from("node-0"),
        node_ip: "10.0.0.1".into(),
        interface: None,
        hostname: "host-0".into(),
        pid: u32::try_from(1000 + actor.0).expect("small pid"),
        task_pid: None,
        accelerator_ids: BTreeMap::new(),
    }
}

/// Spawns hand out actor ids 1, 2, 3, ...; `NodeInfo` answers with `info`.
fn mock_that_starts(workers: u64) -> MockActorRuntime {
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(1);
    mock.expect_spawn()
        .times(usize::try_from(workers).expect("small"))
        .returning(move |_| Ok(ActorId(next.fetch_add(1, Ordering::SeqCst))));
    mock.expect_call()
        .withf(|_, request| *request == Request::NodeInfo)
        .times(usize::try_from(workers).expect("small"))
        .returning(|actor, _| Ok(Response::NodeInfo(info(actor))));
    mock
}

async fn started(mock: MockActorRuntime, workers: usize) -> WorkerGroup {
    let runtime: Arc<dyn ActorRuntime> = Arc::new(mock);
    started_on(runtime, workers).await
}

async fn started_on(runtime: Arc<dyn ActorRuntime>, workers: usize) -> WorkerGroup {
    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); workers]).expect("valid group");
    group.start().await.expect("group starts");
    group
}

/// What [`Holding`] does with an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Passes it on at once.
    Pass,
    /// Passes it on after a while.
    Delay(Duration),
    /// Never answers.
    Forever,
}

/// An operation on the runtime, as [`Holding`]'s rule sees it.
#[derive(Debug, Clone, Copy)]
enum Op<'a> {
    Spawn(&'a ActorSpec),
    Call(ActorId, &'a Request),
    Kill(ActorId),
}

impl Op<'_> {
    /// The bundle a spawn is pinned to.
    fn spawn_bundle(&self) -> Option<usize> {
        match self {
            Op::Spawn(spec) => spec.placement.map(|(_, bundle)| bundle),
            _ => None,
        }
    }
}

type HoldRule = dyn Fn(Op<'_>) -> Hold + Send + Sync;

/// Delays or swallows chosen operations before they reach the mock (mockall answers at
/// once).
struct Holding {
    inner: MockActorRuntime,
    rule: Box<HoldRule>,
}

impl Holding {
    /// Holds calls as `rule` says and passes every other operation on.
    fn runtime(
        inner: MockActorRuntime,
        rule: impl Fn(ActorId, &Request) -> Hold + Send + Sync + 'static,
    ) -> Arc<dyn ActorRuntime> {
        Self::ops(inner, move |op| match op {
            Op::Call(actor, request) => rule(actor, request),
            _ => Hold::Pass,
        })
    }

    /// Holds every operation as `rule` says.
    fn ops(
        inner: MockActorRuntime,
        rule: impl Fn(Op<'_>) -> Hold + Send + Sync + 'static,
    ) -> Arc<dyn ActorRuntime> {
        Arc::new(Self {
            inner,
            rule: Box::new(rule),
        })
    }

    async fn hold(&self, op: Op<'_>) {
        match (self.rule)(op) {
            Hold::Pass => {}
            Hold::Delay(delay) => tokio::time::sleep(delay).await,
            Hold::Forever => futures::future::pending::<()>().await,
        }
    }
}

impl fmt::Debug for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holding")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ActorRuntime for Holding {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        self.inner.cluster().await
    }
    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.inner.create_placement_group(factory).await
    }
    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        self.inner.wait_placement_group_ready(pg, timeout).await
    }
    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        self.inner.remove_placement_group(pg).await
    }
    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        self.hold(Op::Spawn(&spec)).await;
        self.inner.spawn(spec).await
    }
    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        self.hold(Op::Call(actor, &request)).await;
        self.inner.call(actor, request).await
    }
    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.hold(Op::Kill(actor)).await;
        self.inner.kill(actor, grace).await
    }
}

fn died(actor: ActorId) -> RuntimeError {
    RuntimeError::ActorDied {
        actor,
        cause: DeathCause::NodeLost {
            node: NodeId::from("node-0"),
        },
    }
}

#[tokio::test]
async fn the_third_of_four_spawns_failing_kills_the_other_three_once_each_and_keeps_the_placement_group()
 {
    let mut mock = MockActorRuntime::new();
    let spawns = AtomicU64::new(0);
    mock.expect_spawn().times(4).returning(move |spec| {
        let n = spawns.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            spec.placement,
            Some((PG, usize::try_from(n).expect("small")))
        );
        if n == 2 {
            Err(RuntimeError::SpawnFailed {
                name: spec.name,
                reason: "no such binary".into(),
            })
        } else {
            Ok(ActorId(n + 1))
        }
    });
    for id in [1, 2, 4] {
        mock.expect_kill()
            .with(eq(ActorId(id)), eq(Duration::ZERO))
            .times(1)
            .returning(|_, _| Ok(()));
    }
    mock.expect_call().never();
    mock.expect_remove_placement_group().never();
    let runtime: Arc<dyn ActorRuntime> = Arc::new(mock);

    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); 4]).expect("valid group");
    let error = group.start().await.expect_err("the third spawn fails");

    assert!(
        matches!(
            &error,
            WorkerGroupError::Start { worker: 2, bundle_index: 2, source }
                if matches!(**source, RuntimeError::SpawnFailed { .. })
        ),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "cannot start worker 2 in bundle 2");
    assert_eq!(error.worker(), Some(2));
    assert!(group.is_empty());
    assert!(!group.is_started());
}

#[tokio::test(start_paused = true)]
async fn eight_workers_whose_spawns_take_100_ms_each_start_in_about_100_ms() {
    let spawn_time = Duration::from_millis(100);
    let runtime = Holding::ops(mock_that_starts(8), move |op| match op {
        Op::Spawn(_) => Hold::Delay(spawn_time),
        _ => Hold::Pass,
    });

    let began = tokio::time::Instant::now();
    let group = tokio::time::timeout(BOUND, started_on(runtime, 8))
        .await
        .expect("start returns");

    assert_eq!(group.len(), 8);
    let took = began.elapsed();
    assert!(took >= spawn_time, "started before any spawn returned");
    assert!(
        took < spawn_time * 2,
        "spawns ran one after the other: {took:?} for 8 workers"
    );
}

#[tokio::test(start_paused = true)]
async fn when_two_spawns_fail_the_error_names_the_lower_worker_index() {
    let mut mock = MockActorRuntime::new();
    mock.expect_spawn()
        .times(4)
        .returning(|spec| match spec.placement {
            Some((_, bundle @ (1 | 3))) => Err(RuntimeError::SpawnFailed {
                name: format!("worker-{bundle}"),
                reason: "no such binary".into(),
            }),
            Some((_, bundle)) => Ok(ActorId(u64::try_from(bundle).expect("small") + 1)),
            None => panic!("every worker is pinned to a bundle"),
        });
    for id in [1, 3] {
        mock.expect_kill()
            .with(eq(ActorId(id)), always())
            .times(1)
            .returning(|_, _| Ok(()));
    }
    mock.expect_call().never();
    // Worker 1 fails last.
    let runtime = Holding::ops(mock, |op| {
        if op.spawn_bundle() == Some(1) {
            Hold::Delay(Duration::from_secs(1))
        } else {
            Hold::Pass
        }
    });

    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); 4]).expect("valid group");
    let error = tokio::time::timeout(BOUND, group.start())
        .await
        .expect("start returns")
        .expect_err("two spawns fail");
    assert!(
        matches!(error, WorkerGroupError::Start { worker: 1, .. }),
        "{error:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn when_two_metadata_calls_fail_the_error_names_the_lower_worker_index() {
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(1);
    mock.expect_spawn()
        .times(3)
        .returning(move |_| Ok(ActorId(next.fetch_add(1, Ordering::SeqCst))));
    mock.expect_call()
        .withf(|_, r| *r == Request::NodeInfo)
        .times(3)
        .returning(|actor, _| {
            if actor == ActorId(2) {
                Ok(Response::NodeInfo(info(actor)))
            } else {
                Err(died(actor))
            }
        });
    for id in 1..=3 {
        mock.expect_kill()
            .with(eq(ActorId(id)), always())
            .times(1)
            .returning(|_, _| Ok(()));
    }
    // Worker 0's call fails last.
    let runtime = Holding::runtime(mock, |actor, _| {
        if actor == ActorId(1) {
            Hold::Delay(Duration::from_secs(1))
        } else {
            Hold::Pass
        }
    });

    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); 3]).expect("valid group");
    let error = tokio::time::timeout(BOUND, group.start())
        .await
        .expect("start returns")
        .expect_err("two workers are dead");
    assert!(
        matches!(error, WorkerGroupError::Worker { worker: 0, .. }),
        "{error:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_start_leaves_its_actors_to_the_next_shutdown() {
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(1);
    mock.expect_spawn()
        .times(2)
        .returning(move |_| Ok(ActorId(next.fetch_add(1, Ordering::SeqCst))));
    mock.expect_call().never();
    for id in 1..=2 {
        mock.expect_kill()
            .with(eq(ActorId(id)), eq(Duration::ZERO))
            .times(1)
            .returning(|_, _| Ok(()));
    }
    // The spawn in bundle 2 never returns.
    let runtime = Holding::ops(mock, |op| {
        if op.spawn_bundle() == Some(2) {
            Hold::Forever
        } else {
            Hold::Pass
        }
    });
    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); 3]).expect("valid group");

    tokio::time::timeout(Duration::from_secs(1), group.start())
        .await
        .expect_err("start is abandoned");
    assert!(!group.is_started());
    assert!(group.is_empty());

    tokio::time::timeout(BOUND, group.shutdown(Duration::ZERO))
        .await
        .expect("shutdown returns");
}

#[tokio::test(start_paused = true)]
async fn starting_again_after_an_abandoned_start_first_kills_the_actors_it_left() {
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(1);
    mock.expect_spawn()
        .times(2 + 3)
        .returning(move |_| Ok(ActorId(next.fetch_add(1, Ordering::SeqCst))));
    mock.expect_call()
        .withf(|_, r| *r == Request::NodeInfo)
        .times(3)
        .returning(|actor, _| Ok(Response::NodeInfo(info(actor))));
    for id in 1..=2 {
        mock.expect_kill()
            .with(eq(ActorId(id)), eq(Duration::ZERO))
            .times(1)
            .returning(|_, _| Ok(()));
    }
    // The first spawn in bundle 2 never returns; the second one does.
    let held = std::sync::atomic::AtomicBool::new(false);
    let runtime = Holding::ops(mock, move |op| {
        if op.spawn_bundle() == Some(2) && !held.swap(true, Ordering::SeqCst) {
            Hold::Forever
        } else {
            Hold::Pass
        }
    });
    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); 3]).expect("valid group");

    tokio::time::timeout(Duration::from_secs(1), group.start())
        .await
        .expect_err("start is abandoned");
    tokio::time::timeout(BOUND, group.start())
        .await
        .expect("start returns")
        .expect("the group starts on a second try");

    let actors: Vec<ActorId> = group.workers().iter().map(|w| w.actor).collect();
    assert_eq!(actors.len(), 3);
    assert!(!actors.contains(&ActorId(1)) && !actors.contains(&ActorId(2)));
}

#[tokio::test]
async fn a_failed_metadata_call_kills_every_spawned_actor_once() {
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(1);
    mock.expect_spawn()
        .times(3)
        .returning(move |_| Ok(ActorId(next.fetch_add(1, Ordering::SeqCst))));
    mock.expect_call()
        .withf(|_, r| *r == Request::NodeInfo)
        .returning(|actor, _| {
            if actor == ActorId(2) {
                Err(died(actor))
            } else {
                Ok(Response::NodeInfo(info(actor)))
            }
        });
    for id in 1..=3 {
        mock.expect_kill()
            .with(eq(ActorId(id)), always())
            .times(1)
            .returning(|_, _| Ok(()));
    }
    mock.expect_remove_placement_group().never();
    let runtime: Arc<dyn ActorRuntime> = Arc::new(mock);

    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); 3]).expect("valid group");
    let error = group.start().await.expect_err("worker 1 is dead");

    assert!(
        matches!(error, WorkerGroupError::Worker { worker: 1, .. }),
        "{error:?}"
    );
    assert!(error.is_actor_death());
    assert!(group.is_empty());
}

#[tokio::test]
async fn actors_are_spawned_with_their_options_bundle_name_and_env() {
    let per_worker: Resources = "CPU=2,GPU=1,memory=1GB,custom=3".parse().expect("valid");
    let options = ActorOptions::try_from(&per_worker).expect("valid options");
    let env = BTreeMap::from([("RUN".to_owned(), "42".to_owned())]);
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(0);
    {
        let env = env.clone();
        mock.expect_spawn().times(2).returning(move |spec| {
            let n = next.fetch_add(1, Ordering::SeqCst);
            let bundle = usize::try_from(n).expect("small");
            assert_eq!(spec.name, format!("trainer-{bundle}"));
            assert_eq!(spec.options, options);
            assert_eq!(spec.placement, Some((PG, bundle)));
            assert_eq!(spec.env, env);
            Ok(ActorId(n + 1))
        });
    }
    mock.expect_call()
        .returning(|actor, _| Ok(Response::NodeInfo(info(actor))));
    let runtime: Arc<dyn ActorRuntime> = Arc::new(mock);

    let mut group = WorkerGroup::new(runtime, PG, vec![per_worker.clone(); 2])
        .expect("valid group")
        .with_env(env)
        .with_name_prefix("trainer");
    group.start().await.expect("group starts");

    assert_eq!(group.len(), 2);
    let workers = group.workers();
    assert_eq!(workers[0].actor, ActorId(1));
    assert_eq!(workers[1].bundle_index, 1);
    assert_eq!(workers[1].metadata, info(ActorId(2)));
    assert_eq!(workers[0].resources, per_worker);
    assert_eq!(workers[0].options.memory, 1_000_000_000);
}

#[tokio::test(start_paused = true)]
async fn shutdown_kills_after_the_patience_when_stop_never_answers() {
    let mut mock = mock_that_starts(2);
    // Actor 1 never answers Stop (held below); actor 2 stops and is not killed.
    mock.expect_call()
        .withf(|actor, r| *actor == ActorId(2) && *r == Request::Stop)
        .times(1)
        .returning(|_, _| Ok(Response::Done));
    mock.expect_kill()
        .with(eq(ActorId(1)), eq(Duration::ZERO))
        .times(1)
        .returning(|_, _| Ok(()));
    mock.expect_kill().with(eq(ActorId(2)), always()).never();
    let runtime = Holding::runtime(mock, |actor, request| {
        if actor == ActorId(1) && *request == Request::Stop {
            Hold::Forever
        } else {
            Hold::Pass
        }
    });
    let mut group = started_on(runtime, 2).await;

    let patience = Duration::from_secs(30);
    let began = tokio::time::Instant::now();
    tokio::time::timeout(BOUND, group.shutdown(patience))
        .await
        .expect("shutdown returns");

    assert!(
        began.elapsed() >= patience,
        "killed before the patience ran out"
    );
    assert!(
        began.elapsed() < patience * 2,
        "waited far beyond the patience"
    );
    assert!(group.is_empty());
    assert!(matches!(
        group.execute(Request::NodeInfo).await,
        Err(WorkerGroupError::NotActive)
    ));
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_dead_actors_does_not_hang_and_kills_nothing_twice() {
    let mut mock = mock_that_starts(3);
    mock.expect_call()
        .withf(|actor, r| *actor != ActorId(2) && *r == Request::Stop)
        .times(2)
        .returning(|_, _| Ok(Response::Done));
    mock.expect_call()
        .withf(|actor, r| *actor == ActorId(2) && *r == Request::Stop)
        .times(1)
        .returning(|actor, _| Err(died(actor)));
    mock.expect_kill()
        .with(eq(ActorId(2)), always())
        .times(1)
        .returning(|_, _| Ok(()));
    let mut group = started(mock, 3).await;

    let began = tokio::time::Instant::now();
    tokio::time::timeout(BOUND, group.shutdown(Duration::from_secs(30)))
        .await
        .expect("shutdown returns");
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "waited on a dead actor"
    );

    // A second shutdown touches nothing (the mock would reject another call or kill).
    group.shutdown(Duration::from_secs(30)).await;
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_dropped_mid_way_is_finished_by_the_next_one_killing_every_actor_once() {
    let mut mock = mock_that_starts(3);
    mock.expect_call().withf(|_, r| *r == Request::Stop).never();
    for id in 1..=3 {
        mock.expect_kill()
            .with(eq(ActorId(id)), eq(Duration::ZERO))
            .times(1)
            .returning(|_, _| Ok(()));
    }
    mock.expect_remove_placement_group().never();
    let runtime = Holding::runtime(mock, |_, request| {
        if *request == Request::Stop {
            Hold::Forever
        } else {
            Hold::Pass
        }
    });
    let mut group = started_on(runtime, 3).await;

    let patience = Duration::from_secs(30);
    tokio::time::timeout(Duration::from_secs(1), group.shutdown(patience))
        .await
        .expect_err("the first shutdown is dropped while it waits for Stop");
    assert!(!group.is_started());
    assert_eq!(group.len(), 3, "no worker was released yet");
    assert!(matches!(
        group.execute(Request::NodeInfo).await,
        Err(WorkerGroupError::NotActive)
    ));
    assert!(matches!(
        group.start().await,
        Err(WorkerGroupError::AlreadyStarted)
    ));

    tokio::time::timeout(BOUND, group.shutdown(patience))
        .await
        .expect("the second shutdown returns");
    assert!(group.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_actor_that_stopped_during_an_abandoned_shutdown_is_neither_asked_again_nor_killed() {
    let mut mock = mock_that_starts(2);
    mock.expect_call()
        .withf(|actor, r| *actor == ActorId(1) && *r == Request::Stop)
        .times(1)
        .returning(|_, _| Ok(Response::Done));
    mock.expect_kill().with(eq(ActorId(1)), always()).never();
    mock.expect_kill()
        .with(eq(ActorId(2)), eq(Duration::ZERO))
        .times(1)
        .returning(|_, _| Ok(()));
    let runtime = Holding::runtime(mock, |actor, request| {
        if actor == ActorId(2) && *request == Request::Stop {
            Hold::Forever
        } else {
            Hold::Pass
        }
    });
    let mut group = started_on(runtime, 2).await;

    let patience = Duration::from_secs(30);
    tokio::time::timeout(Duration::from_secs(1), group.shutdown(patience))
        .await
        .expect_err("the first shutdown is dropped while it waits for worker 1");
    assert_eq!(
        group.workers().iter().map(|w| w.actor).collect::<Vec<_>>(),
        [ActorId(2)]
    );

    tokio::time::timeout(BOUND, group.shutdown(patience))
        .await
        .expect("the second shutdown returns");
    assert!(group.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_kill_that_never_returns_holds_a_zero_patience_shutdown_for_at_most_the_kill_timeout() {
    let mut mock = mock_that_starts(2);
    mock.expect_kill()
        .with(eq(ActorId(2)), eq(Duration::ZERO))
        .times(1)
        .returning(|_, _| Ok(()));
    let runtime = Holding::ops(mock, |op| match op {
        Op::Kill(ActorId(1)) => Hold::Forever,
        _ => Hold::Pass,
    });
    let mut group = started_on(runtime, 2).await;

    let began = tokio::time::Instant::now();
    tokio::time::timeout(BOUND, group.shutdown(Duration::ZERO))
        .await
        .expect("shutdown returns");
    assert_eq!(began.elapsed(), KILL_TIMEOUT);
    assert!(group.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_kill_that_never_returns_holds_shutdown_for_the_patience_and_then_the_longer_of_patience_and_kill_timeout()
 {
    for patience in [Duration::from_secs(1), Duration::from_secs(30)] {
        let mut mock = mock_that_starts(1);
        mock.expect_kill().never();
        let runtime = Holding::ops(mock, |op| match op {
            Op::Call(_, Request::Stop) | Op::Kill(_) => Hold::Forever,
            _ => Hold::Pass,
        });
        let mut group = started_on(runtime, 1).await;

        let began = tokio::time::Instant::now();
        tokio::time::timeout(BOUND, group.shutdown(patience))
            .await
            .expect("shutdown returns");
        assert_eq!(began.elapsed(), patience + patience.max(KILL_TIMEOUT));
        assert!(group.is_empty());
    }
}

#[tokio::test(start_paused = true)]
async fn a_kill_that_never_returns_holds_remove_workers_for_at_most_the_kill_timeout() {
    let mut mock = mock_that_starts(2);
    mock.expect_kill().never();
    let runtime = Holding::ops(mock, |op| match op {
        Op::Kill(_) => Hold::Forever,
        _ => Hold::Pass,
    });
    let mut group = started_on(runtime, 2).await;

    let began = tokio::time::Instant::now();
    tokio::time::timeout(BOUND, group.remove_workers(&[0]))
        .await
        .expect("remove_workers returns")
        .expect("valid index");
    assert_eq!(began.elapsed(), KILL_TIMEOUT);
    assert_eq!(
        group.workers().iter().map(|w| w.actor).collect::<Vec<_>>(),
        [ActorId(2)]
    );
}

#[tokio::test]
async fn execute_async_sends_nothing_until_its_futures_are_polled() {
    let mut mock = mock_that_starts(2);
    mock.expect_call()
        .withf(|_, r| *r == Request::FindFreePort)
        .times(2)
        .returning(|_, _| Ok(Response::Port { port: 1 }));
    let group = started(mock, 2).await;

    let unpolled = group
        .execute_async(Request::FindFreePort)
        .expect("group is active");
    drop(unpolled);
    drop(
        group
            .execute_single_async(0, Request::FindFreePort)
            .expect("valid index"),
    );

    let pending = group
        .execute_async(Request::FindFreePort)
        .expect("group is active");
    let answers = futures::future::try_join_all(pending)
        .await
        .expect("every worker answers");
    assert_eq!(answers.len(), 2);
}

#[tokio::test]
async fn shutdown_with_zero_patience_kills_every_actor_without_asking_them_to_stop() {
    let mut mock = mock_that_starts(2);
    mock.expect_call().withf(|_, r| *r == Request::Stop).never();
    for id in 1..=2 {
        mock.expect_kill()
            .with(eq(ActorId(id)), eq(Duration::ZERO))
            .times(1)
            .returning(|_, _| Ok(()));
    }
    mock.expect_remove_placement_group().never();
    let mut group = started(mock, 2).await;

    group.shutdown(Duration::ZERO).await;
    assert!(!group.is_started());
}

#[tokio::test]
async fn kill_failures_during_shutdown_are_ignored() {
    let mut mock = mock_that_starts(1);
    mock.expect_kill()
        .times(1)
        .returning(|actor, _| Err(RuntimeError::UnknownActor(actor)));
    let mut group = started(mock, 1).await;

    group.shutdown(Duration::ZERO).await;
    assert!(group.is_empty());
}

#[tokio::test(start_paused = true)]
async fn execute_fails_fast_with_the_index_of_the_failing_worker() {
    let mut mock = mock_that_starts(3);
    mock.expect_call()
        .withf(|actor, r| *actor == ActorId(3) && *r == Request::FindFreePort)
        .returning(|actor, _| Err(died(actor)));
    mock.expect_call()
        .withf(|actor, r| *actor != ActorId(3) && *r == Request::FindFreePort)
        .returning(|_, _| Ok(Response::Port { port: 1 }));
    // Worker 0 is slow; the failure of worker 2 must not wait for it.
    let runtime = Holding::runtime(mock, |actor, request| {
        if actor == ActorId(1) && *request == Request::FindFreePort {
            Hold::Forever
        } else {
            Hold::Pass
        }
    });
    let group = started_on(runtime, 3).await;

    let error = tokio::time::timeout(BOUND, group.execute(Request::FindFreePort))
        .await
        .expect("execute does not wait for the slow worker")
        .expect_err("worker 2 died");
    assert!(
        matches!(error, WorkerGroupError::Worker { worker: 2, .. }),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "worker 2 failed");
    assert!(error.is_actor_death());
}

#[tokio::test(start_paused = true)]
async fn execute_returns_answers_in_worker_order_when_they_arrive_out_of_order() {
    let mut mock = mock_that_starts(3);
    mock.expect_call()
        .withf(|_, r| *r == Request::FindFreePort)
        .returning(|actor, _| {
            Ok(Response::Port {
                port: u16::try_from(actor.0).expect("small"),
            })
        });
    // The first worker answers last, the last first.
    let runtime = Holding::runtime(mock, |actor, request| match request {
        Request::FindFreePort => Hold::Delay(Duration::from_secs(10 - actor.0)),
        _ => Hold::Pass,
    });
    let group = started_on(runtime, 3).await;

    let answers = tokio::time::timeout(BOUND, group.execute(Request::FindFreePort))
        .await
        .expect("execute returns")
        .expect("every worker answers");
    let ports: Vec<Response> = (1..=3).map(|port| Response::Port { port }).collect();
    assert_eq!(answers, ports);

    let pending = group
        .execute_async(Request::FindFreePort)
        .expect("group is active");
    let answers = futures::future::try_join_all(pending)
        .await
        .expect("every worker answers");
    assert_eq!(answers, ports);
}

#[tokio::test]
async fn execute_single_reports_the_worker_index_of_a_failed_call() {
    let mut mock = mock_that_starts(2);
    mock.expect_call()
        .withf(|actor, r| *actor == ActorId(2) && *r == Request::Poll)
        .times(1)
        .returning(|actor, _| Err(died(actor)));
    let group = started(mock, 2).await;

    let error = group
        .execute_single(1, Request::Poll)
        .await
        .expect_err("worker 1 is dead");
    assert!(
        matches!(error, WorkerGroupError::Worker { worker: 1, .. }),
        "{error:?}"
    );

    let error = group
        .execute_single(2, Request::Poll)
        .await
        .expect_err("no worker 2");
    assert!(matches!(
        error,
        WorkerGroupError::InvalidWorkerIndex { index: 2, len: 2 }
    ));
    assert_eq!(
        error.to_string(),
        "worker index 2 is out of range for a group of 2 workers"
    );
    assert!(group.execute_single_async(5, Request::Poll).is_err());
}

#[tokio::test]
async fn nothing_runs_before_start() {
    let mut mock = MockActorRuntime::new();
    mock.expect_call().never();
    mock.expect_spawn().never();
    let runtime: Arc<dyn ActorRuntime> = Arc::new(mock);
    let mut group = WorkerGroup::new(runtime, PG, vec![cpu(); 2]).expect("valid group");

    assert!(group.is_empty());
    assert!(matches!(
        group.execute(Request::NodeInfo).await,
        Err(WorkerGroupError::NotActive)
    ));
    assert!(matches!(
        group.execute_async(Request::NodeInfo),
        Err(WorkerGroupError::NotActive)
    ));
    assert!(matches!(
        group.execute_single(0, Request::NodeInfo).await,
        Err(WorkerGroupError::NotActive)
    ));
    assert!(matches!(
        group.add_workers(vec![cpu()]).await,
        Err(WorkerGroupError::NotActive)
    ));
    assert_eq!(
        WorkerGroupError::NotActive.to_string(),
        "the worker group has no active workers: it was not started or has been shut down"
    );
    group.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn starting_a_started_group_is_an_error_that_spawns_nothing() {
    let mock = mock_that_starts(2);
    let mut group = started(mock, 2).await;

    let error = group.start().await.expect_err("already started");
    assert!(matches!(error, WorkerGroupError::AlreadyStarted));
    assert_eq!(
        error.to_string(),
        "the worker group has already been started; shut it down before starting it again"
    );
    assert_eq!(group.len(), 2);
}

#[tokio::test]
async fn adding_a_worker_to_a_full_group_fails_at_once_without_spawning() {
    let mock = mock_that_starts(2);
    let mut group = started(mock, 2).await;

    let error = group
        .add_workers(vec![cpu()])
        .await
        .expect_err("both bundles are held");
    assert!(
        matches!(
            error,
            WorkerGroupError::NoFreeBundle {
                bundles: 2,
                free: 0,
                requested: 1
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "cannot add workers: 1 asked for, but only 0 of the placement group's 2 bundles are free"
    );
    group
        .add_workers(Vec::new())
        .await
        .expect("adding nothing does nothing");
    assert_eq!(group.len(), 2);
}

#[tokio::test]
async fn added_workers_take_the_lowest_free_bundles() {
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(1);
    let bundles = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let bundles = Arc::clone(&bundles);
        mock.expect_spawn().times(6).returning(move |spec| {
            bundles
                .lock()
                .expect("not poisoned")
                .push(spec.placement.map(|(_, i)| i));
            Ok(ActorId(next.fetch_add(1, Ordering::SeqCst)))
        });
    }
    mock.expect_call()
        .returning(|actor, _| Ok(Response::NodeInfo(info(actor))));
    mock.expect_kill().times(2).returning(|_, _| Ok(()));
    let mut group = started(mock, 4).await;

    group
        .remove_workers(&[2, 0, 2])
        .await
        .expect("valid indexes");
    assert_eq!(
        group
            .workers()
            .iter()
            .map(|w| w.bundle_index)
            .collect::<Vec<_>>(),
        [1, 3]
    );
    group
        .add_workers(vec![cpu(), cpu()])
        .await
        .expect("two bundles are free");

    let order: Vec<usize> = group.workers().iter().map(|w| w.bundle_index).collect();
    assert_eq!(order, [1, 3, 0, 2]);
    let spawned = bundles.lock().expect("not poisoned").clone();
    assert_eq!(
        spawned,
        [Some(0), Some(1), Some(2), Some(3), Some(0), Some(2)]
    );
}

#[tokio::test]
async fn a_failed_add_workers_kills_only_the_actors_it_spawned_and_keeps_the_workers() {
    let mut mock = MockActorRuntime::new();
    let next = AtomicU64::new(1);
    mock.expect_spawn().times(4 + 2).returning(move |spec| {
        let n = next.fetch_add(1, Ordering::SeqCst);
        if n == 6 {
            Err(RuntimeError::SpawnFailed {
                name: spec.name,
                reason: "no such binary".into(),
            })
        } else {
            Ok(ActorId(n))
        }
    });
    mock.expect_call()
        .withf(|_, r| *r == Request::NodeInfo)
        .times(4)
        .returning(|actor, _| Ok(Response::NodeInfo(info(actor))));
    for id in [1, 3, 5] {
        mock.expect_kill()
            .with(eq(ActorId(id)), eq(Duration::ZERO))
            .times(1)
            .returning(|_, _| Ok(()));
    }
    mock.expect_remove_placement_group().never();
    let mut group = started(mock, 4).await;
    group.remove_workers(&[0, 2]).await.expect("valid indexes");

    let error = group
        .add_workers(vec![cpu(), cpu()])
        .await
        .expect_err("the spawn in bundle 2 fails");
    assert!(
        matches!(
            error,
            WorkerGroupError::Start {
                worker: 3,
                bundle_index: 2,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        group.workers().iter().map(|w| w.actor).collect::<Vec<_>>(),
        [ActorId(2), ActorId(4)]
    );
    assert!(group.is_started());
}

#[tokio::test]
async fn removing_an_unknown_index_removes_nothing() {
    let mut mock = mock_that_starts(2);
    mock.expect_kill().never();
    let mut group = started(mock, 2).await;

    let error = group
        .remove_workers(&[0, 2])
        .await
        .expect_err("index 2 is out of range");
    assert!(matches!(
        error,
        WorkerGroupError::InvalidWorkerIndex { index: 2, len: 2 }
    ));
    assert_eq!(group.len(), 2);
}

#[test]
fn zero_workers_is_an_error_naming_the_value() {
    let runtime: Arc<dyn ActorRuntime> = Arc::new(MockActorRuntime::new());
    let error = WorkerGroup::new(runtime, PG, Vec::new()).expect_err("no workers");
    assert!(matches!(error, WorkerGroupError::NoWorkers));
    assert_eq!(
        error.to_string(),
        "a worker group needs at least one worker, got num_workers=0"
    );
}

#[test]
fn negative_resources_are_rejected_by_the_parser_naming_the_key() {
    for text in ["CPU=-1", "GPU=-1", "memory=-1", r#"{"CPU": -1}"#] {
        let error = text
            .parse::<Resources>()
            .expect_err("negative amounts are invalid");
        let message = error.to_string();
        let key = ["CPU", "GPU", "memory"]
            .into_iter()
            .find(|k| text.contains(k))
            .expect("a key");
        assert!(message.contains(key), "`{message}` does not name `{key}`");
    }
}

#[test]
fn resources_that_make_no_actor_options_are_rejected_naming_the_worker() {
    let runtime: Arc<dyn ActorRuntime> = Arc::new(MockActorRuntime::new());
    let half_a_byte = Resources::new().with(
        "memory",
        "0.5".parse::<ResourceAmount>().expect("valid amount"),
    );
    let error = WorkerGroup::new(runtime, PG, vec![cpu(), half_a_byte]).expect_err("bad bytes");

    assert!(
        matches!(
            &error,
            WorkerGroupError::InvalidResources {
                worker: 1,
                source: ResourceError::FractionalBytes { .. }
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "invalid resources for worker 1");
    let source = std::error::Error::source(&error).expect("the resource error is the source");
    assert_eq!(
        source.to_string(),
        "resource `memory` must be a whole number of bytes, got 0.5"
    );
}
