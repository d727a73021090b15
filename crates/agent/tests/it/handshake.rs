//! The agent's side of the handshake, as a process: it runs nothing for a driver that cannot
//! prove it holds the run's secret, nor for one that replays another connection's challenge.
//! The agent is this test binary, started again to run only [`agent_entry`].

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
use tokio::time::timeout;
use tokio_util::bytes::BytesMut;
use trainyard_runtime::{ActorId, FunctionRegistry, Request, TaskSpec};
use trainyard_wire::auth::Handshake;
use trainyard_wire::config::AGENT_FAILED;
use trainyard_wire::testing;
use trainyard_wire::token::{Nonce, Role, Token};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage};

/// The bound of every test.
const TEST_LIMIT: Duration = Duration::from_secs(120);
/// The bound of one wait for the agent.
const WAIT: Duration = Duration::from_secs(30);
/// The actor the agents of these tests serve.
const ACTOR: ActorId = ActorId(5);

type Link = wire::Link<TcpStream>;

/// Serves as an agent when started by a test of this file, exiting with its own code;
/// does nothing otherwise.
/// The full name of [`agent_entry`] in this binary, as `--exact` takes it.
const AGENT_ENTRY: &str = "handshake::agent_entry";

#[test]
fn agent_entry() {
    if let Some(code) = trainyard_agent::run_if_agent(FunctionRegistry::new()) {
        std::process::exit(if code == ExitCode::SUCCESS {
            0
        } else if code == ExitCode::from(AGENT_FAILED) {
            i32::from(AGENT_FAILED)
        } else {
            1
        });
    }
}

/// Starts this binary as an agent that connects to `listener`, holding `token`; returns it
/// and its connection, its hello read.
async fn start_agent(listener: &TcpListener, token: &Token) -> (Child, Link, u32, Nonce) {
    let driver = listener.local_addr().expect("an address").to_string();
    let config = testing::local_agent_config(driver, ACTOR);
    let agent = testing::start_agent(AGENT_ENTRY, &config, token, Stdio::piped()).await;
    let (socket, _) = timeout(WAIT, listener.accept())
        .await
        .expect("the agent connects in time")
        .expect("accepted");
    let mut link = wire::framed(socket);
    let frame = next(&mut link).await.expect("a hello");
    let AgentMessage::Hello {
        protocol,
        actor,
        pid,
        nonce,
    } = wire::decode(&frame).expect("an agent message")
    else {
        panic!("the agent did not say hello first");
    };
    assert_eq!((protocol, actor), (wire::PROTOCOL, ACTOR));
    assert!(
        !String::from_utf8_lossy(&frame).contains(&token.to_hex()),
        "the hello carries the secret"
    );
    (agent, link, pid, nonce)
}

/// The next frame the agent sends, or `None` once it closed the connection.
async fn next(link: &mut Link) -> Option<BytesMut> {
    timeout(WAIT, link.next())
        .await
        .expect("the agent speaks or hangs up in time")
        .and_then(Result::ok)
}

async fn send(link: &mut Link, message: &DriverMessage) {
    let frame = wire::encode(message).expect("encodable");
    // The agent may be gone already: that is what some tests expect.
    let _ = link.send(frame).await;
}

/// Sends what a fake driver would run on the agent: credit and a task that leaves `marker`.
async fn try_to_run(link: &mut Link, marker: &Path) {
    send(
        link,
        &DriverMessage::Credit {
            events: 1_000,
            bytes: 1 << 30,
        },
    )
    .await;
    let task = TaskSpec::Command {
        program: "touch".to_owned(),
        args: vec![marker.display().to_string()],
        env: BTreeMap::new(),
    };
    let request = DriverMessage::Request {
        id: 1,
        request: Request::RunTask {
            attempt: trainyard_runtime::AttemptNumber::default(),
            task,
        },
    };
    send(link, &request).await;
}

/// Waits for `agent` to exit after it refused its driver: its code, and what it said on
/// stderr; and checks that it sent nothing more on `link` (no proof, no reply).
async fn refused(mut agent: Child, mut link: Link) -> (Option<i32>, String) {
    if let Some(frame) = next(&mut link).await {
        let message: AgentMessage = wire::decode(&frame).expect("an agent message");
        panic!("the agent answered a driver that did not prove itself: {message:?}");
    }
    let status = timeout(WAIT, agent.wait())
        .await
        .expect("the agent exits in time")
        .expect("waited");
    let mut stderr = String::new();
    agent
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("stderr is read");
    (status.code(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_a_driver_that_does_not_hold_the_secret_and_runs_nothing() {
    let test = async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let token = Token::random().expect("randomness");
        let (agent, mut link, pid, nonce) = start_agent(&listener, &token).await;
        // A driver that saw the hello but holds another secret.
        let handshake = Handshake {
            agent_nonce: nonce,
            driver_nonce: Nonce::random().expect("randomness"),
            actor: ACTOR,
            pid,
        };
        let guess = Token::random().expect("randomness");
        let challenge = DriverMessage::Challenge {
            nonce: handshake.driver_nonce,
            proof: handshake.prove(&guess, Role::Driver),
        };
        send(&mut link, &challenge).await;
        let dir = tempfile::tempdir().expect("a temp dir");
        let marker = dir.path().join("ran");
        try_to_run(&mut link, &marker).await;

        let (code, stderr) = refused(agent, link).await;
        assert_eq!(code, Some(i32::from(AGENT_FAILED)), "{stderr}");
        let address = listener.local_addr().expect("an address");
        assert!(
            stderr.contains(&format!(
                "the driver at {address} could not prove it holds the run's secret"
            )),
            "{stderr}"
        );
        assert!(!stderr.contains(&token.to_hex()), "{stderr}");
        assert!(!marker.exists(), "the agent ran the fake driver's task");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_a_challenge_replayed_from_another_connection() {
    let test = async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let token = Token::random().expect("randomness");

        // A real driver's challenge to one agent, recorded as it went.
        let (first, mut first_link, pid, nonce) = start_agent(&listener, &token).await;
        let handshake = Handshake {
            agent_nonce: nonce,
            driver_nonce: Nonce::random().expect("randomness"),
            actor: ACTOR,
            pid,
        };
        let challenge = DriverMessage::Challenge {
            nonce: handshake.driver_nonce,
            proof: handshake.prove(&token, Role::Driver),
        };
        send(&mut first_link, &challenge).await;
        let frame = next(&mut first_link).await.expect("the agent's proof");
        let AgentMessage::Proof { proof } = wire::decode(&frame).expect("an agent message") else {
            panic!("the agent did not answer a true challenge with its proof");
        };
        handshake
            .verify(&token, Role::Agent, &proof)
            .expect("the agent holds the secret");
        drop((first_link, first));

        // The same challenge, replayed to another agent of the same run and actor.
        let (second, mut link, _, _) = start_agent(&listener, &token).await;
        send(&mut link, &challenge).await;
        let dir = tempfile::tempdir().expect("a temp dir");
        let marker = dir.path().join("ran");
        try_to_run(&mut link, &marker).await;
        let (code, stderr) = refused(second, link).await;
        assert_eq!(code, Some(i32::from(AGENT_FAILED)), "{stderr}");
        assert!(
            stderr.contains("could not prove it holds the run's secret"),
            "{stderr}"
        );
        assert!(!marker.exists(), "the agent ran the replayed driver's task");
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_nothing_that_a_relay_of_its_true_handshake_injects() {
    let test = async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let token = Token::random().expect("randomness");
        let dir = tempfile::tempdir().expect("a temp dir");
        // Once with frames sealed under the connection's key, as the driver sends them; once
        // without, as whoever relayed the true handshake but cannot know that key would.
        for sealed in [true, false] {
            let (agent, mut link, pid, nonce) = start_agent(&listener, &token).await;
            let handshake = Handshake {
                agent_nonce: nonce,
                driver_nonce: Nonce::random().expect("randomness"),
                actor: ACTOR,
                pid,
            };
            let challenge = DriverMessage::Challenge {
                nonce: handshake.driver_nonce,
                proof: handshake.prove(&token, Role::Driver),
            };
            send(&mut link, &challenge).await;
            let frame = next(&mut link).await.expect("the agent's proof");
            assert!(matches!(
                wire::decode(&frame).expect("an agent message"),
                AgentMessage::Proof { .. }
            ));
            if sealed {
                wire::authenticated(&mut link, &handshake.session_key(&token), Role::Driver);
            }
            let marker = dir.path().join(format!("ran-{sealed}"));
            try_to_run(&mut link, &marker).await;
            if sealed {
                let deadline = tokio::time::Instant::now() + WAIT;
                while !marker.exists() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert!(marker.exists(), "the driver's own sealed task did not run");
                drop((link, agent));
                continue;
            }
            // The agent hangs up on the first frame that fails its seal.
            while next(&mut link).await.is_some() {}
            let mut agent = agent;
            timeout(WAIT, agent.wait())
                .await
                .expect("the agent exits in time")
                .expect("waited");
            let mut stderr = String::new();
            let mut pipe = agent.stderr.take().expect("piped stderr");
            pipe.read_to_string(&mut stderr)
                .await
                .expect("stderr is read");
            assert!(stderr.contains("integrity check"), "{stderr}");
            assert!(
                !marker.exists(),
                "the agent ran a task its driver did not seal"
            );
        }
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
}
