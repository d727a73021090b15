//! The local runtime with real agent processes: the agents are this test binary, started
//! again to run only [`agent_entry`], which serves as an agent when the runtime asks it to.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use common::agent;
use futures::{FutureExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ActorOptions, ResourceAmount};
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, DeathCause, FunctionRegistry, RuntimeError,
    Stream, TaskEvent, TaskExit, TaskFailure, TaskSpec, TaskStatus, conformance,
};
use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
use trainyard_runtime_local::ledger::LedgerLocation;
use trainyard_runtime_local::{AgentCommand, LocalConfig, LocalRuntime};
use trainyard_sys::cgroup::MemoryEnforcement;
use trainyard_wire::token::Nonce;
use trainyard_wire::wire::{self, AgentMessage};

/// The bound of every test.
const TEST_LIMIT: Duration = Duration::from_secs(240);
/// How long a process may take to disappear after it was killed.
const GONE_WITHIN: Duration = Duration::from_secs(10);

/// Serves as an agent when started by a runtime of these tests; does nothing otherwise.
#[test]
fn agent_entry() {
    if let Some(code) = trainyard_agent::run_if_agent(functions()) {
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
}

/// The code [`forgetful_driver_entry`] exits with when starting a runtime was refused.
const REFUSED: i32 = 17;

/// An agent entry that forgets `run_if_agent`: a program that does nothing of the kind.
#[test]
fn forgetful_entry() {}

/// An agent entry that forgets `run_if_agent` and goes on as a driver: started as an agent,
/// it exits with [`REFUSED`] when starting a runtime of its own is refused.
#[test]
fn forgetful_driver_entry() {
    if std::env::var_os(trainyard_wire::config::ROLE).is_none() {
        return;
    }
    let Ok(tokio) = tokio::runtime::Runtime::new() else {
        std::process::exit(1);
    };
    let started = tokio.block_on(LocalRuntime::start(two_nodes("forgetful-inner")));
    std::process::exit(match started {
        Err(trainyard_runtime_local::LocalError::Hub(trainyard_hub::HubError::NotServing)) => {
            REFUSED
        }
        _ => 1,
    });
}

/// This test binary as the agent, running only `entry`.
fn entry_agent(entry: &str) -> AgentCommand {
    let exe = std::env::current_exe().expect("the test binary's path");
    AgentCommand::new(
        exe,
        ["--exact", entry, "--nocapture", "--test-threads=1", "-q"],
    )
}

/// The functions the agents of these tests serve besides the built-ins.
fn functions() -> FunctionRegistry {
    FunctionRegistry::new()
        .register(FLOOD, |ctx| async move {
            // `count` reports, each padded with `pad` bytes, as fast as they go.
            let count = ctx.arg()["count"].as_u64().unwrap_or(0);
            let pad =
                "x".repeat(usize::try_from(ctx.arg()["pad"].as_u64().unwrap_or(0)).unwrap_or(0));
            for step in 0..count {
                let mut metrics = serde_json::Map::new();
                metrics.insert("step".into(), step.into());
                metrics.insert("pad".into(), pad.clone().into());
                ctx.report(metrics);
            }
            Ok(count.into())
        })
        .register(SPIN, |ctx| async move {
            // Reports once, then keeps every thread of its runtime busy for `arg` seconds,
            // never yielding.
            let seconds = ctx.arg().as_f64().unwrap_or(0.0);
            let until = std::time::Instant::now() + Duration::from_secs_f64(seconds);
            ctx.report(serde_json::Map::new());
            tokio::task::yield_now().await;
            let threads = std::thread::available_parallelism().map_or(2, usize::from) + 2;
            let spinners: Vec<_> = (0..threads)
                .map(|_| tokio::spawn(async move { spin_until(until) }))
                .collect();
            for spinner in spinners {
                let _ = spinner.await;
            }
            Ok(serde_json::Value::Null)
        })
        .register(ALLOCATE, |ctx| async move {
            // Holds `arg` bytes, every page written.
            let bytes = ctx.arg().as_u64().unwrap_or(0);
            let mut held: Vec<Vec<u8>> = Vec::new();
            let mut total = 0u64;
            while total < bytes {
                held.push(vec![1u8; 1 << 20]);
                total += 1 << 20;
            }
            Ok(std::hint::black_box(held).len().into())
        })
}

/// A function that allocates as many bytes as its argument says.
const ALLOCATE: &str = "test.allocate";
/// A function that sends `count` reports padded with `pad` bytes each, at once.
const FLOOD: &str = "test.flood";
/// A function that keeps its threads busy for `arg` seconds.
const SPIN: &str = "test.spin";

/// Busy until `until`, never yielding.
fn spin_until(until: std::time::Instant) {
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// This test binary as the agent, serving [`functions`].
fn functions_agent() -> AgentCommand {
    entry_agent("agent_entry")
}

/// This machine as two nodes of 2 CPUs and 4 GiB each (and whatever GPUs it has).
fn two_nodes(run: &str) -> LocalConfig {
    let overrides = Overrides {
        num_cpus: Some(ResourceAmount::from(4u32)),
        memory: Some(8 << 30),
        ..Overrides::default()
    };
    let nodes = plan_nodes(&Machine::detect(), &overrides, 2).expect("two nodes");
    // Sharing the machine with other runs is tested in `ledger.rs`.
    LocalConfig::new(nodes, run)
        .expect("config")
        .with_agent(agent())
        .stop_grace(Duration::from_secs(2))
        .ledger(LedgerLocation::Off)
}

async fn start(run: &str) -> LocalRuntime {
    LocalRuntime::start(two_nodes(run))
        .await
        .expect("the runtime starts")
}

fn spec(name: &str) -> ActorSpec {
    ActorSpec {
        name: name.to_owned(),
        options: ActorOptions::default(),
        placement: None,
        env: BTreeMap::new(),
    }
}

fn one_cpu() -> ActorOptions {
    ActorOptions {
        num_cpus: ResourceAmount::ONE,
        ..ActorOptions::default()
    }
}

fn memory(bytes: u64) -> ActorOptions {
    ActorOptions {
        memory: bytes,
        ..ActorOptions::default()
    }
}

fn command(program: &str, args: &[&str]) -> TaskSpec {
    TaskSpec::Command {
        program: program.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: BTreeMap::new(),
    }
}

/// Whether process `pid` still runs (a zombie waiting for a parent that is not us runs no
/// more).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().next())
                .unwrap_or("");
            state != "Z" && state != "X"
        }
    }
}

/// Waits until the task `pid` is `sleep` (its `sh` has executed it).
async fn sleeping(pid: u32) {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "sleep" && running(pid) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the task (pid {pid}) is not `sleep` after {GONE_WITHIN:?}: {comm:?}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

async fn assert_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + GONE_WITHIN;
    while running(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) still runs {GONE_WITHIN:?} after it should have ended"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// The next event, within 30 s.
async fn next_event(events: &mut TaskEvents) -> Option<ActorEvent> {
    timeout(Duration::from_secs(30), events.next())
        .await
        .expect("an event within 30 s")
}

/// A 1-CPU actor and its event stream.
async fn one_cpu_actor(runtime: &LocalRuntime, name: &str) -> (ActorId, TaskEvents) {
    let spec = ActorSpec {
        options: one_cpu(),
        ..spec(name)
    };
    let actor = runtime.spawn(spec).await.expect("spawn");
    let events = runtime
        .task_events(actor)
        .await
        .expect("events")
        .expect("pushed");
    (actor, events)
}

async fn died(events: &mut TaskEvents) -> DeathCause {
    loop {
        match next_event(events).await {
            Some(ActorEvent::Died(cause)) => return cause,
            Some(_) => {}
            None => panic!("the event stream ended without a death"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_conformance_suite_passes_on_two_virtual_nodes() {
    let runtime = start("conformance").await;
    timeout(TEST_LIMIT, conformance::run_all(&runtime))
        .await
        .expect("the suite finishes");
    timeout(TEST_LIMIT, conformance::run_commands(&runtime))
        .await
        .expect("the command checks finish");
    runtime.shutdown().await;
    assert!(runtime.agent_pids().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_task_streams_its_output_and_ends_with_its_exit_code() {
    let runtime = start("output").await;
    let test = async {
        let actor = runtime.spawn(spec("output")).await.expect("spawn");
        let mut events = runtime
            .task_events(actor)
            .await
            .expect("events")
            .expect("pushed");
        assert!(
            matches!(
                runtime.task_events(actor).await,
                Err(RuntimeError::Unsupported { .. })
            ),
            "the events are taken once"
        );
        let task = command("sh", &["-c", "echo hello; echo oops >&2; exit 3"]);
        let pid = runtime.run_task(actor, task).await.expect("run");
        assert!(pid.is_some(), "a command runs in a process of its own");
        let mut lines = Vec::new();
        let exit = loop {
            match next_event(&mut events).await.expect("open") {
                ActorEvent::Task {
                    event: TaskEvent::Log { stream, line },
                    ..
                } => lines.push((stream, line)),
                ActorEvent::Task { event: _, .. } => {}
                ActorEvent::TaskExited { exit, .. } => break exit,
                ActorEvent::Died(cause) => panic!("the actor died: {cause}"),
            }
        };
        assert!(
            lines.contains(&(Stream::Stdout, "hello".to_owned())),
            "{lines:?}"
        );
        assert!(
            lines.contains(&(Stream::Stderr, "oops".to_owned())),
            "{lines:?}"
        );
        assert_eq!(
            exit,
            TaskExit::Failed {
                failure: TaskFailure::ExitCode { code: 3 }
            }
        );
        let refused = runtime
            .run_task(actor, command("/no/such/program", &[]))
            .await
            .expect_err("refused");
        assert!(
            matches!(refused, RuntimeError::TaskRejected { actor: a, .. } if a == actor),
            "{refused}"
        );
        runtime.kill(actor, Duration::ZERO).await.expect("kill");
        assert_eq!(
            next_event(&mut events).await,
            Some(ActorEvent::Died(DeathCause::Killed)),
            "a killed actor's stream ends with its death"
        );
        assert!(next_event(&mut events).await.is_none());
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_an_actor_whose_task_sleeps_leaves_no_process() {
    let runtime = start("kill").await;
    let test = async {
        let before = runtime.cluster().await.expect("cluster");
        let options = one_cpu();
        let actor = runtime
            .spawn(ActorSpec {
                options,
                ..spec("sleeper")
            })
            .await
            .expect("spawn");
        let agent = runtime.node_info(actor).await.expect("node info").pid;
        assert_eq!(runtime.agent_pids(), [agent]);
        let task = runtime
            .run_task(actor, command("sleep", &["300"]))
            .await
            .expect("run")
            .expect("a pid");
        sleeping(task).await;

        runtime.kill(actor, Duration::ZERO).await.expect("kill");
        assert_gone(agent, "the agent").await;
        assert_gone(task, "the task").await;
        assert!(runtime.agent_pids().is_empty());
        let after = runtime.cluster().await.expect("cluster");
        assert_eq!(
            after.available(),
            before.available(),
            "the CPU is given back"
        );
        let call = runtime.node_info(actor).await.expect_err("dead");
        assert!(
            matches!(
                call,
                RuntimeError::ActorDied {
                    cause: DeathCause::Killed,
                    ..
                }
            ),
            "{call}"
        );
        runtime
            .kill(actor, Duration::ZERO)
            .await
            .expect("killing a dead actor succeeds");
        assert!(matches!(
            runtime.kill(ActorId(999_999), Duration::ZERO).await,
            Err(RuntimeError::UnknownActor(_))
        ));
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_period_lets_the_agent_stop_its_task_itself() {
    let runtime = start("grace").await;
    let test = async {
        let actor = runtime.spawn(spec("graceful")).await.expect("spawn");
        let agent = runtime.agent_pids()[0];
        let task = runtime
            .run_task(actor, command("sleep", &["300"]))
            .await
            .expect("run")
            .expect("a pid");
        sleeping(task).await;
        let started = Instant::now();
        runtime
            .kill(actor, Duration::from_secs(5))
            .await
            .expect("kill");
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "the agent ends its task on SIGTERM without using up the grace period"
        );
        assert_gone(agent, "the agent").await;
        assert_gone(task, "the task").await;
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_from_outside_dies_with_its_signal_and_frees_its_resources() {
    let runtime = start("outside").await;
    let test = async {
        let before = runtime.cluster().await.expect("cluster");
        let (actor, mut events) = one_cpu_actor(&runtime, "victim").await;
        let agent = runtime.agent_pids()[0];
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(agent).expect("pid")),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("signal");
        let cause = died(&mut events).await;
        assert_eq!(
            cause,
            DeathCause::ProcessExited {
                code: None,
                signal: Some(9)
            }
        );
        let call = runtime.poll(actor).await.expect_err("dead");
        assert!(
            matches!(&call, RuntimeError::ActorDied { cause: c, .. } if *c == cause),
            "{call}"
        );
        assert!(runtime.agent_pids().is_empty());
        assert_eq!(
            runtime.cluster().await.expect("cluster").available(),
            before.available()
        );
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_actor_answers_done_and_is_gone() {
    let runtime = start("stop").await;
    let test = async {
        let actor = runtime.spawn(spec("stopper")).await.expect("spawn");
        let agent = runtime.agent_pids()[0];
        let task = runtime
            .run_task(actor, command("sleep", &["300"]))
            .await
            .expect("run")
            .expect("a pid");
        sleeping(task).await;
        runtime.stop(actor).await.expect("stop answers done");
        assert_gone(agent, "the agent").await;
        assert_gone(task, "the task").await;
        let call = runtime.node_info(actor).await.expect_err("dead");
        assert!(
            matches!(
                call,
                RuntimeError::ActorDied {
                    cause: DeathCause::Stopped,
                    ..
                }
            ),
            "{call}"
        );
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_group_ends_its_actors_with_that_cause() {
    let runtime = start("remove").await;
    let test = async {
        let factory = PlacementGroupFactory {
            bundles: vec!["CPU=1".parse().expect("bundle"); 2],
            strategy: PlacementStrategy::StrictSpread,
        };
        let pg = runtime
            .create_placement_group(&factory)
            .await
            .expect("group");
        let placed = runtime
            .wait_placement_group_ready(pg, Duration::from_secs(10))
            .await
            .expect("ready");
        let mut actors = Vec::new();
        for index in 0..2 {
            let actor = runtime
                .spawn(ActorSpec {
                    options: ActorOptions::try_from(&factory.bundles[index]).expect("options"),
                    placement: Some((pg, index)),
                    ..spec("member")
                })
                .await
                .expect("spawn");
            let info = runtime.node_info(actor).await.expect("node info");
            assert_eq!(info.node_id, placed.bundle_nodes[index]);
            actors.push(actor);
        }
        let mut events = runtime
            .task_events(actors[0])
            .await
            .expect("events")
            .expect("pushed");
        runtime.remove_placement_group(pg).await.expect("remove");
        assert_eq!(died(&mut events).await, DeathCause::PlacementGroupRemoved);
        for actor in actors {
            let call = runtime.node_info(actor).await.expect_err("dead");
            assert!(
                matches!(
                    call,
                    RuntimeError::ActorDied {
                        cause: DeathCause::PlacementGroupRemoved,
                        ..
                    }
                ),
                "{call}"
            );
        }
        assert!(runtime.agent_pids().is_empty());
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// A frame as the codec writes it: a 4-byte big-endian length, then the bytes.
fn frame(bytes: &[u8]) -> Vec<u8> {
    let mut framed = u32::try_from(bytes.len())
        .expect("small")
        .to_be_bytes()
        .to_vec();
    framed.extend_from_slice(bytes);
    framed
}

/// Whether the driver closes `stream` within `limit` (reads see the end).
async fn closed_by_driver(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buffer = [0u8; 64];
    matches!(
        timeout(limit, stream.read(&mut buffer)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rogue_connections_are_dropped_and_real_agents_still_connect() {
    let runtime = start("rogue").await;
    let driver = runtime.driver_address();
    let test = async {
        let stranger = wire::encode(&AgentMessage::Hello {
            protocol: wire::PROTOCOL,
            actor: ActorId(0),
            pid: 1,
            nonce: Nonce::random().expect("randomness"),
        })
        .expect("encode");
        let rogues: Vec<(&str, Vec<u8>)> = vec![
            ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
            ("an oversized frame", (1u32 << 30).to_be_bytes().to_vec()),
            (
                "a frame that is no message",
                frame(b"{\"message\":\"nonsense\"}"),
            ),
            ("a hello for an actor nobody waits for", frame(&stranger)),
        ];
        // One peer connects and says nothing: it must hold up nobody.
        let _silent = TcpStream::connect(driver).await.expect("connect");
        for (what, bytes) in rogues {
            let mut stream = TcpStream::connect(driver).await.expect("connect");
            let _ = stream.write_all(&bytes).await;
            assert!(
                closed_by_driver(&mut stream, Duration::from_secs(5)).await,
                "the driver keeps a connection that sent {what}"
            );
        }
        let actor = runtime
            .spawn(spec("real"))
            .await
            .expect("a real spawn works");
        runtime
            .node_info(actor)
            .await
            .expect("the real agent answers");
        runtime.kill(actor, Duration::ZERO).await.expect("kill");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_without_run_if_agent_fails_the_spawn_at_once_saying_what_to_add() {
    for (entry, code) in [("forgetful_entry", 0), ("forgetful_driver_entry", REFUSED)] {
        let config = two_nodes("forgetful").with_agent(entry_agent(entry));
        let runtime = LocalRuntime::start(config).await.expect("start");
        let started = Instant::now();
        let spawned = timeout(TEST_LIMIT, runtime.spawn(spec("forgetful")))
            .await
            .expect("in time");
        let took = started.elapsed();
        let error = spawned.expect_err("the worker never connects");
        let program = std::env::current_exe().expect("the test binary's path");
        let expected = format!(
            "the worker program `{}` exited with code {code} before it connected: call \
             `trainyard::run_if_agent(functions)` first thing in `main` so that it can serve \
             as a worker",
            program.display()
        );
        assert!(
            matches!(&error, RuntimeError::SpawnFailed { reason, .. } if *reason == expected),
            "{entry}: {error:?}"
        );
        assert!(took < Duration::from_secs(10), "{entry}: {took:?}");
        assert!(runtime.agent_pids().is_empty());
        runtime.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_start_fails_the_spawn_and_frees_its_resources() {
    let config = two_nodes("broken").connect_timeout(Duration::from_secs(5));
    let broken = LocalConfig {
        agent: AgentCommand::new("/bin/sh", ["-c", "exit 7"]),
        ..config.clone()
    };
    let runtime = LocalRuntime::start(broken).await.expect("start");
    let before = runtime.cluster().await.expect("cluster");
    let options = one_cpu();
    let spawned = timeout(
        TEST_LIMIT,
        runtime.spawn(ActorSpec {
            options,
            ..spec("broken")
        }),
    )
    .await
    .expect("in time");
    let error = spawned.expect_err("the agent exits at once");
    let said = |text: &str| error.to_string().contains(text);
    assert!(
        matches!(&error, RuntimeError::SpawnFailed { name, .. } if name == "broken")
            && said("exited with code 7 before it connected"),
        "{error}"
    );
    assert!(runtime.agent_pids().is_empty());
    assert_eq!(
        runtime.cluster().await.expect("cluster").available(),
        before.available()
    );

    let missing = LocalConfig {
        agent: AgentCommand::new("/no/such/agent", Vec::<String>::new()),
        ..config
    };
    let runtime = LocalRuntime::start(missing).await.expect("start");
    let error = runtime
        .spawn(spec("missing"))
        .await
        .expect_err("no program");
    assert!(
        matches!(&error, RuntimeError::SpawnFailed { .. })
            && error.to_string().contains("/no/such/agent"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_agent_and_refuses_later_spawns() {
    let runtime = start("shutdown").await;
    let test = async {
        let mut tasks = Vec::new();
        for i in 0..3 {
            let actor = runtime
                .spawn(spec(&format!("worker-{i}")))
                .await
                .expect("spawn");
            if i == 0 {
                let task = runtime
                    .run_task(actor, command("sleep", &["300"]))
                    .await
                    .expect("run")
                    .expect("a pid");
                sleeping(task).await;
                tasks.push(task);
            }
        }
        let agents = runtime.agent_pids();
        assert_eq!(agents.len(), 3);
        runtime.shutdown().await;
        assert!(runtime.agent_pids().is_empty());
        for pid in agents {
            assert_gone(pid, "an agent").await;
        }
        for pid in tasks {
            assert_gone(pid, "a task").await;
        }
        runtime.shutdown().await;
        let refused = runtime.spawn(spec("late")).await.expect_err("refused");
        assert!(
            matches!(refused, RuntimeError::SpawnFailed { .. }),
            "{refused}"
        );
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_kills_the_agents() {
    let runtime = start("drop").await;
    let actor = timeout(TEST_LIMIT, runtime.spawn(spec("orphan")))
        .await
        .expect("in time")
        .expect("spawn");
    let agent = runtime.node_info(actor).await.expect("node info").pid;
    drop(runtime);
    timeout(
        TEST_LIMIT,
        assert_gone(agent, "the agent of a dropped runtime"),
    )
    .await
    .expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforced_memory_limits_reach_the_worker_and_are_cleaned_up() {
    let config = two_nodes("memory").enforce_memory(true);
    let runtime = LocalRuntime::start(config).await.expect("start");
    let test = async {
        let options = memory(256 << 20);
        let actor = runtime
            .spawn(ActorSpec {
                options,
                ..spec("limited")
            })
            .await
            .expect("a limited worker starts");
        let mut events = runtime
            .task_events(actor)
            .await
            .expect("events")
            .expect("pushed");
        runtime
            .run_task(actor, command("true", &[]))
            .await
            .expect("run");
        loop {
            match next_event(&mut events).await.expect("open") {
                ActorEvent::TaskExited { exit, .. } => {
                    assert_eq!(exit, TaskExit::from_code(0));
                    break;
                }
                ActorEvent::Died(cause) => panic!("the actor died: {cause}"),
                ActorEvent::Task { event: _, .. } => {}
            }
        }
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
    let own = std::process::id();
    let leftover: Vec<String> = memory_cgroup_dirs()
        .into_iter()
        .filter_map(|parent| std::fs::read_dir(parent).ok())
        .flat_map(|entries| entries.flatten())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            // `trainyard-<run>.<pid>.<start>`, or `trainyard-<run>-<pid>` without a start time.
            name.starts_with(&format!("trainyard-memory.{own}."))
                || name == &format!("trainyard-memory-{own}")
        })
        .collect();
    assert!(
        leftover.is_empty(),
        "the run's cgroup is left: {leftover:?}"
    );
}

/// Where this process's memory cgroup may be: its path under the cgroup v1 memory and v2
/// mounts, and those mounts' roots (a container sees its own cgroup as the root).
fn memory_cgroup_dirs() -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut dirs = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let root = if controllers.split(',').any(|c| c == "memory") {
            Path::new("/sys/fs/cgroup/memory")
        } else if controllers.is_empty() {
            Path::new("/sys/fs/cgroup")
        } else {
            continue;
        };
        dirs.push(root.join(path.trim_start_matches('/')));
        dirs.push(root.to_path_buf());
    }
    dirs.retain(|dir| dir.is_dir());
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_by_the_oom_killer_dies_of_its_memory_limit() {
    let cgroups = match MemoryEnforcement::probe() {
        MemoryEnforcement::Rlimit { why } => {
            eprintln!("SKIP: the OOM killer's cause is not checked: no memory cgroup ({why})");
            false
        }
        _ => true,
    };
    let config = two_nodes("oom")
        .with_agent(functions_agent())
        .enforce_memory(true);
    let runtime = LocalRuntime::start(config).await.expect("start");
    let limit: u64 = 64 << 20;
    let test = async {
        let options = memory(limit);
        let actor = runtime
            .spawn(ActorSpec {
                options,
                ..spec("hungry")
            })
            .await
            .expect("spawn");
        let mut events = runtime
            .task_events(actor)
            .await
            .expect("events")
            .expect("pushed");
        let task = TaskSpec::Function {
            name: ALLOCATE.to_owned(),
            arg: (8 * limit).into(),
            env: BTreeMap::new(),
        };
        runtime.run_task(actor, task).await.expect("run");
        let end = loop {
            match next_event(&mut events).await.expect("open") {
                ActorEvent::Task { event: _, .. } => {}
                end => break end,
            }
        };
        if cgroups {
            // The function runs inside the agent, which joined the worker's cgroup.
            assert_eq!(end, ActorEvent::Died(DeathCause::MemoryLimit { limit }));
            let call = runtime.poll(actor).await.expect_err("dead");
            assert!(call.is_actor_death(), "{call}");
        }
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
    assert!(runtime.agent_pids().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_given_up_leaves_no_agent_and_frees_its_resources() {
    let runtime = start("cancel").await;
    let test = async {
        let before = runtime.cluster().await.expect("cluster");
        let options = one_cpu();
        // One poll starts the agent; the spawn is dropped before it can connect.
        let spawn = runtime.spawn(ActorSpec {
            options,
            ..spec("impatient")
        });
        assert!(
            spawn.now_or_never().is_none(),
            "a spawn waits for its agent"
        );
        let deadline = Instant::now() + GONE_WITHIN;
        loop {
            let now = runtime.cluster().await.expect("cluster");
            if runtime.agent_pids().is_empty() && now.available() == before.available() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after {GONE_WITHIN:?}: agents {:?}, available {:?}",
                runtime.agent_pids(),
                now.available()
            );
            sleep(Duration::from_millis(10)).await;
        }
        let actor = runtime.spawn(spec("patient")).await.expect("spawn");
        runtime.node_info(actor).await.expect("answers");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_gets_the_gpu_ids_of_its_bundle() {
    let overrides = Overrides {
        num_cpus: Some(ResourceAmount::from(4u32)),
        num_gpus: Some(2),
        memory: Some(8 << 30),
        ..Overrides::default()
    };
    let nodes = plan_nodes(&Machine::detect(), &overrides, 2).expect("two nodes");
    let gpu_ids: Vec<Vec<String>> = nodes.iter().map(|n| n.gpu_ids.clone()).collect();
    let config = LocalConfig::new(nodes, "gpus")
        .expect("config")
        .with_agent(agent())
        .ledger(LedgerLocation::Off);
    let runtime = LocalRuntime::start(config).await.expect("start");
    let test = async {
        let factory = PlacementGroupFactory {
            bundles: vec!["CPU=1,GPU=1".parse().expect("bundle"); 2],
            strategy: PlacementStrategy::StrictSpread,
        };
        let pg = runtime
            .create_placement_group(&factory)
            .await
            .expect("group");
        let placed = runtime
            .wait_placement_group_ready(pg, Duration::from_secs(10))
            .await
            .expect("ready");
        for (index, bundle) in factory.bundles.iter().enumerate() {
            let actor = runtime
                .spawn(ActorSpec {
                    options: ActorOptions::try_from(bundle).expect("options"),
                    placement: Some((pg, index)),
                    ..spec("gpu-worker")
                })
                .await
                .expect("spawn");
            let info = runtime.node_info(actor).await.expect("node info");
            let node: usize = info
                .node_id
                .as_str()
                .trim_start_matches("local-")
                .parse()
                .expect("a local node id");
            assert_eq!(info.node_id, placed.bundle_nodes[index]);
            assert_eq!(info.accelerator_ids["GPU"], gpu_ids[node]);
        }
        runtime.remove_placement_group(pg).await.expect("remove");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_task_leaves_running_in_its_group_is_killed_when_it_ends() {
    let runtime = start("leftovers").await;
    let actor = runtime.spawn(spec("leftovers")).await.expect("spawn");
    let mut events = runtime
        .task_events(actor)
        .await
        .expect("subscribe")
        .expect("pushed");
    let task = trainyard_runtime::TaskSpec::Command {
        program: "sh".into(),
        args: vec!["-c".into(), "sleep 300 & echo $!".into()],
        env: std::collections::BTreeMap::new(),
    };
    runtime.run_task(actor, task).await.expect("run");
    let mut background = None;
    let started = std::time::Instant::now();
    loop {
        match timeout(TEST_LIMIT, events.next()).await.expect("an event") {
            Some(ActorEvent::Task {
                event: trainyard_runtime::TaskEvent::Log { line, .. },
                ..
            }) => {
                background = line.trim().parse::<u32>().ok();
            }
            Some(ActorEvent::TaskExited { exit, .. }) => {
                assert_eq!(exit, trainyard_runtime::TaskExit::from_code(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the end was held back by the background child: {:?}",
        started.elapsed()
    );
    let background = background.expect("the background pid");
    assert!(
        is_zombie_or_gone(background),
        "the background sleep outlived its task"
    );
    runtime.shutdown().await;
}

fn is_zombie_or_gone(pid: u32) -> bool {
    for _ in 0..100 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_info_names_the_running_tasks_own_pid_beside_the_agents() {
    let runtime = start("task-pid").await;
    let actor = runtime.spawn(spec("task-pid")).await.expect("spawn");
    let before = runtime.node_info(actor).await.expect("info");
    assert_eq!(before.task_pid, None, "no task yet");
    let task = trainyard_runtime::TaskSpec::Command {
        program: "sleep".into(),
        args: vec!["30".into()],
        env: BTreeMap::new(),
    };
    let pid = runtime
        .run_task(actor, task)
        .await
        .expect("run")
        .expect("a command has a pid");
    let during = runtime.node_info(actor).await.expect("info");
    assert_eq!(during.task_pid, Some(pid));
    assert_ne!(
        during.pid, pid,
        "the agent and its task are different processes"
    );
    runtime.kill(actor, Duration::ZERO).await.expect("kill");
    runtime.shutdown().await;
}

/// An agent that stops answering (here: stopped with SIGSTOP, its socket open) is found by
/// its missing heartbeats within seconds, killed, and reported as unresponsive, long before
/// any call's timeout; what it held is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_is_found_by_its_silence_in_seconds() {
    let silence = Duration::from_millis(1_500);
    let runtime = LocalRuntime::start(two_nodes("hung").heartbeat_timeout(silence))
        .await
        .expect("the runtime starts");
    let test = async {
        let before = runtime.cluster().await.expect("cluster");
        let (actor, mut events) = one_cpu_actor(&runtime, "sleeper").await;
        // Quiet but alive: a few heartbeat periods pass without a death.
        tokio::time::sleep(silence * 2).await;
        assert!(runtime.poll(actor).await.is_ok(), "a quiet agent is alive");
        let agent = runtime.agent_pids()[0];
        let pid = nix::unistd::Pid::from_raw(i32::try_from(agent).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("stop it");
        let stopped = Instant::now();
        let cause = died(&mut events).await;
        assert_eq!(
            cause,
            DeathCause::Unresponsive {
                after_ms: u64::try_from(silence.as_millis()).expect("ms")
            }
        );
        assert!(
            stopped.elapsed() < silence + Duration::from_secs(3),
            "found after {:?}",
            stopped.elapsed()
        );
        assert!(runtime.agent_pids().is_empty(), "the hung agent is reaped");
        assert_eq!(
            runtime.cluster().await.expect("cluster").available(),
            before.available()
        );
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// A task that floods reports while the driver does not read its events yet: calls are still
/// answered at once (replies never wait behind events), no report is lost, and they arrive in
/// order once the driver reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_not_held_up_by_reports_the_driver_has_not_read() {
    let call_timeout = Duration::from_secs(3);
    let config = two_nodes("flood")
        .with_agent(functions_agent())
        .call_timeout(call_timeout)
        .heartbeat_timeout(Duration::from_secs(3));
    let runtime = LocalRuntime::start(config).await.expect("start");
    let count: u64 = 12_000;
    let test = async {
        let (actor, mut events) = one_cpu_actor(&runtime, "flooder").await;
        let task = TaskSpec::Function {
            name: FLOOD.to_owned(),
            arg: serde_json::json!({ "count": count, "pad": 2048 }),
            env: BTreeMap::new(),
        };
        runtime.run_task(actor, task).await.expect("run");
        // Long enough for every buffer between the task and the driver to fill.
        sleep(Duration::from_secs(2)).await;
        for _ in 0..3 {
            let asked = Instant::now();
            let info = runtime.node_info(actor).await;
            assert!(info.is_ok(), "a call behind unread reports: {info:?}");
            assert!(
                asked.elapsed() < call_timeout / 2,
                "answered after {:?}",
                asked.elapsed()
            );
            sleep(call_timeout / 2).await;
        }
        every_flooded_report_in_order(&mut events, count).await;
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// A 200 MiB burst of reports that the driver does not read yet: the driver holds what its
/// windows allow (`EVENT_BYTES` in the actor's buffer, the hub's byte window and one frame),
/// not the burst, and every report still arrives, in order, once it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_large_reports_does_not_grow_the_driver_past_its_windows() {
    /// The bound: 32 MiB of buffer, 8 MiB of window and a frame, and room for the rest.
    const BOUND: u64 = 96 << 20;
    let config = two_nodes("burst").with_agent(functions_agent());
    let runtime = LocalRuntime::start(config).await.expect("start");
    let count: u64 = 200;
    let test = async {
        let (actor, mut events) = one_cpu_actor(&runtime, "burster").await;
        let before = resident_bytes();
        let task = TaskSpec::Function {
            name: FLOOD.to_owned(),
            arg: serde_json::json!({ "count": count, "pad": 1 << 20 }),
            env: BTreeMap::new(),
        };
        runtime.run_task(actor, task).await.expect("run");
        // Until the driver stops growing: held back by its windows, or (unbounded) holding the
        // whole burst.
        let (mut most, mut grew_at) = (0, Instant::now());
        let started = Instant::now();
        while grew_at.elapsed() < Duration::from_secs(2) && started.elapsed() < TEST_LIMIT / 4 {
            sleep(Duration::from_millis(100)).await;
            let grown = resident_bytes().saturating_sub(before);
            if grown > most + (1 << 20) {
                grew_at = Instant::now();
            }
            most = most.max(grown);
        }
        assert!(
            most < BOUND,
            "the driver grew by {} MiB while 200 MiB of reports were unread (bound {} MiB)",
            most >> 20,
            BOUND >> 20
        );
        every_flooded_report_in_order(&mut events, count).await;
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// Reads the events of a [`FLOOD`] task of `count` reports to its end: every report
/// arrives, in order, and the task succeeds.
async fn every_flooded_report_in_order(events: &mut TaskEvents, count: u64) {
    let mut next_step = 0;
    loop {
        match next_event(events).await.expect("open") {
            ActorEvent::Task {
                event: TaskEvent::Report { metrics, .. },
                ..
            } => {
                assert_eq!(metrics["step"], next_step, "reports arrive in order");
                next_step += 1;
            }
            ActorEvent::Task { event: _, .. } => {}
            ActorEvent::TaskExited { exit, .. } => {
                assert_eq!(
                    exit,
                    TaskExit::Succeeded {
                        value: count.into()
                    }
                );
                break;
            }
            ActorEvent::Died(cause) => panic!("the actor died: {cause}"),
        }
    }
    assert_eq!(next_step, count, "every report arrives");
}

/// This process's resident memory, from `/proc/self/status`.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib << 10)
        .expect("VmRSS in /proc/self/status")
}

/// A function task that keeps every thread it can busy runs apart from the agent's own
/// work: heartbeats go on, and the agent lives well past the heartbeat timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_bound_function_task_keeps_its_agent_alive_past_the_heartbeat_timeout() {
    let silence = Duration::from_millis(1_500);
    let config = two_nodes("spin")
        .with_agent(functions_agent())
        .heartbeat_timeout(silence);
    let runtime = LocalRuntime::start(config).await.expect("start");
    let test = async {
        let (actor, mut events) = one_cpu_actor(&runtime, "spinner").await;
        let task = TaskSpec::Function {
            name: SPIN.to_owned(),
            arg: (silence * 3).as_secs_f64().into(),
            env: BTreeMap::new(),
        };
        runtime.run_task(actor, task).await.expect("run");
        loop {
            match next_event(&mut events).await.expect("open") {
                ActorEvent::Task { event: _, .. } => {}
                ActorEvent::TaskExited { exit, .. } => {
                    assert_eq!(
                        exit,
                        TaskExit::Succeeded {
                            value: serde_json::Value::Null
                        }
                    );
                    break;
                }
                ActorEvent::Died(cause) => panic!("the agent died while its task ran: {cause}"),
            }
        }
        runtime
            .node_info(actor)
            .await
            .expect("the agent still answers");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// Every event stream ends with the actor's death and its cause, whoever ended it: a kill,
/// a stop (after the task's own end), or the runtime's shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_or_stopped_actors_stream_ends_with_its_death() {
    let runtime = start("ends").await;
    let test = async {
        let (killed, mut killed_events) = one_cpu_actor(&runtime, "killed").await;
        runtime.kill(killed, Duration::ZERO).await.expect("kill");
        assert_eq!(
            next_event(&mut killed_events).await,
            Some(ActorEvent::Died(DeathCause::Killed))
        );
        assert_eq!(next_event(&mut killed_events).await, None);

        let (stopped, mut stopped_events) = one_cpu_actor(&runtime, "stopped").await;
        let task = runtime
            .run_task(stopped, command("sleep", &["300"]))
            .await
            .expect("run")
            .expect("a pid");
        sleeping(task).await;
        runtime.stop(stopped).await.expect("stop");
        let mut seen = Vec::new();
        while let Some(event) = next_event(&mut stopped_events).await {
            seen.push(event);
        }
        assert!(
            matches!(
                seen.as_slice(),
                [
                    ActorEvent::Task {
                        event: TaskEvent::RootCause { error: None, .. },
                        ..
                    },
                    ActorEvent::TaskExited { exit: _, .. },
                    ..
                ]
            ),
            "the task's end, after its root cause, comes first: {seen:?}"
        );
        assert_eq!(
            seen.last(),
            Some(&ActorEvent::Died(DeathCause::Stopped)),
            "{seen:?}"
        );

        let (_, mut shut_down_events) = one_cpu_actor(&runtime, "shut-down").await;
        runtime.shutdown().await;
        assert_eq!(
            next_event(&mut shut_down_events).await,
            Some(ActorEvent::Died(DeathCause::Killed))
        );
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// A poll says what the task does: idle before it, running while it runs, and its exit after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_tells_the_tasks_status_and_exit() {
    let runtime = start("poll").await;
    let test = async {
        let (actor, mut events) = one_cpu_actor(&runtime, "polled").await;
        let idle = runtime.poll(actor).await.expect("poll");
        assert_eq!(idle.status, TaskStatus::Idle);
        let task = runtime
            .run_task(actor, command("sleep", &["300"]))
            .await
            .expect("run")
            .expect("a pid");
        sleeping(task).await;
        assert_eq!(
            runtime.poll(actor).await.expect("poll").status,
            TaskStatus::Running
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(task).expect("pid")),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill the task");
        let exit = loop {
            match next_event(&mut events).await.expect("open") {
                ActorEvent::TaskExited { exit, .. } => break exit,
                ActorEvent::Task { event: _, .. } => {}
                ActorEvent::Died(cause) => panic!("the actor died: {cause}"),
            }
        };
        let polled = runtime.poll(actor).await.expect("poll");
        assert_eq!(polled.status, TaskStatus::Exited { exit });
        assert!(polled.events.is_empty(), "events are pushed, not polled");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}
