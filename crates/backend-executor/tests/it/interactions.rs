//! Interactions of the backend executor with its runtime, checked with a mock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trainyard_backend_executor::{AttemptFailure, BackendExecutor, ExecutorError, ExecutorOptions};
use trainyard_config::ScalingConfig;
use trainyard_runtime::{
    ActorId, MockActorRuntime, NodeId, PlacementGroupId, PlacementInfo, Response, RuntimeError,
    TaskSpec, WorkerInfo,
};

fn info(actor: ActorId) -> WorkerInfo {
    WorkerInfo {
        node_id: NodeId::from("node-0"),
        node_ip: "10.0.0.1".to_owned(),
        interface: None,
        hostname: "node-0".to_owned(),
        pid: u32::try_from(actor.0).unwrap_or(0) + 100,
        task_pid: None,
        accelerator_ids: BTreeMap::new(),
    }
}

#[tokio::test]
async fn a_spawn_failure_mid_start_kills_the_survivors_and_removes_the_group_once() {
    let mut runtime = MockActorRuntime::new();
    runtime
        .expect_create_placement_group()
        .times(1)
        .returning(|_| Ok(PlacementGroupId(7)));
    runtime
        .expect_wait_placement_group_ready()
        .times(1)
        .returning(|_, _| {
            Ok(PlacementInfo {
                bundle_nodes: vec![NodeId::from("node-0"); 4],
            })
        });
    let attempts = Arc::new(AtomicU64::new(0));
    let spawned: Arc<Mutex<Vec<ActorId>>> = Arc::default();
    let killed: Arc<Mutex<Vec<ActorId>>> = Arc::default();
    let (counter, record) = (Arc::clone(&attempts), Arc::clone(&spawned));
    runtime.expect_spawn().returning(move |spec| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        if n == 2 {
            Err(RuntimeError::SpawnFailed {
                name: spec.name,
                reason: "no such program".into(),
            })
        } else {
            record.lock().expect("lock").push(ActorId(n));
            Ok(ActorId(n))
        }
    });
    runtime
        .expect_call()
        .returning(|actor, _| Ok(Response::NodeInfo(info(actor))));
    let record = Arc::clone(&killed);
    runtime.expect_kill().returning(move |actor, _| {
        record.lock().expect("lock").push(actor);
        Ok(())
    });
    runtime
        .expect_remove_placement_group()
        .times(1)
        .returning(|pg| {
            assert_eq!(pg, PlacementGroupId(7));
            Ok(())
        });

    let executor = BackendExecutor {
        scaling: ScalingConfig::default().num_workers(4),
        options: ExecutorOptions {
            shutdown_patience: Duration::ZERO,
            ..ExecutorOptions::default()
        },
        ..BackendExecutor::new(Arc::new(runtime))
    };
    let task = TaskSpec::function("noop", serde_json::Value::Null);
    match executor.fit(&task).await {
        Err(ExecutorError::TrainingFailed { report }) => {
            assert_eq!(report.attempts, 1);
            match report.failures.as_slice() {
                [AttemptFailure::StartFailed { reason }] => {
                    assert!(reason.contains("no such program"), "{reason}")
                }
                other => panic!("expected a start failure, got {other:?}"),
            }
        }
        other => panic!("expected the run to fail, got {other:?}"),
    }
    let mut spawned = spawned.lock().expect("lock").clone();
    let mut killed = killed.lock().expect("lock").clone();
    spawned.sort();
    killed.sort();
    assert!(!spawned.is_empty());
    assert_eq!(
        killed, spawned,
        "every started actor is killed exactly once"
    );
}
