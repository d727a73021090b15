//! The machine-wide ledger under load: many processes reserve and release through it at
//! once, each with the reservation book a local run uses; none may see the machine
//! over-committed or a device given twice, and the file must stay readable throughout.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::Resources;
use trainyard_runtime::reservations::{HeldBundle, NodeSpec, Reservations, Scheduling};
use trainyard_runtime_local::ledger::{Ledger, RunEntry, live_runs};

/// Set in the children: the ledger they share.
const WORKER_ENV: &str = "TRAINYARD_LEDGER_STRESS";
const WORKERS: usize = 12;
const ROUNDS: usize = 15;
const MACHINE: &str = "CPU=4,GPU=4,memory=4096";
const LIMIT: Duration = Duration::from_secs(120);

fn machine() -> NodeSpec {
    let mut node = NodeSpec::new("local-0", MACHINE.parse().expect("resources"));
    node.devices
        .insert("GPU".to_owned(), (0..4).map(|i| i.to_string()).collect());
    node
}

/// Everything in `runs` and `mine` fits the machine, and no GPU is held twice.
fn check(runs: &[RunEntry], mine: &[HeldBundle]) -> Result<(), String> {
    let capacity: Resources = MACHINE.parse().expect("resources");
    let mut total = Resources::new();
    let mut gpus = BTreeSet::new();
    let bundles = runs.iter().flat_map(|r| &r.bundles).chain(mine);
    for bundle in bundles {
        total
            .checked_add_assign(&bundle.resources)
            .map_err(|e| e.to_string())?;
        for id in bundle.devices.get("GPU").into_iter().flatten() {
            if !gpus.insert(id.clone()) {
                return Err(format!("GPU {id} is held twice: {runs:?} {mine:?}"));
            }
        }
    }
    match capacity.first_shortfall(&total) {
        Some(over) => Err(format!("{over} over-committed: {total} held of {capacity}")),
        None => Ok(()),
    }
}

/// One child: reserves a group of 1 or 2 bundles through the ledger, holds it briefly,
/// removes it, again and again.
fn work(path: &Path, me: usize) -> Result<(), String> {
    let ledger = Ledger::open(path, &format!("stress-{me}")).map_err(|e| e.to_string())?;
    let mut book = Reservations::new([machine()]).with_scheduling(Scheduling::OnRequest);
    let bundle: Resources = "CPU=1,GPU=1,memory=1024".parse().expect("resources");
    let factory = PlacementGroupFactory {
        bundles: vec![bundle; 1 + me % 2],
        strategy: PlacementStrategy::Pack,
    };
    let deadline = Instant::now() + LIMIT / 2;
    for _ in 0..ROUNDS {
        let pg = book.create_group(&factory).map_err(|e| e.to_string())?;
        loop {
            let checked = ledger
                .update(|others| {
                    book.set_held_elsewhere(others.iter().flat_map(|r| &r.bundles));
                    book.schedule();
                    let mine = book.held_bundles();
                    (mine.clone(), check(others, &mine))
                })
                .map_err(|e| e.to_string())?;
            checked?;
            if book
                .placement_info(pg)
                .map_err(|e| e.to_string())?
                .is_some()
            {
                break;
            }
            if Instant::now() > deadline {
                return Err("never reserved".to_owned());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(2));
        book.remove_group(pg).map_err(|e| e.to_string())?;
        ledger
            .update(|others| (book.held_bundles(), check(others, &[])))
            .map_err(|e| e.to_string())??;
    }
    Ok(())
}

#[test]
fn stress_worker() {
    let Some(path) = std::env::var_os(WORKER_ENV) else {
        return; // Run as a child of the test below only.
    };
    let me: usize = std::env::var("STRESS_WORKER_INDEX")
        .ok()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0);
    if let Err(problem) = work(Path::new(&path), me) {
        panic!("worker {me}: {problem}");
    }
}

#[test]
fn many_processes_reserving_at_once_never_over_commit_nor_corrupt_the_ledger() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger");
    let exe = std::env::current_exe().expect("test binary");
    let started = Instant::now();
    let mut children: Vec<_> = (0..WORKERS)
        .map(|i| {
            Command::new(&exe)
                .args(["--exact", "stress_worker", "--nocapture"])
                .env(WORKER_ENV, &path)
                .env("STRESS_WORKER_INDEX", i.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("worker starts")
        })
        .collect();
    let mut failures = Vec::new();
    for child in &mut children {
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                if !status.success() {
                    failures.push(status);
                }
                break;
            }
            if started.elapsed() > LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                failures.push(child.wait().expect("status"));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let messages: Vec<String> = children
        .into_iter()
        .filter_map(|c| c.wait_with_output().ok())
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .filter(|e| e.contains("panicked"))
        .collect();
    assert!(
        failures.is_empty(),
        "workers failed: {failures:?} {messages:?}"
    );
    let left = live_runs(&path).expect("the ledger is readable");
    assert!(
        left.is_empty(),
        "every worker released what it held: {left:?}"
    );
    eprintln!(
        "{WORKERS} processes x {ROUNDS} rounds through the ledger in {:?}",
        started.elapsed()
    );
}

#[test]
fn a_dead_owners_entry_is_reclaimed_by_the_next_reader() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger");
    // A child records a reservation and is killed without releasing it.
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(&exe)
        .args(["--exact", "hold_and_hang", "--nocapture"])
        .env("TRAINYARD_LEDGER_HANG", &path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("child starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while live_runs(&path).expect("readable").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the child never recorded its hold"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let runs = live_runs(&path).expect("readable");
    assert_eq!(runs[0].owner.pid, child.id());
    child.kill().expect("kill");
    child.wait().expect("reaped");
    assert!(live_runs(&path).expect("readable").is_empty(), "reclaimed");
    let text = std::fs::read_to_string(&path).expect("file");
    assert!(
        !text.contains("hang"),
        "the dead entry is gone from the file: {text}"
    );
}

#[test]
fn hold_and_hang() {
    let Some(path) = std::env::var_os("TRAINYARD_LEDGER_HANG") else {
        return; // Run as a child of the test above only.
    };
    let ledger = Ledger::open(Path::new(&path), "hang").expect("ledger");
    let held = HeldBundle {
        resources: "CPU=1".parse().expect("resources"),
        devices: Default::default(),
    };
    ledger.update(|_| (vec![held], ())).expect("recorded");
    std::thread::sleep(Duration::from_secs(60));
}

// ---- local runtimes sharing one machine through a private ledger ----

mod runtimes {
    use crate::common::agent;
    use std::path::Path;
    use std::time::Duration;

    use tokio::time::timeout;
    use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
    use trainyard_resources::ResourceAmount;
    use trainyard_runtime::{ActorRuntime, RuntimeError, conformance};
    use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
    use trainyard_runtime_local::ledger::{LedgerLocation, live_runs};
    use trainyard_runtime_local::{LocalConfig, LocalRuntime, WhenBusy};

    const LIMIT: Duration = Duration::from_secs(120);

    /// A run on a machine of 4 CPUs, 8 GiB and 2 (fake) GPUs, split into `nodes`.
    fn config(ledger: &Path, run: &str, nodes: u32) -> LocalConfig {
        let overrides = Overrides {
            num_cpus: Some(ResourceAmount::from(4u32)),
            memory: Some(8 << 30),
            num_gpus: Some(2),
            ..Overrides::default()
        };
        let nodes = plan_nodes(&Machine::detect(), &overrides, nodes).expect("nodes");
        LocalConfig::new(nodes, run)
            .expect("config")
            .with_agent(agent())
            .stop_grace(Duration::from_secs(2))
            .ledger(LedgerLocation::At(ledger.to_owned()))
    }

    fn one_gpu() -> PlacementGroupFactory {
        PlacementGroupFactory {
            bundles: vec!["CPU=1,GPU=1".parse().expect("bundle")],
            strategy: PlacementStrategy::Pack,
        }
    }

    async fn gpu_ids(runtime: &LocalRuntime) -> Vec<String> {
        let cluster = runtime.cluster().await.expect("cluster");
        let node = &cluster.nodes[0];
        let free = node.available.amount("GPU");
        node.accelerator_ids["GPU"]
            .iter()
            .take(usize::try_from(free.as_whole_u64().unwrap_or(0)).unwrap_or(0))
            .cloned()
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_runs_get_different_gpus_and_a_third_waits_for_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = dir.path().join("ledger");
        let test = async {
            let a = LocalRuntime::start(config(&ledger, "run-a", 1))
                .await
                .expect("a");
            let b = LocalRuntime::start(config(&ledger, "run-b", 1))
                .await
                .expect("b");
            let c = LocalRuntime::start(config(&ledger, "run-c", 1))
                .await
                .expect("c");
            let pa = a
                .create_placement_group(&one_gpu())
                .await
                .expect("a's group");
            a.wait_placement_group_ready(pa, LIMIT)
                .await
                .expect("a fits");
            let pb = b
                .create_placement_group(&one_gpu())
                .await
                .expect("b's group");
            b.wait_placement_group_ready(pb, LIMIT)
                .await
                .expect("b fits");
            assert!(gpu_ids(&c).await.is_empty(), "c sees both GPUs taken");

            let runs = trainyard_runtime_local::ledger::live_runs(&ledger).expect("ledger");
            let mut devices: Vec<String> = runs
                .iter()
                .flat_map(|r| &r.bundles)
                .flat_map(|b| b.devices["GPU"].clone())
                .collect();
            devices.sort();
            assert_eq!(devices, ["0", "1"], "each run holds its own GPU: {runs:?}");

            let pc = c
                .create_placement_group(&one_gpu())
                .await
                .expect("c's group");
            let mut shortages = c.placer().shortages();
            let waiting = tokio::spawn({
                let c = c.clone();
                async move { c.wait_placement_group_ready(pc, LIMIT).await }
            });
            let shown = timeout(LIMIT, shortages.wait_for(Option::is_some))
                .await
                .expect("c says what it waits for")
                .expect("the channel is open")
                .clone()
                .expect("a shortage");
            assert_eq!(shown.missing.amount("GPU"), ResourceAmount::ONE);
            let holders: Vec<&str> = shown.holders.iter().map(|h| h.run.as_str()).collect();
            assert_eq!(holders, ["run-a", "run-b"], "{shown}");
            assert!(!waiting.is_finished(), "c waits while both GPUs are held");

            a.remove_placement_group(pa).await.expect("a lets go");
            let placed = timeout(LIMIT, waiting)
                .await
                .expect("c is placed soon after")
                .expect("the task ran");
            placed.expect("c is ready");
            a.shutdown().await;
            b.shutdown().await;
            c.shutdown().await;
            let left = trainyard_runtime_local::ledger::live_runs(&ledger).expect("ledger");
            assert!(left.is_empty(), "shut-down runs hold nothing: {left:?}");
        };
        timeout(LIMIT * 2, test).await.expect("the test finishes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_told_not_to_wait_fails_at_once_naming_the_holder() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = dir.path().join("ledger");
        let test = async {
            let holder = LocalRuntime::start(config(&ledger, "holder", 1))
                .await
                .expect("holder");
            let two = PlacementGroupFactory {
                bundles: vec!["CPU=1,GPU=1".parse().expect("bundle"); 2],
                strategy: PlacementStrategy::Pack,
            };
            let pg = holder.create_placement_group(&two).await.expect("group");
            holder
                .wait_placement_group_ready(pg, LIMIT)
                .await
                .expect("fits");
            let eager = config(&ledger, "eager", 1).when_busy(WhenBusy::Fail);
            let eager = LocalRuntime::start(eager).await.expect("eager");
            let pg = eager
                .create_placement_group(&one_gpu())
                .await
                .expect("feasible");
            let started = std::time::Instant::now();
            let error = eager
                .wait_placement_group_ready(pg, LIMIT)
                .await
                .expect_err("busy");
            assert!(started.elapsed() < Duration::from_secs(10), "at once");
            let RuntimeError::Busy(shortage) = &error else {
                panic!("expected Busy, got {error:?}");
            };
            assert_eq!(shortage.holders.len(), 1);
            assert_eq!(shortage.holders[0].run, "holder");
            assert_eq!(shortage.holders[0].pid, std::process::id());
            assert!(error.to_string().contains("run `holder`"), "{error}");
            let never = PlacementGroupFactory {
                bundles: vec!["GPU=3".parse().expect("bundle")],
                strategy: PlacementStrategy::Pack,
            };
            let infeasible = eager.create_placement_group(&never).await;
            assert!(
                matches!(infeasible, Err(RuntimeError::Infeasible(_))),
                "a group that can never fit still fails at once: {infeasible:?}"
            );
            holder.shutdown().await;
            eager.shutdown().await;
        };
        timeout(LIMIT, test).await.expect("the test finishes");
    }

    /// Dropping a runtime gives its ledger entry back without waiting for the ledger's lock
    /// on the thread that drops it: a task on the same (single) thread goes on at once, and
    /// the entry goes once the lock is free.
    #[tokio::test(flavor = "current_thread")]
    async fn dropping_a_runtime_while_the_ledger_is_locked_holds_up_no_task() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = dir.path().join("ledger");
        let test = async {
            let run = LocalRuntime::start(config(&ledger, "dropped", 1))
                .await
                .expect("start");
            let pg = run.create_placement_group(&one_gpu()).await.expect("group");
            run.wait_placement_group_ready(pg, LIMIT)
                .await
                .expect("fits");
            let runs = |path: &Path| -> Vec<String> {
                live_runs(path)
                    .expect("ledger")
                    .into_iter()
                    .map(|entry| entry.run)
                    .collect()
            };
            assert_eq!(runs(&ledger), ["dropped"]);
            let mut lock_path = ledger.clone().into_os_string();
            lock_path.push(".lock");
            let lock_file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&lock_path)
                .expect("the ledger's lock file");
            let mut lock = fd_lock::RwLock::new(lock_file);
            let guard = lock.try_write().expect("the ledger's lock is free");
            let dropped = std::time::Instant::now();
            drop(run);
            assert!(
                dropped.elapsed() < Duration::from_secs(1),
                "dropping waited {:?} for the ledger's lock",
                dropped.elapsed()
            );
            // The single thread is free: a timer fires on time.
            let slept = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(slept.elapsed() < Duration::from_secs(1));
            drop(guard);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !runs(&ledger).is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the dropped run's entry is still in the ledger"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        timeout(LIMIT, test).await.expect("the test finishes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn virtual_nodes_split_what_the_run_sees_of_the_shared_machine() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = dir.path().join("ledger");
        let test = async {
            let one = LocalRuntime::start(config(&ledger, "one", 1))
                .await
                .expect("one");
            let pg = one.create_placement_group(&one_gpu()).await.expect("group");
            one.wait_placement_group_ready(pg, LIMIT)
                .await
                .expect("fits");
            // GPU 0 is taken: of two virtual nodes, the one with GPU 0 has no GPU free.
            let two = LocalRuntime::start(config(&ledger, "two", 2))
                .await
                .expect("two");
            let cluster = two.cluster().await.expect("cluster");
            let free: Vec<ResourceAmount> = cluster
                .nodes
                .iter()
                .map(|n| n.available.amount("GPU"))
                .collect();
            assert_eq!(free, [ResourceAmount::ZERO, ResourceAmount::ONE]);
            assert_eq!(
                cluster.available().amount("CPU"),
                ResourceAmount::from(3u32),
                "the other run's CPU is taken from the machine"
            );
            let spread = PlacementGroupFactory {
                bundles: vec!["GPU=1".parse().expect("bundle"); 2],
                strategy: PlacementStrategy::StrictSpread,
            };
            let pg2 = two.create_placement_group(&spread).await.expect("feasible");
            let waited = two
                .wait_placement_group_ready(pg2, Duration::from_millis(300))
                .await;
            assert!(
                matches!(waited, Err(RuntimeError::PlacementTimeout { .. })),
                "{waited:?}"
            );
            one.shutdown().await;
            two.shutdown().await;
        };
        timeout(LIMIT, test).await.expect("the test finishes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_conformance_suite_passes_through_a_ledger() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = dir.path().join("ledger");
        let runtime = LocalRuntime::start(config(&ledger, "conformance", 2))
            .await
            .expect("start");
        timeout(LIMIT * 2, conformance::run_all(&runtime))
            .await
            .expect("the suite finishes");
        runtime.shutdown().await;
    }
}
