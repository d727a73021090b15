//! Interaction tests with `MockActorRuntime`: what this crate's helpers ask of a runtime, in
//! which order and how often, and what they make of its answers — the event stream of
//! [`events::subscribe`] and the typed calls of [`ActorRuntimeExt`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, stream};
use mockall::Sequence;
use mockall::predicate::eq;
use tokio::time::Instant;
use trainyard_runtime::events::{self, ActorEvent, TaskEvents};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, AttemptNumber, DeathCause, MockActorRuntime, NodeId,
    PollResult, Request, Response, RuntimeError, Stream, TaskEvent, TaskExit, TaskSpec, TaskStatus,
    WorkerInfo,
};

const ACTOR: ActorId = ActorId(7);
const INTERVAL: Duration = Duration::from_secs(1);

fn line(text: &str) -> TaskEvent {
    TaskEvent::Log {
        stream: Stream::Stdout,
        line: text.to_owned(),
    }
}

fn polled(events: Vec<TaskEvent>, status: TaskStatus) -> Result<Response, RuntimeError> {
    Ok(Response::Poll(PollResult {
        events,
        status,
        attempt: None,
    }))
}

/// A mock whose `task_events` answers `Ok(None)`: it can only be polled.
fn poll_only() -> MockActorRuntime {
    let mut mock = MockActorRuntime::new();
    mock.expect_task_events()
        .with(eq(ACTOR))
        .times(1)
        .returning(|_| Ok(None));
    mock
}

/// Counts the calls the mock gets (answering each with `Done`).
fn count_calls(mock: &mut MockActorRuntime) -> Arc<AtomicUsize> {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    mock.expect_call().returning(move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(Response::Done)
    });
    calls
}

/// Everything the stream yields until it ends; a stream that does not end within a minute
/// fails the test.
async fn drain(events: TaskEvents) -> Vec<ActorEvent> {
    tokio::time::timeout(Duration::from_secs(60), events.collect())
        .await
        .expect("the stream ends")
}

/// Subscribes to `ACTOR`'s events. The runtime comes back so that the test holds the mock
/// to its end: dropping it checks the expected call counts.
async fn subscribe(mock: MockActorRuntime) -> (Arc<dyn ActorRuntime>, TaskEvents) {
    let runtime: Arc<dyn ActorRuntime> = Arc::new(mock);
    let events = events::subscribe(&runtime, ACTOR, INTERVAL)
        .await
        .expect("subscribed");
    (runtime, events)
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_cannot_push_is_polled_every_interval_and_its_answers_become_the_stream() {
    let mut mock = poll_only();
    let start = Instant::now();
    let asked_at = Arc::new(Mutex::new(Vec::new()));
    let mut order = Sequence::new();
    let answers = [
        polled(vec![line("step 1")], TaskStatus::Running),
        polled(
            vec![line("step 2")],
            TaskStatus::Exited {
                exit: TaskExit::from_code(0),
            },
        ),
        Err(RuntimeError::ActorDied {
            actor: ACTOR,
            cause: DeathCause::Stopped,
        }),
    ];
    for answer in answers {
        let asked_at = Arc::clone(&asked_at);
        let mut answer = Some(answer);
        mock.expect_call()
            .with(eq(ACTOR), eq(Request::Poll))
            .times(1)
            .in_sequence(&mut order)
            .returning(move |_, _| {
                asked_at.lock().expect("unpoisoned").push(start.elapsed());
                answer.take().expect("answered once")
            });
    }

    let (runtime, events) = subscribe(mock).await;
    assert_eq!(
        drain(events).await,
        [
            ActorEvent::Task {
                event: line("step 1"),
                attempt: trainyard_runtime::AttemptNumber::default()
            },
            ActorEvent::Task {
                event: line("step 2"),
                attempt: trainyard_runtime::AttemptNumber::default()
            },
            ActorEvent::TaskExited {
                exit: TaskExit::from_code(0),
                attempt: trainyard_runtime::AttemptNumber::default()
            },
            ActorEvent::Died(DeathCause::Stopped),
        ]
    );
    assert_eq!(
        *asked_at.lock().expect("unpoisoned"),
        [INTERVAL, 2 * INTERVAL, 3 * INTERVAL]
    );
    drop(runtime);
}

#[tokio::test(start_paused = true)]
async fn a_poll_that_fails_ends_the_stream_with_the_cause_of_death_and_polling_stops() {
    let mut mock = poll_only();
    let node = NodeId::from("node-2");
    let cause = DeathCause::NodeLost { node };
    let answer = cause.clone();
    mock.expect_call()
        .with(eq(ACTOR), eq(Request::Poll))
        .times(1)
        .returning(move |actor, _| {
            Err(RuntimeError::ActorDied {
                actor,
                cause: answer.clone(),
            })
        });

    let (runtime, events) = subscribe(mock).await;
    // The stream ends only once the poller has let go of it, so polling has stopped.
    assert_eq!(drain(events).await, [ActorEvent::Died(cause)]);
    drop(runtime);
}

#[tokio::test(start_paused = true)]
async fn a_poll_answered_with_the_wrong_kind_of_response_ends_the_stream_as_unreachable() {
    let mut mock = poll_only();
    mock.expect_call()
        .with(eq(ACTOR), eq(Request::Poll))
        .times(1)
        .returning(|_, _| Ok(Response::Done));

    let (runtime, events) = subscribe(mock).await;
    let seen = drain(events).await;
    assert!(
        matches!(
            seen.as_slice(),
            [ActorEvent::Died(DeathCause::Unreachable { error })]
                if error == "actor-7 answered `poll` with an unexpected response"
        ),
        "{seen:?}"
    );
    drop(runtime);
}

#[tokio::test(start_paused = true)]
async fn a_runtime_that_pushes_its_events_is_never_polled() {
    let pushed = vec![
        ActorEvent::Task {
            event: line("hello"),
            attempt: trainyard_runtime::AttemptNumber::default(),
        },
        ActorEvent::TaskExited {
            exit: TaskExit::from_code(0),
            attempt: trainyard_runtime::AttemptNumber::default(),
        },
    ];
    let mut mock = MockActorRuntime::new();
    let stream_of = pushed.clone();
    mock.expect_task_events()
        .with(eq(ACTOR))
        .times(1)
        .returning(move |_| Ok(Some(stream::iter(stream_of.clone()).boxed())));
    let calls = count_calls(&mut mock);

    let (runtime, events) = subscribe(mock).await;
    assert_eq!(drain(events).await, pushed);
    tokio::time::sleep(10 * INTERVAL).await;
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    drop(runtime);
}

#[tokio::test(start_paused = true)]
async fn a_failed_subscription_is_passed_on_and_nothing_is_polled() {
    let mut mock = MockActorRuntime::new();
    mock.expect_task_events()
        .times(1)
        .returning(|actor| Err(RuntimeError::UnknownActor(actor)));
    let calls = count_calls(&mut mock);

    let runtime: Arc<dyn ActorRuntime> = Arc::new(mock);
    let result = events::subscribe(&runtime, ACTOR, INTERVAL).await;
    assert!(
        matches!(result, Err(RuntimeError::UnknownActor(ACTOR))),
        "{:?}",
        result.map(|_| "a stream")
    );
    tokio::time::sleep(10 * INTERVAL).await;
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn run_task_sends_the_task_and_returns_the_pid_of_the_started_task() {
    let command = TaskSpec::Command {
        program: "python".into(),
        args: vec!["train.py".into()],
        env: BTreeMap::new(),
    };
    let function = TaskSpec::Function {
        name: "train".into(),
        arg: serde_json::Value::Null,
        env: BTreeMap::new(),
    };
    let mut mock = MockActorRuntime::new();
    mock.expect_call()
        .with(
            eq(ACTOR),
            eq(Request::RunTask {
                attempt: AttemptNumber::default(),
                task: command.clone(),
            }),
        )
        .times(1)
        .returning(|_, _| Ok(Response::TaskStarted { pid: Some(4242) }));
    mock.expect_call()
        .with(
            eq(ACTOR),
            eq(Request::RunTask {
                attempt: AttemptNumber::default(),
                task: function.clone(),
            }),
        )
        .times(1)
        .returning(|_, _| Ok(Response::TaskStarted { pid: None }));

    assert_eq!(
        mock.run_task(ACTOR, command).await.expect("started"),
        Some(4242)
    );
    assert_eq!(mock.run_task(ACTOR, function).await.expect("started"), None);
}

#[tokio::test]
async fn each_typed_helper_sends_its_request_and_returns_the_answer() {
    let info = WorkerInfo {
        node_id: "n".into(),
        node_ip: "10.0.0.1".into(),
        interface: None,
        hostname: "h".into(),
        pid: 1,
        task_pid: None,
        accelerator_ids: BTreeMap::new(),
    };
    let vars = BTreeMap::from([("RANK".to_owned(), "0".to_owned())]);
    let idle = PollResult {
        events: vec![line("ready")],
        status: TaskStatus::Idle,
        attempt: None,
    };
    let mut mock = MockActorRuntime::new();
    let answers = [
        (Request::NodeInfo, Response::NodeInfo(info.clone())),
        (Request::FindFreePort, Response::Port { port: 29_500 }),
        (Request::SetEnv { vars: vars.clone() }, Response::Done),
        (Request::Poll, Response::Poll(idle.clone())),
        (Request::Stop, Response::Done),
    ];
    for (request, response) in answers {
        mock.expect_call()
            .with(eq(ACTOR), eq(request))
            .times(1)
            .returning(move |_, _| Ok(response.clone()));
    }

    assert_eq!(mock.node_info(ACTOR).await.expect("info"), info);
    assert_eq!(mock.find_free_port(ACTOR).await.expect("port"), 29_500);
    mock.set_env(ACTOR, vars).await.expect("set");
    assert_eq!(mock.poll(ACTOR).await.expect("polled"), idle);
    mock.stop(ACTOR).await.expect("stopped");
}

#[tokio::test]
async fn an_answer_of_the_wrong_kind_is_an_unexpected_response_naming_actor_and_request() {
    let mut mock = MockActorRuntime::new();
    mock.expect_call()
        .times(6)
        .returning(|_, request| match request {
            Request::SetEnv { .. } | Request::Stop => Ok(Response::Port { port: 1 }),
            _ => Ok(Response::Done),
        });
    let task = TaskSpec::Function {
        name: "train".into(),
        arg: serde_json::Value::Null,
        env: BTreeMap::new(),
    };

    let errors = [
        mock.node_info(ACTOR).await.map(drop),
        mock.find_free_port(ACTOR).await.map(drop),
        mock.set_env(ACTOR, BTreeMap::new()).await,
        mock.run_task(ACTOR, task).await.map(drop),
        mock.poll(ACTOR).await.map(drop),
        mock.stop(ACTOR).await,
    ];
    let named: Vec<_> = errors
        .into_iter()
        .map(|result| match result {
            Err(RuntimeError::UnexpectedResponse { actor, request }) => Some((actor, request)),
            _ => None,
        })
        .collect();
    let expected = [
        "node_info",
        "find_free_port",
        "set_env",
        "run_task",
        "poll",
        "stop",
    ]
    .map(|request| Some((ACTOR, request)));
    assert_eq!(named, expected);
}

#[tokio::test]
async fn a_failed_call_reaches_the_caller_of_a_typed_helper_unchanged() {
    let mut mock = MockActorRuntime::new();
    mock.expect_call().times(1).returning(|actor, _| {
        Err(RuntimeError::ActorDied {
            actor,
            cause: DeathCause::Killed,
        })
    });
    let task = TaskSpec::Command {
        program: "true".into(),
        args: Vec::new(),
        env: BTreeMap::new(),
    };
    let err = mock.run_task(ACTOR, task).await.unwrap_err();
    assert!(
        matches!(
            &err,
            RuntimeError::ActorDied {
                actor: ACTOR,
                cause: DeathCause::Killed
            }
        ),
        "{err}"
    );
    assert!(err.is_actor_death());
}
