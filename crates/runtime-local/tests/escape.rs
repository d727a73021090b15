//! Nothing a task starts outlives it: a process that leaves the task's process group
//! (`setsid`), or its parent (a double fork), or both (a daemon), is gone when the task's end
//! is reported, when its actor has died, however it died, and when the run has ended; and a
//! GPU is handed to another run through the ledger only once such a process is gone, and
//! once the run's workers are gone when its driver was killed.
//!
//! Each detached process is a `sleep` with an argument of its own (`sleep 1000.<n>`), found
//! by its argv in `/proc`.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::agent;
use futures::StreamExt as _;
use tokio::time::{Instant, sleep, timeout};
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ActorOptions, ResourceAmount};
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, PlacementGroupId, TaskEvent, TaskExit,
    TaskSpec,
};
use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
use trainyard_runtime_local::ledger::LedgerLocation;
use trainyard_runtime_local::{LocalConfig, LocalRuntime};
use trainyard_sys::cgroup::MemoryEnforcement;

/// The bound of every test.
const TEST_LIMIT: Duration = Duration::from_secs(120);
/// The bound of one wait for an event.
const EVENT_WAIT: Duration = Duration::from_secs(30);

/// How a task's process detaches a `sleep` from itself.
#[derive(Debug, Clone, Copy)]
enum Detach {
    /// `setsid sleep &`: a session and process group of its own, its parent the task's.
    Setsid,
    /// `(sleep &)`: its parent gone, in the task's process group still.
    DoubleFork,
    /// `(setsid sleep &)`: its parent gone, and in a session of its own.
    Daemon,
}

const ALL: [Detach; 3] = [Detach::Setsid, Detach::DoubleFork, Detach::Daemon];

/// A `sleep` argument no other process has: `1000.<this test process's pid><n>`.
fn marker() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "1000.{}{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A shell line that detaches `sleep <marker>` as `how` says, waits until it is that
/// `sleep` (executed, detached), and prints its pid; then runs `then`.
fn detaching(how: Detach, marker: &str, then: &str) -> TaskSpec {
    let started = format!(
        "p=$!; while [ \"$(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null)\" != 'sleep {marker} ' ]; \
         do sleep 0.01; done; echo $p"
    );
    let line = match how {
        Detach::Setsid => format!("setsid sleep {marker} & {started}; {then}"),
        Detach::DoubleFork => format!("(sleep {marker} & {started}); {then}"),
        Detach::Daemon => format!("(setsid sleep {marker} & {started}); {then}"),
    };
    TaskSpec::Command {
        program: "sh".to_owned(),
        args: vec!["-c".to_owned(), line],
        env: std::collections::BTreeMap::new(),
    }
}

/// The live processes whose argv is `sleep <marker>` (a zombie runs no more).
fn sleepers(marker: &str) -> Vec<u32> {
    let wanted = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|argv| argv == wanted.as_bytes())
                && trainyard_sys::procfs::is_alive(*pid, None)
        })
        .collect()
}

/// Kills what a failed test left, so that it does not outlive the test.
struct Reaper(Vec<String>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for marker in &self.0 {
            for pid in sleepers(marker) {
                if let Some(handle) = trainyard_sys::procfs::ProcessHandle::open(pid) {
                    handle.signal(nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
    }
}

/// One node of 2 CPUs, 4 GiB and `gpus` fake GPUs; memory limits enforced when `enforce`.
fn config(run: &str, gpus: u32, enforce: bool, ledger: LedgerLocation) -> LocalConfig {
    let overrides = Overrides {
        num_cpus: Some(ResourceAmount::from(2u32)),
        memory: Some(4 << 30),
        num_gpus: Some(gpus),
        ..Overrides::default()
    };
    let nodes = plan_nodes(&Machine::detect(), &overrides, 1).expect("a node");
    LocalConfig::new(nodes, run)
        .expect("config")
        .with_agent(agent())
        .stop_grace(Duration::from_secs(2))
        .enforce_memory(enforce)
        .ledger(ledger)
}

/// An actor of 1 CPU and 256 MiB (its limit, where limits are enforced), or, in a group,
/// of the group's CPU and GPU; and its events.
async fn actor(
    runtime: &LocalRuntime,
    placement: Option<(PlacementGroupId, usize)>,
) -> (ActorId, TaskEvents) {
    let options = match placement {
        None => ActorOptions {
            num_cpus: ResourceAmount::ONE,
            memory: 256 << 20,
            ..ActorOptions::default()
        },
        Some(_) => ActorOptions {
            num_cpus: ResourceAmount::ONE,
            num_gpus: ResourceAmount::ONE,
            ..ActorOptions::default()
        },
    };
    let spec = ActorSpec {
        name: "detacher".to_owned(),
        options,
        placement,
        env: std::collections::BTreeMap::new(),
    };
    let actor = runtime.spawn(spec).await.expect("spawn");
    let events = runtime
        .task_events(actor)
        .await
        .expect("events")
        .expect("pushed");
    (actor, events)
}

/// The pid the task printed (its detached `sleep`), once it has printed it.
async fn printed_pid(events: &mut TaskEvents) -> u32 {
    loop {
        let event = timeout(EVENT_WAIT, events.next())
            .await
            .expect("an event in time")
            .expect("the stream is open");
        match event {
            ActorEvent::Task {
                event: TaskEvent::Log { line, .. },
                ..
            } => {
                if let Ok(pid) = line.trim().parse() {
                    return pid;
                }
            }
            ActorEvent::Task { event: _, .. } => {}
            other => panic!("the task ended before it printed a pid: {other:?}"),
        }
    }
}

/// The task's exit, once it is reported.
async fn exited(events: &mut TaskEvents) -> TaskExit {
    loop {
        let event = timeout(EVENT_WAIT, events.next())
            .await
            .expect("an event in time")
            .expect("the stream is open");
        match event {
            ActorEvent::TaskExited { exit, .. } => return exit,
            ActorEvent::Task { event: _, .. } => {}
            ActorEvent::Died(cause) => panic!("the actor died: {cause}"),
        }
    }
}

/// Until the actor's death is reported.
async fn died(events: &mut TaskEvents) {
    loop {
        let event = timeout(EVENT_WAIT, events.next())
            .await
            .expect("an event in time");
        if matches!(event, None | Some(ActorEvent::Died(_))) {
            return;
        }
    }
}

/// Runs each way of detaching in turn on one actor: each detached `sleep` runs while the
/// task does, and is gone by the time the task's end is reported.
async fn detached_processes_end_with_their_task(run: &str, enforce: bool) {
    let runtime = LocalRuntime::start(config(run, 0, enforce, LedgerLocation::Off))
        .await
        .expect("the runtime starts");
    let mut reaper = Reaper(Vec::new());
    let test = async {
        let (actor, mut events) = actor(&runtime, None).await;
        for how in ALL {
            let marker = marker();
            reaper.0.push(marker.clone());
            runtime
                .run_task(actor, detaching(how, &marker, "exit 0"))
                .await
                .expect("the task starts");
            let pid = printed_pid(&mut events).await;
            assert_eq!(exited(&mut events).await, TaskExit::from_code(0), "{how:?}");
            assert!(
                sleepers(&marker).is_empty(),
                "{how:?}: the detached sleep (pid {pid}) outlived its task's end"
            );
            let agent = runtime.agent_pids()[0];
            let zombies: Vec<u32> = trainyard_sys::procfs::pids()
                .filter(|&child| {
                    trainyard_sys::procfs::read_stat(child)
                        .ok()
                        .flatten()
                        .is_some_and(|stat| stat.parent == agent && stat.state == 'Z')
                })
                .collect();
            assert!(
                zombies.is_empty(),
                "{how:?}: the agent did not reap {zombies:?}"
            );
        }
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_task_detaches_is_gone_when_its_end_is_reported() {
    detached_processes_end_with_their_task("detach", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_task_detaches_is_gone_when_its_end_is_reported_under_a_memory_limit() {
    detached_processes_end_with_their_task("detach-limited", true).await;
}

/// Whether this machine lets the driver make cgroups (else a test says `SKIP:`).
fn cgroups_or_skip(what: &str) -> bool {
    match MemoryEnforcement::probe() {
        MemoryEnforcement::Rlimit { why } => {
            eprintln!("SKIP: {what}: no cgroup can be made here ({why})");
            false
        }
        _ => true,
    }
}

/// Starts a task that detaches a `sleep` and goes on running; returns the sleep's marker.
async fn detach_and_run(
    runtime: &LocalRuntime,
    actor: ActorId,
    events: &mut TaskEvents,
    how: Detach,
) -> String {
    let marker = marker();
    runtime
        .run_task(actor, detaching(how, &marker, "exec sleep 1000"))
        .await
        .expect("the task starts");
    printed_pid(events).await;
    assert_eq!(sleepers(&marker).len(), 1, "the detached sleep runs");
    marker
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_running_task_detached_is_gone_once_the_run_has_shut_down() {
    for enforce in [false, true] {
        let runtime = LocalRuntime::start(config("detach-stop", 0, enforce, LedgerLocation::Off))
            .await
            .expect("the runtime starts");
        let mut reaper = Reaper(Vec::new());
        let test = async {
            let (actor, mut events) = actor(&runtime, None).await;
            let marker = detach_and_run(&runtime, actor, &mut events, Detach::Daemon).await;
            reaper.0.push(marker.clone());
            runtime.shutdown().await;
            assert!(
                sleepers(&marker).is_empty(),
                "the detached sleep outlived the run (memory enforced: {enforce})"
            );
        };
        timeout(TEST_LIMIT, test).await.expect("in time");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_task_detached_is_gone_when_its_agent_is_killed_and_the_death_reported() {
    if !cgroups_or_skip("an agent killed by SIGKILL leaves detached processes to the cgroup") {
        return;
    }
    let runtime = LocalRuntime::start(config("detach-kill", 0, false, LedgerLocation::Off))
        .await
        .expect("the runtime starts");
    let mut reaper = Reaper(Vec::new());
    let test = async {
        let (actor, mut events) = actor(&runtime, None).await;
        let marker = detach_and_run(&runtime, actor, &mut events, Detach::Setsid).await;
        reaper.0.push(marker.clone());
        let agent = runtime.agent_pids()[0];
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(agent).expect("a pid")),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("the agent is killed");
        died(&mut events).await;
        assert!(
            sleepers(&marker).is_empty(),
            "the detached sleep outlived its killed agent's reported death"
        );
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// A group of the one GPU.
fn one_gpu() -> PlacementGroupFactory {
    PlacementGroupFactory {
        bundles: vec!["CPU=1,GPU=1".parse().expect("bundle")],
        strategy: PlacementStrategy::Pack,
    }
}

/// Run `a` holds the machine's one GPU with a task that detached a `sleep`; run `b` waits
/// for the GPU; `a` lets go as `end` does; when `b` gets the GPU, the sleep is gone.
async fn the_gpu_is_handed_on_only_after_what_held_it_is_gone(
    name: &str,
    ledger: &Path,
    end: impl AsyncFnOnce(&LocalRuntime, PlacementGroupId),
) {
    let at = || LedgerLocation::At(ledger.to_owned());
    // Names of their own: tests in one process must not share a run's cgroups.
    let a = LocalRuntime::start(config(&format!("{name}-a"), 1, false, at()))
        .await
        .expect("a starts");
    let b = LocalRuntime::start(config(&format!("{name}-b"), 1, false, at()))
        .await
        .expect("b starts");
    let mut reaper = Reaper(Vec::new());
    let test = async {
        let pa = a
            .create_placement_group(&one_gpu())
            .await
            .expect("a's group");
        a.wait_placement_group_ready(pa, TEST_LIMIT)
            .await
            .expect("a holds the GPU");
        let (actor, mut events) = actor(&a, Some((pa, 0))).await;
        let marker = detach_and_run(&a, actor, &mut events, Detach::Daemon).await;
        reaper.0.push(marker.clone());

        let pb = b
            .create_placement_group(&one_gpu())
            .await
            .expect("b's group");
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.wait_placement_group_ready(pb, TEST_LIMIT).await }
        });
        // b waits while a holds the GPU (a bounded look, not a condition of the test).
        sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "b waits while a holds the GPU");
        end(&a, pa).await;
        let deadline = Instant::now() + TEST_LIMIT;
        while !waiting.is_finished() {
            assert!(Instant::now() < deadline, "b never got the GPU");
            sleep(Duration::from_millis(5)).await;
        }
        let alive_then = sleepers(&marker);
        waiting
            .await
            .expect("the wait ran")
            .expect("b gets the GPU");
        assert!(
            alive_then.is_empty(),
            "the GPU went to b while a's detached process {alive_then:?} lived"
        );
    };
    timeout(TEST_LIMIT * 2, test).await.expect("in time");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_is_not_handed_to_another_run_while_a_detached_process_of_a_shut_down_run_lives() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    the_gpu_is_handed_on_only_after_what_held_it_is_gone(
        "shut-down",
        &dir.path().join("ledger"),
        async |a, _| a.shutdown().await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_is_not_handed_to_another_run_while_a_detached_process_of_a_killed_agent_lives() {
    if !cgroups_or_skip("an agent killed by SIGKILL leaves detached processes to the cgroup") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    the_gpu_is_handed_on_only_after_what_held_it_is_gone(
        "killed-agent",
        &dir.path().join("ledger"),
        async |a, pa| {
            let agent = a.agent_pids()[0];
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(agent).expect("a pid")),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("the agent is killed");
            a.remove_placement_group(pa)
                .await
                .expect("a lets the GPU go");
        },
    )
    .await;
}

/// The variable that makes [`killed_driver_entry`] a driver: the ledger it uses.
const DRIVER_LEDGER: &str = "TRAINYARD_TEST_DRIVER_LEDGER";
/// The variable that gives [`killed_driver_entry`] the marker of its task's `sleep`.
const DRIVER_MARKER: &str = "TRAINYARD_TEST_DRIVER_MARKER";
/// What [`killed_driver_entry`] prints before its agent's pid.
const DRIVER_AGENT: &str = "driver's agent: ";

/// A task that ignores SIGTERM (so does the `sleep <marker>` it becomes) and prints its pid.
fn stubborn(marker: &str) -> TaskSpec {
    TaskSpec::Command {
        program: "sh".to_owned(),
        args: vec![
            "-c".to_owned(),
            format!("trap '' TERM; echo $$; exec sleep {marker}"),
        ],
        env: std::collections::BTreeMap::new(),
    }
}

/// Serves as the driver of run `gpu-a` when started with [`DRIVER_LEDGER`] set (does nothing
/// otherwise): it holds the one GPU, runs [`stubborn`] on a worker in it, prints
/// [`DRIVER_AGENT`] and the worker's agent's pid, and waits to be killed.
#[test]
fn killed_driver_entry() {
    let (Some(ledger), Some(marker)) = (
        std::env::var_os(DRIVER_LEDGER),
        std::env::var(DRIVER_MARKER).ok(),
    ) else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    tokio.block_on(async {
        let ledger = LedgerLocation::At(ledger.into());
        let a = LocalRuntime::start(config("gpu-a", 1, false, ledger))
            .await
            .expect("a starts");
        let pa = a
            .create_placement_group(&one_gpu())
            .await
            .expect("a's group");
        a.wait_placement_group_ready(pa, TEST_LIMIT)
            .await
            .expect("a holds the GPU");
        let (actor, mut events) = actor(&a, Some((pa, 0))).await;
        a.run_task(actor, stubborn(&marker))
            .await
            .expect("the task starts");
        printed_pid(&mut events).await;
        println!("{DRIVER_AGENT}{}", a.agent_pids()[0]);
        sleep(TEST_LIMIT).await;
    });
    std::process::exit(1);
}

/// The pid after [`DRIVER_AGENT`] in what `driver` prints.
async fn driver_agent(driver: &mut tokio::process::Child) -> u32 {
    use tokio::io::AsyncBufReadExt as _;
    let stdout = driver.stdout.take().expect("the driver's stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    loop {
        let line = timeout(EVENT_WAIT, lines.next_line())
            .await
            .expect("the driver says its agent in time")
            .expect("the driver's stdout reads")
            .expect("the driver says its agent before it exits");
        if let Some(pid) = line.strip_prefix(DRIVER_AGENT) {
            return pid.trim().parse().expect("a pid");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_is_not_handed_to_another_run_while_a_worker_of_its_sigkilled_driver_lives() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ledger = dir.path().join("ledger");
    let marker = marker();
    let _reaper = Reaper(vec![marker.clone()]);
    let mut driver = tokio::process::Command::new(std::env::current_exe().expect("this binary"))
        .args([
            "--exact",
            "killed_driver_entry",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(DRIVER_LEDGER, &ledger)
        .env(DRIVER_MARKER, &marker)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the driver starts");
    let b = LocalRuntime::start(config(
        "killed-driver-b",
        1,
        false,
        LedgerLocation::At(ledger),
    ))
    .await
    .expect("b starts");
    let test = async {
        let agent = driver_agent(&mut driver).await;
        let agent_started = trainyard_sys::procfs::read_stat(agent)
            .expect("the agent's stat")
            .and_then(|stat| stat.start_time)
            .expect("the agent's start time");
        // The task prints its pid just before it becomes the `sleep`.
        let deadline = Instant::now() + EVENT_WAIT;
        while sleepers(&marker).is_empty() {
            assert!(Instant::now() < deadline, "the worker's task never ran");
            sleep(Duration::from_millis(5)).await;
        }

        let pb = b
            .create_placement_group(&one_gpu())
            .await
            .expect("b's group");
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.wait_placement_group_ready(pb, TEST_LIMIT).await }
        });
        // b waits while a holds the GPU (a bounded look, not a condition of the test).
        sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "b waits while a holds the GPU");
        driver.start_kill().expect("the driver is killed");
        driver.wait().await.expect("the driver is reaped");
        let deadline = Instant::now() + TEST_LIMIT;
        while !waiting.is_finished() {
            assert!(Instant::now() < deadline, "b never got the GPU");
            sleep(Duration::from_millis(5)).await;
        }
        let task_then = sleepers(&marker);
        let agent_then = trainyard_sys::procfs::is_alive(agent, Some(agent_started));
        waiting
            .await
            .expect("the wait ran")
            .expect("b gets the GPU");
        assert!(
            task_then.is_empty() && !agent_then,
            "the GPU went to b while the worker of a's killed driver lived (agent {agent} alive: \
             {agent_then}, its task: {task_then:?})"
        );
    };
    timeout(TEST_LIMIT * 2, test).await.expect("in time");
    b.shutdown().await;
}
