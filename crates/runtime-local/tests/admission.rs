//! Connections that never authenticate do not keep real clients out: idle connections held
//! open to the driver's address (and opened again whenever one is closed, as an attacker
//! would) while real agents start and run their tasks, and idle connections to a task's
//! report socket while the task reports through both Python clients.
//!
//! The agents are `examples/agent.rs`. The report test runs `python3 -c`; without `python3`
//! on `PATH` it says `SKIP:` and passes.
#![allow(
    clippy::disallowed_methods,
    reason = "tests make scratch files of their own"
)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::timeout;
use trainyard_resources::{ActorOptions, ResourceAmount};
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, Stream, TaskEvent, TaskExit, TaskSpec,
};
use trainyard_runtime_local::detect::{Machine, Overrides, plan_nodes};
use trainyard_runtime_local::ledger::LedgerLocation;
use trainyard_runtime_local::{LocalConfig, LocalRuntime};

/// The bound of every test.
const TEST_LIMIT: Duration = Duration::from_secs(180);
/// The bound of one wait for an event.
const WAIT: Duration = Duration::from_secs(60);
/// How long the flood waits before it opens a closed connection again.
const REOPEN_AFTER: Duration = Duration::from_millis(250);

/// Connections to one address that never send a byte, each opened again
/// [`REOPEN_AFTER`] after the other end closed it; they end when this is dropped.
struct Flood {
    tasks: JoinSet<()>,
    /// How many connections were opened, in all.
    opened: Arc<AtomicUsize>,
    /// How many were closed by the other end.
    closed: Arc<AtomicUsize>,
}

impl Flood {
    /// Opens `n` connections to `addr`, and returns once each has been opened once.
    async fn start(addr: SocketAddr, n: usize) -> Self {
        let opened = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        for _ in 0..n {
            let (opened, closed) = (Arc::clone(&opened), Arc::clone(&closed));
            tasks.spawn(async move {
                loop {
                    if let Ok(mut idle) = TcpStream::connect(addr).await {
                        opened.fetch_add(1, Ordering::SeqCst);
                        // Reads nothing but the end: nothing is ever sent to a stranger.
                        let mut byte = [0u8; 1];
                        while matches!(idle.read(&mut byte).await, Ok(1..)) {}
                        closed.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(REOPEN_AFTER).await;
                }
            });
        }
        let flood = Self {
            tasks,
            opened,
            closed,
        };
        timeout(WAIT, async {
            while flood.opened() < n {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the flood's connections open");
        flood
    }

    fn opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// A runtime of one node with 4 CPUs, its agents being `examples/agent.rs`.
async fn runtime(run: &str) -> LocalRuntime {
    let overrides = Overrides {
        num_cpus: Some(ResourceAmount::from(4u32)),
        memory: Some(4 << 30),
        ..Overrides::default()
    };
    let nodes = plan_nodes(&Machine::detect(), &overrides, 1).expect("one node");
    let config = LocalConfig::new(nodes, run)
        .expect("config")
        .with_agent(common::agent())
        .stop_grace(Duration::from_secs(2))
        .ledger(LedgerLocation::Off);
    LocalRuntime::start(config)
        .await
        .expect("the runtime starts")
}

/// Spawns a 1-CPU actor called `name`, and takes its task events.
async fn spawn_actor(runtime: &LocalRuntime, name: &str) -> (ActorId, TaskEvents) {
    let spec = ActorSpec {
        name: name.to_owned(),
        options: ActorOptions {
            num_cpus: ResourceAmount::ONE,
            ..ActorOptions::default()
        },
        placement: None,
        env: BTreeMap::new(),
    };
    let actor = runtime.spawn(spec).await.expect("the agent is served");
    let events = runtime
        .task_events(actor)
        .await
        .expect("events")
        .expect("pushed");
    (actor, events)
}

/// The actor's next event, within [`WAIT`].
async fn next_event(events: &mut TaskEvents) -> ActorEvent {
    timeout(WAIT, events.next())
        .await
        .expect("an event in time")
        .expect("the stream is open")
}

/// What a task sent until it ended.
#[derive(Debug, Default)]
struct Outcome {
    output: Vec<String>,
    reports: Vec<serde_json::Value>,
    exit: Option<TaskExit>,
}

impl Outcome {
    /// Follows the running task to its end.
    async fn follow(events: &mut TaskEvents, mut outcome: Self) -> Self {
        while outcome.exit.is_none() {
            outcome.take(next_event(events).await);
        }
        outcome
    }

    fn take(&mut self, event: ActorEvent) {
        match event {
            ActorEvent::Task {
                event: TaskEvent::Log { stream, line },
                ..
            } => {
                let stream = if stream == Stream::Stdout {
                    "out"
                } else {
                    "err"
                };
                self.output.push(format!("{stream}: {line}"));
            }
            ActorEvent::Task {
                event: TaskEvent::Report { metrics, .. },
                ..
            } => {
                self.reports.push(serde_json::Value::Object(metrics));
            }
            ActorEvent::Task { event: _, .. } => {}
            ActorEvent::TaskExited { exit, .. } => self.exit = Some(exit),
            ActorEvent::Died(cause) => panic!("the actor died: {cause}\n{self:?}"),
        }
    }

    fn assert_succeeded(&self) {
        assert!(
            matches!(self.exit, Some(TaskExit::Succeeded { .. })),
            "the task failed: {:?}\n{}",
            self.exit,
            self.output.join("\n")
        );
    }
}

fn command(program: &str, args: &[&str], env: BTreeMap<String, String>) -> TaskSpec {
    TaskSpec::Command {
        program: program.to_owned(),
        args: args.iter().map(|&arg| arg.to_owned()).collect(),
        env,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_idle_connections_do_not_stop_agents_from_connecting_and_running() {
    let runtime = runtime("idle-flood").await;
    let test = async {
        let flood = Flood::start(runtime.driver_address(), 300).await;
        let mut actors = Vec::new();
        for n in 0..3 {
            let (actor, mut events) = spawn_actor(&runtime, &format!("worker-{n}")).await;
            let task = command("sh", &["-c", "echo ran"], BTreeMap::new());
            runtime.run_task(actor, task).await.expect("started");
            let outcome = Outcome::follow(&mut events, Outcome::default()).await;
            outcome.assert_succeeded();
            assert_eq!(outcome.output, ["out: ran"]);
            actors.push(actor);
        }
        // The flood was real: more connections than the hub keeps waiting, so it closed
        // idle ones for newer ones, and the flood opened them again.
        assert!(
            flood.closed() >= 300 - 64,
            "{} of {} idle connections were closed",
            flood.closed(),
            flood.opened()
        );
        for actor in actors {
            runtime.kill(actor, Duration::ZERO).await.expect("killed");
        }
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}

/// Says where it reports, waits for the file `$GO`, then reports three times with each
/// Python client.
const REPORT_UNDER_FLOOD: &str = r#"
import os, sys, time
import trainyard_report
from trainyard import train
print("addr:" + os.environ["TRAINYARD_REPORT_ADDR"], flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(os.environ["GO"]):
    if time.monotonic() > deadline:
        sys.exit("no go within 60 s")
    time.sleep(0.05)
for step in range(3):
    train.report({"client": 2, "step": step})
for step in range(3):
    trainyard_report.report({"client": 1, "step": step})
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_reports_arrive_while_a_hundred_idle_connections_are_held_to_its_socket() {
    let python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !python {
        println!("SKIP: python3 is not on PATH");
        return;
    }
    let runtime = runtime("report-flood").await;
    let scratch = tempfile::tempdir().expect("a temp dir");
    let go = scratch.path().join("go");
    let test = async {
        let (actor, mut events) = spawn_actor(&runtime, "reporter").await;
        let env = BTreeMap::from([(
            "GO".to_owned(),
            go.to_str().expect("a UTF-8 path").to_owned(),
        )]);
        let task = command("python3", &["-c", REPORT_UNDER_FLOOD], env);
        runtime.run_task(actor, task).await.expect("started");
        let mut outcome = Outcome::default();
        let addr = loop {
            let event = next_event(&mut events).await;
            if let ActorEvent::Task {
                event:
                    TaskEvent::Log {
                        stream: Stream::Stdout,
                        line,
                    },
                ..
            } = &event
                && let Some(addr) = line.strip_prefix("addr:")
            {
                break addr.parse::<SocketAddr>().expect("HOST:PORT");
            }
            outcome.take(event);
            assert!(outcome.exit.is_none(), "{outcome:?}");
        };
        let flood = Flood::start(addr, 100).await;
        std::fs::write(&go, "").expect("written");
        let outcome = Outcome::follow(&mut events, outcome).await;
        outcome.assert_succeeded();
        let expected: Vec<_> = [2, 1]
            .into_iter()
            .flat_map(|client| {
                (0..3).map(move |step| serde_json::json!({"client": client, "step": step}))
            })
            .collect();
        assert_eq!(outcome.reports, expected, "{outcome:?}");
        assert!(flood.opened() >= 100);
        drop(flood);
        runtime.kill(actor, Duration::ZERO).await.expect("killed");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    runtime.shutdown().await;
}
