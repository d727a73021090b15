//! Function tasks: a registered function run inside the agent, on a runtime and threads of
//! its own, so that a function that keeps its threads busy never holds up the agent's
//! replies and heartbeats.

use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, watch};
use trainyard_runtime::events::EventSender;
use trainyard_runtime::{TaskEvent, TaskExit, TaskFailure, TaskResult};

use crate::output::TaskOutput;
use crate::root_cause;
use crate::stacks::TASK_THREAD;

/// Why a function task is cancelled, which says whether its end is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cancel {
    /// `StopTask`: the agent lives on for the next task, and the end is told, a stopped
    /// task's.
    Task,
    /// The agent ends: nothing more is told of the task; the actor's end says why (a
    /// stopped task's end told first would read as the task's own failure).
    WithAgent,
}

/// A function task, running on threads of its own.
pub(super) struct RunningFunction {
    /// Drops the function at its next await (sending its end as a stopped task's when the
    /// agent lives on); a function that never awaits runs on until the agent exits.
    cancel: Option<oneshot::Sender<Cancel>>,
    /// The task's exit, once it has ended and its end was sent.
    done: watch::Receiver<Option<TaskExit>>,
}

impl RunningFunction {
    /// How the task ended, once it has (and its end was sent).
    pub(super) fn exit(&self) -> Option<TaskExit> {
        self.done.borrow().clone()
    }

    /// Drops the function at its next await. For [`Cancel::Task`], waits up to `grace` for
    /// it to get there (its end, a stopped task's, is sent then); for [`Cancel::WithAgent`],
    /// returns at once and its end is never told.
    pub(super) async fn cancel(&mut self, how: Cancel, grace: Duration) {
        if let Some(cancel) = self.cancel.take() {
            let _ = cancel.send(how);
        }
        if how == Cancel::Task {
            let _ = tokio::time::timeout(grace, self.done.wait_for(Option::is_some)).await;
        }
    }
}

/// How many threads a function task's own runtime has.
const FUNCTION_THREADS: usize = 2;

/// Starts `future`, a function task whose own events arrive on `produced`, on threads of its
/// own; its events go to `events`, and what the agent process prints from now on is the
/// task's (`output`).
///
/// # Errors
/// When its thread cannot be started: then nothing printed is the task's.
pub(super) fn start(
    future: BoxFuture<'static, TaskResult>,
    produced: mpsc::UnboundedReceiver<TaskEvent>,
    events: EventSender,
    output: &TaskOutput,
) -> std::io::Result<RunningFunction> {
    let (done_tx, done) = watch::channel(None);
    let (cancel, cancelled) = oneshot::channel();
    // What the agent process prints from now on is the task's.
    output.begin(events.clone());
    let ending = FunctionEnd {
        events,
        output: output.clone(),
        done: done_tx,
    };
    // Threads of its own: a function that keeps its threads busy cannot hold up the
    // agent's replies and heartbeats.
    std::thread::Builder::new()
        .name(TASK_THREAD.to_owned())
        .spawn(move || run_on_own_threads(future, produced, &ending, cancelled))
        .inspect_err(|_| output.abandon())?;
    Ok(RunningFunction {
        cancel: Some(cancel),
        done,
    })
}

/// Where a function task's end goes.
struct FunctionEnd {
    /// The agent's events: the task's output, then its exit.
    events: EventSender,
    /// The agent process's output, the task's while it runs.
    output: TaskOutput,
    /// Told the task's exit once it is sent.
    done: watch::Sender<Option<TaskExit>>,
}

/// Runs a function task on a runtime of its own, on this thread and [`FUNCTION_THREADS`]
/// more, to its end (its output passed on, its exit sent, then told through `done`) or until
/// it is cancelled. A failed exit goes after a root cause that names no exception: a
/// function's error is in its exit already.
fn run_on_own_threads(
    future: BoxFuture<'static, TaskResult>,
    produced: mpsc::UnboundedReceiver<TaskEvent>,
    ending: &FunctionEnd,
    cancelled: oneshot::Receiver<Cancel>,
) {
    let FunctionEnd {
        events,
        output,
        done,
    } = ending;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(FUNCTION_THREADS)
        .thread_name(TASK_THREAD)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            let exit = TaskExit::Failed {
                failure: TaskFailure::Error {
                    message: format!("cannot start the function's runtime: {error}"),
                },
            };
            let ended_ms = root_cause::now_ms();
            output.abandon();
            futures::executor::block_on(root_cause::send_exit(
                events,
                exit.clone(),
                ended_ms,
                None,
            ));
            done.send_replace(Some(exit));
            return;
        }
    };
    runtime.block_on(async {
        tokio::select! {
            exit = trainyard_runtime::drive(future, produced, events) => {
                let ended_ms = root_cause::now_ms();
                // What it printed goes before its end.
                output.end().await;
                root_cause::send_exit(events, exit.clone(), ended_ms, None).await;
                done.send_replace(Some(exit));
            }
            Ok(how) = cancelled => {
                output.abandon();
                if how == Cancel::WithAgent {
                    return;
                }
                let ended_ms = root_cause::now_ms();
                let exit = TaskExit::Failed {
                    failure: TaskFailure::Error {
                        message: "the task was stopped".to_owned(),
                    },
                };
                root_cause::send_exit(events, exit.clone(), ended_ms, None).await;
                done.send_replace(Some(exit));
            }
        }
    });
    // What the function left running is not waited for.
    runtime.shutdown_background();
}
