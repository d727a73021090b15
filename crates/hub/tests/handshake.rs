//! The hub's side of the handshake against real connections: a recorded handshake replayed
//! on a new connection is refused and takes nobody's place, and of two connections that
//! prove the same actor only one gets it. The real agent is this test binary, started again
//! to run only [`agent_entry`].

use std::io;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
use tokio::sync::Notify;
use tokio::time::timeout;
use tokio_util::bytes::{Bytes, BytesMut};
use trainyard_hub::{AgentExit, AgentHub, AgentProcess, HubConfig};
use trainyard_runtime::{ActorId, FunctionRegistry, Request, Response};
use trainyard_wire::auth::Handshake;
use trainyard_wire::config::AgentConfig;
use trainyard_wire::testing;
use trainyard_wire::token::{Nonce, Role};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage};

/// The bound of every test.
const TEST_LIMIT: Duration = Duration::from_secs(120);
/// The bound of one wait for the hub or the agent.
const WAIT: Duration = Duration::from_secs(30);

type Link = wire::Link<TcpStream>;

/// Serves as an agent when started by a test of this file; does nothing otherwise.
/// The full name of [`agent_entry`] in this binary, as `--exact` takes it.
const AGENT_ENTRY: &str = "agent_entry";

#[test]
fn agent_entry() {
    if let Some(code) = trainyard_agent::run_if_agent(FunctionRegistry::new()) {
        std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
    }
}

/// A real agent process: this test binary, started as an agent.
struct ChildAgent(Child);

#[async_trait]
impl AgentProcess for ChildAgent {
    fn pid(&self) -> Option<u32> {
        self.0.id()
    }

    async fn wait(&mut self) -> io::Result<AgentExit> {
        self.0.wait().await.map(AgentExit::from)
    }

    fn terminate(&mut self) {
        let _ = self.0.start_kill();
    }

    fn kill(&mut self, _task: Option<trainyard_hub::TaskProcess>) {
        let _ = self.0.start_kill();
    }
}

/// An agent process the test plays itself, over connections of its own: it ends when it is
/// told to.
struct PlayedAgent(Arc<Notify>);

#[async_trait]
impl AgentProcess for PlayedAgent {
    fn pid(&self) -> Option<u32> {
        None
    }

    async fn wait(&mut self) -> io::Result<AgentExit> {
        self.0.notified().await;
        Ok(AgentExit::Signalled { signal: 9 })
    }

    fn terminate(&mut self) {
        self.0.notify_one();
    }

    fn kill(&mut self, _task: Option<trainyard_hub::TaskProcess>) {
        self.0.notify_one();
    }
}

/// Starts this binary as the agent of `actor`, connecting to `driver`, holding `hub`'s token.
async fn start_agent(hub: &AgentHub, actor: ActorId, driver: String) -> ChildAgent {
    let config = AgentConfig {
        heartbeat_ms: hub.config().heartbeat_ms(),
        driver_lost_ms: u64::try_from(hub.config().driver_lost.as_millis()).unwrap_or(u64::MAX),
        ..testing::local_agent_config(driver, actor)
    };
    ChildAgent(testing::start_agent(AGENT_ENTRY, &config, hub.token(), Stdio::inherit()).await)
}

async fn connect(hub: &AgentHub) -> Link {
    wire::framed(
        TcpStream::connect(hub.driver_address())
            .await
            .expect("the hub accepts"),
    )
}

/// The next frame on `link`, or `None` once the peer closed it (or broke it).
async fn next(link: &mut Link) -> Option<BytesMut> {
    timeout(WAIT, link.next())
        .await
        .expect("the peer answers or hangs up in time")
        .and_then(Result::ok)
}

fn challenge(frame: &[u8]) -> (Nonce, trainyard_wire::auth::Proof) {
    match wire::decode(frame).expect("a driver message") {
        DriverMessage::Challenge { nonce, proof } => (nonce, proof),
        other => panic!("expected a challenge, got {other:?}"),
    }
}

/// Forwards everything between `agent` and `driver` from now on, bytes already read
/// included.
fn pipe(agent: Link, driver: Link) {
    tokio::spawn(async move {
        let (mut agent, mut driver) = (agent.into_parts(), driver.into_parts());
        let (to_driver, to_agent) = (agent.read_buf.split(), driver.read_buf.split());
        if driver.io.write_all(&to_driver).await.is_err()
            || agent.io.write_all(&to_agent).await.is_err()
        {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut agent.io, &mut driver.io).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_hello_and_proof_are_refused_and_the_actor_still_waits_for_its_agent() {
    let hub = AgentHub::start(HubConfig::new("replay"), |_, _| {})
        .await
        .expect("the hub starts");
    let test = async {
        // The real agent connects through a proxy that records what it says.
        let proxy = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let arrival = hub.expect("worker-0").expect("an actor id");
        let actor = arrival.actor();
        let address = proxy.local_addr().expect("an address").to_string();
        let agent = start_agent(&hub, actor, address).await;
        let attached = {
            let hub = hub.clone();
            tokio::spawn(async move {
                hub.attach(arrival, "worker-0".to_owned(), Box::new(agent))
                    .await
            })
        };
        let (socket, _) = timeout(WAIT, proxy.accept())
            .await
            .expect("the agent connects in time")
            .expect("accepted");
        let mut from_agent = wire::framed(socket);
        let mut to_driver = connect(&hub).await;
        let hello = next(&mut from_agent).await.expect("the agent's hello");
        to_driver.send(hello.clone().freeze()).await.expect("sent");
        let first = next(&mut to_driver).await.expect("the driver's challenge");
        let (first_nonce, _) = challenge(&first);
        from_agent.send(first.freeze()).await.expect("sent");
        let proof = next(&mut from_agent).await.expect("the agent's proof");
        assert!(matches!(
            wire::decode(&proof).expect("an agent message"),
            AgentMessage::Proof { .. }
        ));

        // While the real handshake waits for its proof, both are replayed on a new
        // connection: the driver challenges afresh, and the recorded proof does not answer.
        let mut replay = connect(&hub).await;
        replay.send(hello.clone().freeze()).await.expect("sent");
        let second = next(&mut replay).await.expect("a challenge to the replay");
        let (second_nonce, _) = challenge(&second);
        assert_ne!(second_nonce, first_nonce, "the driver's nonce was reused");
        replay.send(proof.clone().freeze()).await.expect("sent");
        assert!(
            next(&mut replay).await.is_none(),
            "the hub kept a connection that replayed a recorded proof"
        );

        // The actor was not taken: the real agent's proof still gets it.
        to_driver.send(proof.clone().freeze()).await.expect("sent");
        pipe(from_agent, to_driver);
        let attached = timeout(WAIT, attached)
            .await
            .expect("the spawn ends in time")
            .expect("the spawn does not panic")
            .expect("the real agent is attached");
        assert_eq!(attached, actor);
        let info = hub.call(actor, Request::NodeInfo).await;
        assert!(
            matches!(info, Ok(Response::NodeInfo(_))),
            "the real agent does not answer: {info:?}"
        );

        // Once the actor is served, a replayed hello is not even answered.
        let mut late = connect(&hub).await;
        late.send(hello.freeze()).await.expect("sent");
        assert!(
            next(&mut late).await.is_none(),
            "the hub answered a hello for an actor it serves already"
        );
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    hub.shutdown().await;
}

/// Says hello for `actor` with pid `pid` over `link`; returns the handshake, once the
/// driver's challenge proved it holds `hub`'s token.
async fn hello(hub: &AgentHub, link: &mut Link, actor: ActorId, pid: u32) -> Handshake {
    let agent_nonce = Nonce::random().expect("randomness");
    let hello = AgentMessage::Hello {
        protocol: wire::PROTOCOL,
        actor,
        pid,
        nonce: agent_nonce,
    };
    link.send(wire::encode(&hello).expect("encodable"))
        .await
        .expect("sent");
    let (driver_nonce, proof) = challenge(&next(link).await.expect("a challenge"));
    let handshake = Handshake {
        agent_nonce,
        driver_nonce,
        actor,
        pid,
    };
    handshake
        .verify(hub.token(), Role::Driver, &proof)
        .expect("the driver proves it holds the token");
    handshake
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_connections_that_prove_the_same_actor_only_one_gets_it() {
    let hub = AgentHub::start(HubConfig::new("twins"), |_, _| {})
        .await
        .expect("the hub starts");
    let test = async {
        let arrival = hub.expect("worker-0").expect("an actor id");
        let actor = arrival.actor();
        let ended = Arc::new(Notify::new());
        let attached = {
            let (hub, process) = (hub.clone(), PlayedAgent(Arc::clone(&ended)));
            tokio::spawn(async move {
                hub.attach(arrival, "worker-0".to_owned(), Box::new(process))
                    .await
            })
        };
        let (mut one, mut two) = (connect(&hub).await, connect(&hub).await);
        let first = hello(&hub, &mut one, actor, 1).await;
        let second = hello(&hub, &mut two, actor, 2).await;
        for (link, handshake) in [(&mut one, &first), (&mut two, &second)] {
            let proof = handshake.prove(hub.token(), Role::Agent);
            let frame = wire::encode(&AgentMessage::Proof { proof }).expect("encodable");
            link.send(frame).await.expect("sent");
            wire::authenticated(link, &handshake.session_key(hub.token()), Role::Agent);
        }
        let (one, two) = tokio::join!(next(&mut one), next(&mut two));
        let served: Vec<Bytes> = [one, two]
            .into_iter()
            .flatten()
            .map(BytesMut::freeze)
            .collect();
        assert_eq!(served.len(), 1, "both or neither connection got the actor");
        assert!(matches!(
            wire::decode(&served[0]).expect("a driver message"),
            DriverMessage::Credit { .. }
        ));
        assert_eq!(
            timeout(WAIT, attached)
                .await
                .expect("the spawn ends in time")
                .expect("the spawn does not panic")
                .expect("the actor is attached"),
            actor
        );
        ended.notify_one();
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hubs_heartbeats_keep_an_agent_past_its_lost_driver_bound() {
    // The hub says it is alive every 100 ms; its agents give it up after 400 ms of silence.
    let config = HubConfig {
        heartbeat_timeout: Duration::from_millis(500),
        driver_lost: Duration::from_millis(400),
        ..HubConfig::new("heartbeats")
    };
    let hub = AgentHub::start(config, |_, _| {})
        .await
        .expect("the hub starts");
    let test = async {
        let arrival = hub.expect("worker-0").expect("an actor id");
        let actor = arrival.actor();
        let agent = start_agent(&hub, actor, hub.driver_address().to_string()).await;
        hub.attach(arrival, "worker-0".to_owned(), Box::new(agent))
            .await
            .expect("the agent is attached");
        let pid = match hub.call(actor, Request::NodeInfo).await {
            Ok(Response::NodeInfo(info)) => info.pid,
            other => panic!("no node info: {other:?}"),
        };
        // Ten of its bounds without a request: the hub's heartbeats alone keep it.
        tokio::time::sleep(Duration::from_secs(4)).await;
        match hub.call(actor, Request::NodeInfo).await {
            Ok(Response::NodeInfo(info)) => assert_eq!(info.pid, pid, "the same agent answers"),
            other => panic!("the agent is gone although its hub said it was alive: {other:?}"),
        }
    };
    timeout(TEST_LIMIT, test).await.expect("in time");
    hub.shutdown().await;
}
