//! The agent process: connects to the driver, serves its requests, runs one task at a time
//! and pushes the task's events; it exits when told to stop, when the driver's connection
//! ends, or on SIGTERM, stopping its task gracefully first.
//!
//! Start-up ([`main`]) makes the agent's supervision once (where its own messages go, its
//! watchdog) and hands it down. Then [`connect`] reaches the driver through the handshake,
//! [`frames`] reads and writes the authenticated connection, [`dispatch`] serves the
//! requests, [`function`] runs function tasks on threads of their own, and [`ledger`] holds
//! the run's ledger lock while the agent lives.

mod connect;
mod dispatch;
mod frames;
mod function;
mod ledger;

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt as _;
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use trainyard_runtime::events::{EVENT_BUFFER, event_channel};
use trainyard_runtime::{FunctionRegistry, Request, Response};
use trainyard_wire::config::{AGENT_FAILED, AgentConfig, CONFIG};
use trainyard_wire::token::Token;
use trainyard_wire::warm::WarmZygote;
use trainyard_wire::wire::AgentMessage;

use crate::descendants;
use crate::diagnostics::Diagnostics;
use crate::output::{self, TaskOutput};
use crate::watchdog::Watchdog;
use dispatch::Agent;
use frames::Outgoing;

/// What supervises the agent, made once at start-up: where its own messages go, and its
/// watchdog.
#[derive(Debug)]
struct Supervision {
    diagnostics: Diagnostics,
    watchdog: Watchdog,
}

/// Why the agent stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The driver asked; the reply goes out once the task is stopped.
    Asked(u64),
    /// A scheduler ended the job (SIGTERM under [`AgentConfig::scheduler_stops`]).
    Scheduler,
    /// The driver is gone, or the agent got SIGTERM.
    Lost,
}

/// Runs the agent configured by this process's environment until it stops.
/// Its supervision (where its own messages go, its watchdog) is made here, once, and handed
/// down to what needs it.
pub(crate) fn main(functions: FunctionRegistry) -> ExitCode {
    // Until fd 2 is a pipe of the agent's own, its messages go to fd 2 itself.
    let early = Diagnostics::default();
    let mut config: AgentConfig = match std::env::var(CONFIG)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(config) => config,
        Err(error) => {
            early.diagnose(format_args!("trainyard agent: no valid {CONFIG}: {error}"));
            return ExitCode::from(AGENT_FAILED);
        }
    };
    ledger::hold_ledger_lock(&early);
    let mut line = String::new();
    let token = std::io::stdin()
        .read_line(&mut line)
        .ok()
        .and_then(|_| Token::from_hex(&line));
    let Some(token) = token else {
        early.diagnose("trainyard agent: no valid token on stdin");
        return ExitCode::from(AGENT_FAILED);
    };
    // SIGTERM when the driver dies; and if it died before this line, exit now. A parent of
    // 0 is whichever process started the agent (a scheduler's step daemon).
    let parent = match config.parent {
        0 => nix::unistd::getppid().as_raw(),
        parent => i32::try_from(parent).unwrap_or(-1),
    };
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).is_err()
        || nix::unistd::getppid().as_raw() != parent
    {
        early.diagnose("trainyard agent: the driver is gone");
        return ExitCode::from(AGENT_FAILED);
    }
    descendants::become_subreaper(&early);
    let watchdog = Watchdog::start(&early);
    // Before fd 2 is redirected: what the warm Python says is the agent's, not a task's.
    let warm = own_warm_python(&mut config, &early);
    let (pipes, diagnostics) = output::redirect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            diagnostics.diagnose(format_args!("trainyard agent: cannot start: {error}"));
            return ExitCode::from(AGENT_FAILED);
        }
    };
    let output = {
        let _entered = runtime.enter();
        TaskOutput::start(pipes, diagnostics.clone())
    };
    let supervision = Supervision {
        diagnostics,
        watchdog: watchdog.clone(),
    };
    let code = runtime.block_on(serve(config, token, functions, output, supervision));
    // Tasks still running belong to a driver that is gone; do not wait for them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    crate::warm::end_parked();
    if let Some((warm, _helper)) = warm {
        warm.stop();
    }
    descendants::sweep(descendants::Scope::All, watchdog.pid());
    watchdog.flush();
    code
}

/// Starts the warm Python `config` asks the agent to start itself
/// ([`AgentConfig::start_warm_python`]), when the runtime shares none with it, and tells
/// `config` of it: it imports while the agent connects, and serves every attempt's task
/// until the agent exits. Spared by the sweep at a task's end (a [`descendants::Helper`]). One
/// that cannot start is said once; the tasks then start cold.
fn own_warm_python(
    config: &mut AgentConfig,
    early: &Diagnostics,
) -> Option<(WarmZygote, descendants::Helper)> {
    if config.warm_python.is_some() {
        return None;
    }
    let spec = config.start_warm_python.as_ref()?;
    match WarmZygote::start(spec) {
        Ok(warm) => {
            let helper = descendants::helper(warm.endpoint().pid);
            config.warm_python = Some(warm.endpoint().clone());
            Some((warm, helper))
        }
        Err(error) => {
            early.diagnose(format_args!(
                "trainyard: --warm-python: cannot start the warm Python `{}` on this node: {error}; its ranks start cold",
                spec.python.display()
            ));
            None
        }
    }
}

/// Connects to the driver and serves it until the agent stops.
async fn serve(
    config: AgentConfig,
    token: Token,
    functions: FunctionRegistry,
    output: TaskOutput,
    supervision: Supervision,
) -> ExitCode {
    let Supervision {
        diagnostics,
        watchdog,
    } = supervision;
    let framed = match connect::connect(&config, &token).await {
        Ok(framed) => framed,
        Err(why) => {
            diagnostics.diagnose(format_args!("trainyard agent: {why}"));
            return ExitCode::from(AGENT_FAILED);
        }
    };
    let (sink, frames) = framed.split();

    let (events, stream) = event_channel(EVENT_BUFFER);
    let (replies, replies_rx) = mpsc::channel::<AgentMessage>(64);
    let (credits, credits_rx) = mpsc::unbounded_channel();
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    // Reading apart from serving: credit reaches the writer while a request is handled.
    let reader = tokio::spawn(frames::read_frames(
        frames,
        requests_tx,
        credits,
        diagnostics.clone(),
        Duration::from_millis(config.driver_lost_ms.max(1)),
    ));
    let heartbeat = Duration::from_millis(config.heartbeat_ms.max(1));
    let writer = tokio::spawn(frames::write_frames(
        sink,
        Outgoing {
            replies: replies_rx,
            events: stream,
            credits: credits_rx,
        },
        heartbeat,
    ));

    let grace = Duration::from_millis(config.grace_ms);
    let scheduler_stops = config.scheduler_stops;
    let mut agent = Agent::new(config, functions, events, output, diagnostics, watchdog);
    let mut terminate = signal(SignalKind::terminate()).ok();
    // A scheduler's warning before it ends the job (Slurm's `--signal=USR1@90`, `scancel
    // --signal=USR1`) reaches the agent, which runs the task in a process group of its own:
    // the agent hands it on, so the task can save a checkpoint.
    let mut usr1 = signal(SignalKind::user_defined1()).ok();
    let stop = loop {
        let next = tokio::select! {
            next = requests.recv() => next,
            () = async {
                match usr1.as_mut() {
                    Some(usr1) => { usr1.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {
                agent.relay(Signal::SIGUSR1);
                continue;
            }
            () = async {
                match terminate.as_mut() {
                    Some(terminate) => { terminate.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => break if scheduler_stops { Stop::Scheduler } else { Stop::Lost },
        };
        let Some((id, request)) = next else {
            break Stop::Lost;
        };
        if request == Request::Stop {
            break Stop::Asked(id);
        }
        let result = agent.handle(request).await;
        if replies
            .send(AgentMessage::Reply { id, result })
            .await
            .is_err()
        {
            break Stop::Lost;
        }
    };
    if stop == Stop::Scheduler {
        // The driver hears why from the scheduler (the step's end), not a task ended by
        // SIGTERM: nothing more is sent.
        writer.abort();
    }
    if let Some(task) = agent.task_mut() {
        // Only a driver that asked is there to take the reports of what is still persisted.
        task.terminate(grace, matches!(stop, Stop::Asked(_))).await;
    }
    if let Stop::Asked(id) = stop {
        let _ = replies
            .send(AgentMessage::Reply {
                id,
                result: Ok(Response::Done),
            })
            .await;
    }
    drop(replies);
    drop(agent);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    reader.abort();
    ExitCode::SUCCESS
}
