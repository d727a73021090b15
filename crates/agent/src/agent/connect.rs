//! Reaching the driver: the connection, and the agent's side of the handshake in which each
//! side proves that it holds the run's secret.

use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use tokio::net::TcpStream;
use trainyard_resources::ErrorChain;
use trainyard_runtime::ActorId;
use trainyard_wire::auth::Handshake;
use trainyard_wire::config::AgentConfig;
use trainyard_wire::seal::SessionKey;
use trainyard_wire::token::{Nonce, Role, Token};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage};

/// How long the agent waits to reach the driver.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent gives the handshake with the driver, once connected.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause before a handshake is tried again, and the longest.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(1);

/// The agent's connection to the driver.
pub(super) type Link = wire::Link<TcpStream>;

/// Connects to the driver and goes through the handshake. A connection the driver closes
/// before its challenge (it makes room for newer ones while a flood of unproven connections
/// lasts) is tried again, after a pause that doubles from [`RETRY_FIRST`] to [`RETRY_MOST`],
/// until [`CONNECT_TIMEOUT`] has passed; any other failure is final. Nothing a peer sends is
/// run unless it proved itself.
pub(super) async fn connect(config: &AgentConfig, token: &Token) -> Result<Link, String> {
    let driver = &config.driver;
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    let mut pause = RETRY_FIRST;
    loop {
        let socket = match tokio::time::timeout_at(deadline, TcpStream::connect(driver)).await {
            Ok(Ok(socket)) => socket,
            Ok(Err(error)) => return Err(format!("cannot reach the driver at {driver}: {error}")),
            Err(_) => return Err(format!("the driver at {driver} did not answer")),
        };
        let _ = socket.set_nodelay(true);
        let mut framed = wire::framed(socket);
        let checked = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            handshake(&mut framed, config.actor, token),
        )
        .await
        .unwrap_or(Err(HandshakeError::Timeout(HANDSHAKE_TIMEOUT)));
        match checked {
            Ok(key) => {
                wire::authenticated(&mut framed, &key, Role::Agent);
                return Ok(framed);
            }
            Err(error)
                if error.is_retryable() && tokio::time::Instant::now() + pause < deadline =>
            {
                tracing::debug!(error = %ErrorChain(&error), "the handshake is tried again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MOST);
            }
            Err(error) => return Err(format!("the driver at {driver} {}", ErrorChain(&error))),
        }
    }
}

/// Why the handshake with the driver failed; each reads after "the driver at ADDR". Never
/// holds the secret or a proof.
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("cannot be greeted: there is no randomness for a nonce")]
    Randomness(#[source] getrandom::Error),
    #[error("cannot be written to")]
    Send(#[source] std::io::Error),
    #[error("did not finish the handshake within {0:?}")]
    Timeout(Duration),
    #[error("closed the connection during the handshake")]
    Closed,
    #[error("sent a frame that cannot be read")]
    Frame(#[source] std::io::Error),
    #[error(
        "answered the hello with something other than a challenge of protocol {}",
        wire::PROTOCOL
    )]
    NotChallenge(#[source] Option<serde_json::Error>),
    #[error("could not prove it holds the run's secret")]
    WrongProof,
}

impl HandshakeError {
    /// Whether the connection ended before the driver answered: a driver making room for
    /// newer connections does that, so a new connection may go through.
    fn is_retryable(&self) -> bool {
        match self {
            Self::Send(_) | Self::Closed | Self::Frame(_) => true,
            Self::Randomness(_) | Self::Timeout(_) | Self::NotChallenge(_) | Self::WrongProof => {
                false
            }
        }
    }
}

/// The agent's side of the handshake (see [`wire`]): says hello with a fresh nonce, checks
/// that the driver's challenge proves it holds `token`, and answers with the agent's proof.
async fn handshake(
    link: &mut Link,
    actor: ActorId,
    token: &Token,
) -> Result<SessionKey, HandshakeError> {
    let agent_nonce = Nonce::random().map_err(HandshakeError::Randomness)?;
    let pid = std::process::id();
    let hello = AgentMessage::Hello {
        protocol: wire::PROTOCOL,
        actor,
        pid,
        nonce: agent_nonce,
    };
    send_handshake(link, &hello).await?;
    let frame = match link.next().await {
        None => return Err(HandshakeError::Closed),
        Some(Err(error)) => return Err(HandshakeError::Frame(error)),
        Some(Ok(frame)) => frame,
    };
    let (driver_nonce, proof) = match wire::decode(&frame) {
        Ok(DriverMessage::Challenge { nonce, proof }) => (nonce, proof),
        Ok(_) => return Err(HandshakeError::NotChallenge(None)),
        Err(error) => return Err(HandshakeError::NotChallenge(Some(error))),
    };
    let handshake = Handshake {
        agent_nonce,
        driver_nonce,
        actor,
        pid,
    };
    handshake
        .verify(token, Role::Driver, &proof)
        .map_err(|_| HandshakeError::WrongProof)?;
    let proof = handshake.prove(token, Role::Agent);
    send_handshake(link, &AgentMessage::Proof { proof }).await?;
    Ok(handshake.session_key(token))
}

/// Sends one message of the handshake.
async fn send_handshake(link: &mut Link, message: &AgentMessage) -> Result<(), HandshakeError> {
    // Wire messages always serialise; the error is kept as a write error all the same.
    let frame = wire::encode(message)
        .map_err(|error| HandshakeError::Send(std::io::Error::other(error)))?;
    link.send(frame).await.map_err(HandshakeError::Send)
}
