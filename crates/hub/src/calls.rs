//! What the runtime asks of an actor's supervisor ([`Command`]), and calls in flight on one
//! agent's connection: ids handed out, replies routed back to their callers, and the agent's
//! answers turned into the runtime's results.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::oneshot;
use trainyard_runtime::{ActorId, DeathCause, Request, Response, RuntimeError};
use trainyard_wire::wire::WireError;

/// Where a caller waits for its answer.
pub(crate) type Reply = oneshot::Sender<Result<Response, RuntimeError>>;

/// What the runtime asks of an actor's supervisor.
#[derive(Debug)]
pub(crate) enum Command {
    /// Send a request and answer `reply` with the agent's reply.
    Call {
        /// The request.
        request: Request,
        /// The caller.
        reply: Reply,
    },
    /// End the actor: SIGTERM, up to `grace` to exit, then SIGKILL; `done` once it is gone.
    Kill {
        /// Patience between SIGTERM and SIGKILL.
        grace: Duration,
        /// What the death is recorded as.
        cause: DeathCause,
        /// Told when the actor is gone and its resources are free.
        done: oneshot::Sender<()>,
    },
}

/// The name of a request, as errors name it.
pub(crate) fn request_name(request: &Request) -> &'static str {
    match request {
        Request::NodeInfo => "node_info",
        Request::FindFreePort => "find_free_port",
        Request::SetEnv { .. } => "set_env",
        Request::RunTask { .. } => "run_task",
        Request::Poll => "poll",
        Request::Stop => "stop",
        Request::StopTask => "stop_task",
        Request::Stacks => "stacks",
        Request::Preflight { .. } => "preflight",
    }
}

/// A request sent and not yet answered.
#[derive(Debug)]
pub(crate) struct PendingCall {
    /// The request's name.
    pub(crate) request: &'static str,
    /// Its caller.
    pub(crate) reply: Reply,
}

/// Calls in flight, by id.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    next: u64,
    calls: HashMap<u64, PendingCall>,
}

impl Pending {
    /// Records a call of `request` and returns its id.
    pub(crate) fn add(&mut self, request: &'static str, reply: Reply) -> u64 {
        let id = self.next;
        self.next += 1;
        self.calls.insert(id, PendingCall { request, reply });
        id
    }

    /// The call answered by a reply with `id`; `None` for an id not in flight.
    pub(crate) fn take(&mut self, id: u64) -> Option<PendingCall> {
        self.calls.remove(&id)
    }

    /// Takes every call of `request` out of flight.
    pub(crate) fn take_all(&mut self, request: &str) -> Vec<PendingCall> {
        let ids: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, call)| call.request == request)
            .map(|(&id, _)| id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.calls.remove(&id))
            .collect()
    }

    /// Answers every call in flight with the actor's death.
    pub(crate) fn fail_all(&mut self, actor: ActorId, cause: &DeathCause) {
        for (_, call) in self.calls.drain() {
            let _ = call.reply.send(Err(RuntimeError::ActorDied {
                actor,
                cause: cause.clone(),
            }));
        }
    }
}

/// The runtime's result for an agent's answer to `request`; refusals stay data.
pub(crate) fn reply_result(
    actor: ActorId,
    request: &'static str,
    result: Result<Response, WireError>,
) -> Result<Response, RuntimeError> {
    result.map_err(|error| match error {
        WireError::TaskRejected { rejection } => RuntimeError::TaskRejected { actor, rejection },
        WireError::Unsupported { reason, .. } => RuntimeError::Unsupported {
            actor,
            request,
            reason,
        },
        other => RuntimeError::Unsupported {
            actor,
            request,
            reason: other.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use trainyard_runtime::TaskRejection;

    use super::*;

    #[test]
    fn replies_reach_the_caller_of_their_id_whatever_the_order() {
        let mut pending = Pending::default();
        let (first, mut first_rx) = oneshot::channel();
        let (second, mut second_rx) = oneshot::channel();
        let a = pending.add("node_info", first);
        let b = pending.add("poll", second);
        assert_ne!(a, b);
        assert!(pending.take_all("stop").is_empty());

        let call = pending.take(b).expect("in flight");
        assert_eq!(call.request, "poll");
        let _ = call.reply.send(Ok(Response::Done));
        assert_eq!(
            second_rx.try_recv().expect("answered").expect("ok"),
            Response::Done
        );
        assert!(first_rx.try_recv().is_err(), "the other call still waits");
        assert!(pending.take(b).is_none(), "an id is answered once");
        assert!(pending.take(99).is_none(), "an unknown id is ignored");
    }

    #[test]
    fn a_death_answers_every_call_in_flight_with_its_cause() {
        let mut pending = Pending::default();
        let receivers: Vec<_> = (0..3)
            .map(|_| {
                let (tx, rx) = oneshot::channel();
                pending.add("node_info", tx);
                rx
            })
            .collect();
        pending.fail_all(ActorId(4), &DeathCause::ConnectionLost);
        for mut rx in receivers {
            let error = rx.try_recv().expect("answered").expect_err("died");
            assert!(matches!(
                error,
                RuntimeError::ActorDied {
                    actor: ActorId(4),
                    cause: DeathCause::ConnectionLost
                }
            ));
        }
        assert!(pending.take_all("node_info").is_empty());
    }

    #[test]
    fn refusals_stay_typed() {
        let rejection = TaskRejection::ProgramNotFound {
            program: "pyhton".into(),
        };
        let refused = reply_result(
            ActorId(1),
            "run_task",
            Err(WireError::TaskRejected {
                rejection: rejection.clone(),
            }),
        );
        assert!(matches!(
            refused,
            Err(RuntimeError::TaskRejected { actor: ActorId(1), rejection: r }) if r == rejection
        ));
        let unsupported = reply_result(
            ActorId(1),
            "find_free_port",
            Err(WireError::Unsupported {
                request: "find_free_port".into(),
                reason: "no port".into(),
            }),
        );
        let Err(RuntimeError::Unsupported {
            request, reason, ..
        }) = unsupported
        else {
            panic!("expected unsupported: {unsupported:?}");
        };
        assert_eq!((request, reason.as_str()), ("find_free_port", "no port"));
        assert_eq!(
            reply_result(ActorId(1), "poll", Ok(Response::Done)).expect("ok"),
            Response::Done
        );
    }
}
