//! The Slurm runtime on a real Slurm cluster of four fake nodes on this machine
//! (`scripts/slurm-env.sh`): the conformance suite inside an allocation, and an allocation of
//! the runtime's own that is shaped, queued, used and released. Without the cluster (no root,
//! no packages) the tests print `SKIP:` and why; under `CI=true` they fail unless
//! `TRAINYARD_SLURM_SKIP` says why.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::time::timeout;
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_hub::AgentCommand;
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime::events::ActorEvent;
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt as _, ActorSpec, RuntimeError, TaskEvent, TaskExit,
    TaskFailure, TaskSpec, conformance,
};
use trainyard_runtime_slurm::testing::{HeldAllocation, cluster, jobs_named, wait_for_no_jobs};
use trainyard_runtime_slurm::{SlurmConfig, SlurmRuntime};

/// The bound of every scenario.
const LIMIT: Duration = Duration::from_secs(240);

/// The stand-alone agent of `examples/slurm_agent.rs`, built beside the test binary.
fn agent() -> AgentCommand {
    AgentCommand::new(
        trainyard_test_support::processes::example("slurm_agent"),
        Vec::<String>::new(),
    )
}

/// A run name of this test's own: its Slurm jobs and steps are found by it.
fn run_name(test: &str) -> String {
    format!("tyslurm-{test}-{}", std::process::id())
}

async fn start(run: &str, job: Option<String>) -> SlurmRuntime {
    let config = SlurmConfig::new(run)
        .expect("config")
        .agent(agent())
        .job(job);
    SlurmRuntime::start(config)
        .await
        .expect("the Slurm runtime starts")
}

fn resources(spec: &str) -> Resources {
    spec.parse().expect("a resource spec")
}

/// Runs `script` with `sh -c` on `actor` and returns its lines and its end.
async fn run_script(
    runtime: &SlurmRuntime,
    actor: ActorId,
    script: &str,
) -> (Vec<String>, TaskExit) {
    let mut events = runtime
        .task_events(actor)
        .await
        .expect("events")
        .expect("a stream");
    let task = TaskSpec::Command {
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: Default::default(),
    };
    runtime.run_task(actor, task).await.expect("task starts");
    let mut lines = Vec::new();
    loop {
        match timeout(Duration::from_secs(60), events.next()).await {
            Ok(Some(ActorEvent::Task {
                event: TaskEvent::Log { line, .. },
                ..
            })) => lines.push(line),
            Ok(Some(ActorEvent::Task { event: _, .. })) => {}
            Ok(Some(ActorEvent::TaskExited { exit, .. })) => return (lines, exit),
            other => panic!("unexpected {other:?} running `{script}`"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_inside_an_allocation_of_four_nodes() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let run = run_name("conform");
    let held = HeldAllocation::new(
        &run,
        &[
            "--nodes=4",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            "--mem=1000M",
        ],
    );
    let runtime = start(&run, Some(held.job.clone())).await;
    let snapshot = runtime.cluster().await.expect("the allocation's nodes");
    assert_eq!(snapshot.nodes.len(), 4, "{snapshot:?}");
    for node in &snapshot.nodes {
        assert_eq!(node.total, resources("CPU=1,memory=1000MiB"), "{node:?}");
    }
    timeout(LIMIT, async {
        conformance::run_all(&runtime).await;
        conformance::run_commands(&runtime).await;
    })
    .await
    .expect("the suite ends in time");
    runtime.shutdown().await;
    assert_eq!(
        jobs_named(&run),
        std::slice::from_ref(&held.job),
        "a given allocation is left as it is"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_of_its_own_is_shaped_by_the_strategy_used_and_released() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let run = run_name("own");
    let runtime = start(&run, None).await;
    timeout(LIMIT, async {
        let factory = PlacementGroupFactory {
            bundles: vec![resources("CPU=1,memory=200MiB"); 2],
            strategy: PlacementStrategy::Spread,
        };
        let pg = runtime.create_placement_group(&factory).await.expect("group");
        let placed = runtime
            .wait_placement_group_ready(pg, Duration::from_secs(60))
            .await
            .expect("granted and placed");
        let distinct: BTreeSet<_> = placed.bundle_nodes.iter().collect();
        assert_eq!(distinct.len(), 2, "SPREAD over two nodes: {placed:?}");
        let job = runtime.placer().job().expect("an allocation");
        assert_eq!(jobs_named(&run), std::slice::from_ref(&job));
        for (index, node) in placed.bundle_nodes.iter().enumerate() {
            let spec = ActorSpec {
                name: format!("spread-{index}"),
                options: ActorOptions::try_from(&factory.bundles[index]).expect("options"),
                placement: Some((pg, index)),
                env: Default::default(),
            };
            let actor = runtime.spawn(spec).await.expect("spawn");
            let info = runtime.node_info(actor).await.expect("node info");
            assert_eq!(&info.node_id, node, "worker {index} runs where bundle {index} is");
            // Slurm's own view from inside the step: its node, its job, and the step's
            // memory limit, set by `--mem` (cgroup v1 here).
            let (lines, exit) = run_script(
                &runtime,
                actor,
                "echo $SLURMD_NODENAME $SLURM_JOB_ID; \
                 cat /sys/fs/cgroup/memory/slurm_$SLURMD_NODENAME/uid_$(id -u)/job_$SLURM_JOB_ID/step_$SLURM_STEP_ID/memory.limit_in_bytes 2>/dev/null || echo no-cgroup",
            )
            .await;
            assert_eq!(exit, TaskExit::from_code(0), "{lines:?}");
            assert_eq!(lines[0], format!("{node} {job}"));
            assert!(
                lines[1] == "209715200" || lines[1] == "no-cgroup",
                "the step holds the worker to its 200MiB: {lines:?}"
            );
        }
        runtime.remove_placement_group(pg).await.expect("removed");
        // A restart's group fits the allocation that is there: no new request.
        let again = runtime.create_placement_group(&factory).await.expect("group");
        runtime
            .wait_placement_group_ready(again, Duration::from_secs(30))
            .await
            .expect("placed again");
        assert_eq!(runtime.placer().job(), Some(job.clone()));
        runtime.remove_placement_group(again).await.expect("removed");
        // One it does not fit replaces it; actors pinned to the new group's bundles land
        // where they belong (the runtime's group ids are not the new book's).
        let wider = PlacementGroupFactory {
            bundles: vec![resources("CPU=1,memory=100MiB"); 3],
            strategy: PlacementStrategy::StrictSpread,
        };
        let third = runtime.create_placement_group(&wider).await.expect("group");
        let placed = runtime
            .wait_placement_group_ready(third, Duration::from_secs(60))
            .await
            .expect("a new allocation");
        let new_job = runtime.placer().job().expect("an allocation");
        assert_ne!(new_job, job, "the old allocation is replaced");
        assert_eq!(jobs_named(&run), std::slice::from_ref(&new_job), "and released");
        let spec = ActorSpec {
            name: "third-2".into(),
            options: ActorOptions::try_from(&wider.bundles[2]).expect("options"),
            placement: Some((third, 2)),
            env: Default::default(),
        };
        let actor = runtime.spawn(spec).await.expect("spawn into bundle 2");
        let info = runtime.node_info(actor).await.expect("node info");
        assert_eq!(info.node_id, placed.bundle_nodes[2]);
    })
    .await
    .expect("the scenario ends in time");
    runtime.shutdown().await;
    let left = wait_for_no_jobs(&run, Duration::from_secs(10));
    assert!(left.is_empty(), "released: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_no_node_can_hold_fails_at_once_naming_the_largest_node() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let run = run_name("huge");
    let runtime = start(&run, None).await;
    let factory = PlacementGroupFactory {
        bundles: vec![resources("memory=100GB")],
        strategy: PlacementStrategy::Pack,
    };
    let started = Instant::now();
    let error = runtime
        .create_placement_group(&factory)
        .await
        .expect_err("100 GB fits no node");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let RuntimeError::Infeasible(error) = error else {
        panic!("{error}")
    };
    assert!(
        error
            .to_string()
            .starts_with("bundle 0 needs memory=100GB but the most memory any node has is"),
        "{error}"
    );
    runtime.shutdown().await;
    assert!(wait_for_no_jobs(&run, Duration::from_secs(10)).is_empty());
}

/// An actor named `name` holding `resources`, in no placement group.
fn unpinned(name: &str, held: &str) -> ActorSpec {
    ActorSpec {
        name: name.into(),
        options: ActorOptions::try_from(&resources(held)).expect("options"),
        placement: None,
        env: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_past_its_memory_is_killed_by_slurm_as_its_limit() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let run = run_name("oom");
    let held = HeldAllocation::new(&run, &["--nodes=1", "--cpus-per-task=1", "--mem=500M"]);
    let runtime = start(&run, Some(held.job.clone())).await;
    timeout(LIMIT, async {
        let actor = runtime
            .spawn(unpinned("hog", "CPU=1,memory=100MiB"))
            .await
            .expect("spawn");
        let (lines, exit) = run_script(
            &runtime,
            actor,
            "head -c 400000000 /dev/zero | tail >/dev/null; echo survived",
        )
        .await;
        assert_eq!(
            exit,
            TaskExit::Failed {
                failure: TaskFailure::MemoryLimit { limit: 100 << 20 }
            },
            "{lines:?}"
        );
    })
    .await
    .expect("the scenario ends in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurms_warning_signal_reaches_the_task_and_a_queued_allocation_says_why() {
    let Some(_cluster) = cluster() else {
        return;
    };
    let run = run_name("usr1");
    let held = HeldAllocation::new(&run, &["--nodes=1", "--cpus-per-task=1", "--mem=300M"]);
    let runtime = start(&run, Some(held.job.clone())).await;
    timeout(LIMIT, async {
        let actor = runtime
            .spawn(unpinned("warned", "CPU=1"))
            .await
            .expect("spawn");
        let job = held.job.clone();
        let signal = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let status = tokio::process::Command::new("scancel")
                .args(["--signal=USR1", &job])
                .status()
                .await
                .expect("scancel");
            assert!(status.success());
        });
        let (lines, exit) = run_script(
            &runtime,
            actor,
            "trap 'echo saving; exit 0' USR1; echo ready; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo never warned",
        )
        .await;
        signal.await.expect("signalled");
        // The whole task's process group gets it (the shell's `sleep` too, which it kills).
        assert_eq!(lines.first().map(String::as_str), Some("ready"), "{lines:?}");
        assert!(lines.iter().any(|line| line == "saving"), "{lines:?}");
        assert!(!lines.iter().any(|line| line == "never warned"), "{lines:?}");
        assert_eq!(exit, TaskExit::from_code(0));
    })
    .await
    .expect("the scenario ends in time");
    runtime.shutdown().await;
    drop(held);

    // Every node's CPUs taken: the next allocation waits in the queue, and says so.
    let run = run_name("queued");
    let hog = HeldAllocation::new(
        &format!("{run}-hog"),
        &[
            "--nodes=4",
            "--ntasks-per-node=1",
            "--cpus-per-task=2",
            "--mem=100M",
        ],
    );
    let runtime = start(&run, None).await;
    let factory = PlacementGroupFactory {
        bundles: vec![resources("CPU=1")],
        strategy: PlacementStrategy::Pack,
    };
    let mut queued = runtime.placer().queued();
    let pg = runtime
        .create_placement_group(&factory)
        .await
        .expect("group");
    let watcher = tokio::spawn(async move {
        loop {
            if let Some(now) = queued.borrow_and_update().clone() {
                if now.reason.is_some() {
                    return now;
                }
            }
            if queued.changed().await.is_err() {
                panic!("the queue's state ended before a reason came");
            }
        }
    });
    let error = runtime
        .wait_placement_group_ready(pg, Duration::from_secs(4))
        .await
        .expect_err("nothing is free");
    assert!(
        matches!(error, RuntimeError::PlacementTimeout { .. }),
        "{error}"
    );
    let seen = timeout(Duration::from_secs(1), watcher)
        .await
        .expect("a reason was shown")
        .expect("watcher");
    assert!(seen.job.is_some(), "{seen:?}");
    assert_eq!(seen.reason.as_deref(), Some("Resources"), "{seen}");
    runtime.shutdown().await;
    drop(hog);
    let left = wait_for_no_jobs(&run, Duration::from_secs(10));
    assert!(left.is_empty(), "the queued request is cancelled: {left:?}");
}
