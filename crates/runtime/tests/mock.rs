//! Interaction tests with `MockActorRuntime`: what a caller asks of a runtime, in which
//! order and how often.

use std::collections::BTreeMap;
use std::time::Duration;

use mockall::Sequence;
use mockall::predicate::eq;
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::ActorOptions;
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, MockActorRuntime, PlacementGroupId,
    PlacementInfo, Request, Response, RuntimeError, WorkerInfo,
};

/// A small caller: reserve a group, start one actor per bundle; on a failed spawn, kill the
/// actors already started and remove the group, then report the failure.
async fn start_all(
    runtime: &dyn ActorRuntime,
    factory: &PlacementGroupFactory,
) -> Result<Vec<ActorId>, RuntimeError> {
    let pg = runtime.create_placement_group(factory).await?;
    runtime
        .wait_placement_group_ready(pg, Duration::from_secs(10))
        .await?;
    let mut started = Vec::new();
    for (index, bundle) in factory.bundles.iter().enumerate() {
        let spec = ActorSpec {
            name: format!("worker-{index}"),
            options: ActorOptions::try_from(bundle).unwrap_or_default(),
            placement: Some((pg, index)),
            env: BTreeMap::new(),
        };
        match runtime.spawn(spec).await {
            Ok(actor) => started.push(actor),
            Err(error) => {
                for actor in started {
                    runtime.kill(actor, Duration::ZERO).await?;
                }
                runtime.remove_placement_group(pg).await?;
                return Err(error);
            }
        }
    }
    Ok(started)
}

fn three_bundles() -> PlacementGroupFactory {
    PlacementGroupFactory {
        bundles: vec!["CPU=1".parse().expect("valid"); 3],
        strategy: PlacementStrategy::Pack,
    }
}

#[tokio::test]
async fn after_a_failed_spawn_the_survivors_are_killed_and_the_group_is_removed_once() {
    let mut mock = MockActorRuntime::new();
    let mut order = Sequence::new();
    let pg = PlacementGroupId(4);
    mock.expect_create_placement_group()
        .times(1)
        .in_sequence(&mut order)
        .returning(move |_| Ok(pg));
    mock.expect_wait_placement_group_ready()
        .with(eq(pg), eq(Duration::from_secs(10)))
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _| {
            Ok(PlacementInfo {
                bundle_nodes: vec!["n".into(); 3],
            })
        });
    mock.expect_spawn()
        .withf(|spec| spec.placement.is_some_and(|(_, i)| i < 2))
        .times(2)
        .in_sequence(&mut order)
        .returning(|spec| Ok(ActorId(spec.placement.map_or(0, |(_, i)| i as u64))));
    mock.expect_spawn()
        .withf(|spec| spec.placement.is_some_and(|(_, i)| i == 2))
        .times(1)
        .in_sequence(&mut order)
        .returning(|spec| {
            Err(RuntimeError::SpawnFailed {
                name: spec.name,
                reason: "no room".into(),
            })
        });
    mock.expect_kill()
        .with(eq(ActorId(0)), eq(Duration::ZERO))
        .times(1)
        .returning(|_, _| Ok(()));
    mock.expect_kill()
        .with(eq(ActorId(1)), eq(Duration::ZERO))
        .times(1)
        .returning(|_, _| Ok(()));
    mock.expect_remove_placement_group()
        .with(eq(pg))
        .times(1)
        .returning(|_| Ok(()));

    let err = start_all(&mock, &three_bundles()).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::SpawnFailed { name, .. } if name == "worker-2"),
        "{err}"
    );
}

#[tokio::test]
async fn an_infeasible_group_is_reported_without_spawning_anything() {
    let mut mock = MockActorRuntime::new();
    mock.expect_create_placement_group()
        .times(1)
        .returning(|f| {
            let nodes: Vec<trainyard_resources::Resources> = vec!["CPU=0".parse().expect("valid")];
            Err(trainyard_runtime::placement::check_feasible(&nodes, f)
                .unwrap_err()
                .into())
        });
    mock.expect_spawn().never();
    mock.expect_remove_placement_group().never();
    let err = start_all(&mock, &three_bundles()).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Infeasible(_)), "{err}");
}

#[tokio::test]
async fn the_typed_helpers_send_the_matching_request() {
    let mut mock = MockActorRuntime::new();
    let info = WorkerInfo {
        node_id: "n".into(),
        node_ip: "10.0.0.1".into(),
        hostname: "h".into(),
        pid: 1,
        accelerator_ids: BTreeMap::new(),
    };
    let answer = info.clone();
    mock.expect_call()
        .with(eq(ActorId(3)), eq(Request::NodeInfo))
        .times(1)
        .returning(move |_, _| Ok(Response::NodeInfo(answer.clone())));
    mock.expect_call()
        .with(eq(ActorId(3)), eq(Request::FindFreePort))
        .times(1)
        .returning(|_, _| Ok(Response::Done));
    assert_eq!(mock.node_info(ActorId(3)).await.expect("info"), info);
    let err = mock.find_free_port(ActorId(3)).await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::UnexpectedResponse {
                request: "find_free_port",
                ..
            }
        ),
        "{err}"
    );
}
