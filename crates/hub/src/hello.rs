//! The driver's side of a connection's handshake (see `trainyard_wire::wire`): the agent's
//! hello, the driver's challenge and the agent's proof, checked before anything else is read
//! from the connection. Each side proves that it holds the run's secret without sending it,
//! so that a recorded handshake is worth nothing on another connection.

use std::io;
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::bytes::BytesMut;
use trainyard_runtime::ActorId;
use trainyard_wire::auth::Handshake;
use trainyard_wire::seal::SessionKey;
use trainyard_wire::token::{Nonce, Role, Token};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage};

/// An agent's authenticated connection.
pub(crate) type Link = wire::Link<TcpStream>;

/// A connection whose hello named a waiting actor.
#[derive(Debug)]
pub(crate) struct Connection {
    /// The framed connection, past its hello.
    pub(crate) link: Link,
    /// The pid the agent said it has.
    pub(crate) pid: u32,
}

/// How long a peer may take over the whole handshake, from its connection to its proof.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// An agent that proved it holds the run's secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The actor the agent serves.
    pub(crate) actor: ActorId,
    /// The agent's process id.
    pub(crate) pid: u32,
}

/// Why a connection was dropped before it was handed to an actor. Never holds the secret or
/// a proof.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HelloError {
    #[error("the handshake did not finish within {0:?}")]
    Timeout(Duration),
    #[error("the connection closed during the handshake")]
    Closed,
    #[error("a frame of the handshake cannot be read")]
    Frame(#[source] io::Error),
    #[error("a message of the handshake is not one of this protocol")]
    Malformed(#[source] serde_json::Error),
    #[error("the first message is not a hello")]
    NotHello,
    #[error("the hello speaks protocol {got}, the driver speaks {expected}")]
    Protocol { got: u32, expected: u32 },
    #[error("no agent for {actor} is waiting to connect (hello from pid {pid})")]
    NotWaiting { actor: ActorId, pid: u32 },
    #[error("there is no randomness for the driver's nonce")]
    Randomness(#[source] getrandom::Error),
    #[error("the challenge cannot be sent")]
    Send(#[source] io::Error),
    #[error("the answer to the challenge for {actor} (pid {pid}) is not a proof")]
    NotProof { actor: ActorId, pid: u32 },
    #[error("the agent for {actor} (pid {pid}) could not prove it holds the run's secret")]
    WrongProof { actor: ActorId, pid: u32 },
}

/// Checks the first frame: a [`AgentMessage::Hello`] of [`wire::PROTOCOL`]; returns who the
/// peer says it is and its nonce.
pub(crate) fn check_hello(frame: &[u8]) -> Result<(Hello, Nonce), HelloError> {
    let message: AgentMessage = wire::decode(frame).map_err(|error| {
        // A hello of another protocol has other fields: say which protocol it speaks.
        match other_protocol(frame) {
            Some(got) => HelloError::Protocol {
                got,
                expected: wire::PROTOCOL,
            },
            None => HelloError::Malformed(error),
        }
    })?;
    let AgentMessage::Hello {
        protocol,
        actor,
        pid,
        nonce,
    } = message
    else {
        return Err(HelloError::NotHello);
    };
    if protocol != wire::PROTOCOL {
        return Err(HelloError::Protocol {
            got: protocol,
            expected: wire::PROTOCOL,
        });
    }
    Ok((Hello { actor, pid }, nonce))
}

/// The protocol of a hello of another protocol than [`wire::PROTOCOL`], whatever else it
/// holds.
fn other_protocol(frame: &[u8]) -> Option<u32> {
    let message: serde_json::Value = serde_json::from_slice(frame).ok()?;
    if message.get("message")?.as_str()? != "hello" {
        return None;
    }
    let protocol = u32::try_from(message.get("protocol")?.as_u64()?).ok()?;
    (protocol != wire::PROTOCOL).then_some(protocol)
}

/// Checks the answer to the driver's challenge: an [`AgentMessage::Proof`] that the agent of
/// `handshake` holds `token`.
pub(crate) fn check_proof(
    frame: &[u8],
    handshake: &Handshake,
    token: &Token,
) -> Result<(), HelloError> {
    let (actor, pid) = (handshake.actor, handshake.pid);
    let message: AgentMessage = wire::decode(frame).map_err(HelloError::Malformed)?;
    let AgentMessage::Proof { proof } = message else {
        return Err(HelloError::NotProof { actor, pid });
    };
    handshake
        .verify(token, Role::Agent, &proof)
        .map_err(|_| HelloError::WrongProof { actor, pid })
}

/// The driver's side of the handshake, all within `limit`: reads the hello; answers one for
/// an actor that `waited_for` says is waited for with a challenge (a fresh nonce and the
/// driver's proof); checks the agent's proof. Deciding who gets the actor is the caller's:
/// nothing here claims it, so a hello that cannot prove itself takes nobody's place.
pub(crate) async fn authenticate<T>(
    framed: &mut wire::Link<T>,
    token: &Token,
    waited_for: impl Fn(ActorId) -> bool,
    limit: Duration,
) -> Result<(Hello, SessionKey), HelloError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    tokio::time::timeout(limit, steps(framed, token, waited_for))
        .await
        .unwrap_or(Err(HelloError::Timeout(limit)))
}

/// The steps of [`authenticate`], without its bound.
async fn steps<T>(
    framed: &mut wire::Link<T>,
    token: &Token,
    waited_for: impl Fn(ActorId) -> bool,
) -> Result<(Hello, SessionKey), HelloError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let (hello, agent_nonce) = check_hello(&next_frame(framed).await?)?;
    if !waited_for(hello.actor) {
        return Err(HelloError::NotWaiting {
            actor: hello.actor,
            pid: hello.pid,
        });
    }
    let handshake = Handshake {
        agent_nonce,
        driver_nonce: Nonce::random().map_err(HelloError::Randomness)?,
        actor: hello.actor,
        pid: hello.pid,
    };
    let challenge = DriverMessage::Challenge {
        nonce: handshake.driver_nonce,
        proof: handshake.prove(token, Role::Driver),
    };
    // Wire messages always serialise; the error is kept as a send error all the same.
    let frame = wire::encode(&challenge).map_err(|e| HelloError::Send(io::Error::other(e)))?;
    framed.send(frame).await.map_err(HelloError::Send)?;
    check_proof(&next_frame(framed).await?, &handshake, token)?;
    Ok((hello, handshake.session_key(token)))
}

/// The next frame of the handshake.
async fn next_frame<T>(framed: &mut wire::Link<T>) -> Result<BytesMut, HelloError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    match framed.next().await {
        None => Err(HelloError::Closed),
        Some(Err(error)) => Err(HelloError::Frame(error)),
        Some(Ok(frame)) => Ok(frame),
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::bytes::Bytes;
    use tokio_util::codec::LengthDelimitedCodec;
    use trainyard_runtime::Response;

    use super::*;

    fn token() -> Token {
        Token::random().expect("randomness")
    }

    fn nonce() -> Nonce {
        Nonce::random().expect("randomness")
    }

    fn hello(protocol: u32, nonce: Nonce) -> Bytes {
        let message = AgentMessage::Hello {
            protocol,
            actor: ActorId(3),
            pid: 77,
            nonce,
        };
        wire::encode(&message).expect("encode")
    }

    /// An agent's side of the handshake over `peer`, holding `token`; returns the driver's
    /// challenge as it came, and whether its proof checked.
    async fn agent(
        peer: tokio::io::DuplexStream,
        token: &Token,
    ) -> (wire::Link<tokio::io::DuplexStream>, bool) {
        let mut link = wire::framed(peer);
        let agent_nonce = nonce();
        link.send(hello(wire::PROTOCOL, agent_nonce))
            .await
            .expect("send");
        let frame = link.next().await.expect("a challenge").expect("a frame");
        let DriverMessage::Challenge { nonce, proof } = wire::decode(&frame).expect("decode")
        else {
            panic!("not a challenge");
        };
        let handshake = Handshake {
            agent_nonce,
            driver_nonce: nonce,
            actor: ActorId(3),
            pid: 77,
        };
        let checked = handshake.verify(token, Role::Driver, &proof).is_ok();
        let answer = AgentMessage::Proof {
            proof: handshake.prove(token, Role::Agent),
        };
        link.send(wire::encode(&answer).expect("encode"))
            .await
            .expect("send");
        (link, checked)
    }

    #[test]
    fn a_hello_names_its_actor_pid_and_nonce() {
        let sent = nonce();
        let (hello, nonce) = check_hello(&hello(wire::PROTOCOL, sent)).expect("accepted");
        assert_eq!(
            hello,
            Hello {
                actor: ActorId(3),
                pid: 77
            }
        );
        assert_eq!(nonce, sent);
    }

    #[test]
    fn another_protocol_garbage_and_other_messages_are_refused() {
        assert!(matches!(
            check_hello(&hello(wire::PROTOCOL + 1, nonce())),
            Err(HelloError::Protocol { got, .. }) if got == wire::PROTOCOL + 1
        ));
        // An agent of protocol 3 sent the token itself, and no nonce.
        let old = br#"{"message":"hello","protocol":3,"token":"00","actor":0,"pid":1}"#;
        assert!(matches!(
            check_hello(old),
            Err(HelloError::Protocol { got: 3, expected }) if expected == wire::PROTOCOL
        ));
        assert!(matches!(
            check_hello(b"\x00\xffnot json"),
            Err(HelloError::Malformed(_))
        ));
        let reply = AgentMessage::Reply {
            id: 1,
            result: Ok(Response::Done),
        };
        let frame = wire::encode(&reply).expect("encode");
        assert!(matches!(check_hello(&frame), Err(HelloError::NotHello)));
    }

    #[test]
    fn a_proof_under_another_secret_or_for_another_role_is_refused_without_showing_it() {
        let token = token();
        let handshake = Handshake {
            agent_nonce: nonce(),
            driver_nonce: nonce(),
            actor: ActorId(3),
            pid: 77,
        };
        let good = AgentMessage::Proof {
            proof: handshake.prove(&token, Role::Agent),
        };
        let frame = wire::encode(&good).expect("encode");
        check_proof(&frame, &handshake, &token).expect("the agent's own proof");
        let other = self::token();
        for (what, proof) in [
            ("another secret", handshake.prove(&other, Role::Agent)),
            ("the driver's proof", handshake.prove(&token, Role::Driver)),
        ] {
            let frame = wire::encode(&AgentMessage::Proof {
                proof: proof.clone(),
            })
            .expect("encode");
            let error = check_proof(&frame, &handshake, &token).expect_err(what);
            assert!(
                matches!(
                    error,
                    HelloError::WrongProof {
                        actor: ActorId(3),
                        pid: 77
                    }
                ),
                "{what}: {error:?}"
            );
            let text = format!("{error} {error:?}");
            for secret in [proof.to_hex(), token.to_hex(), other.to_hex()] {
                assert!(!text.contains(&secret[..16]), "{what}: {text}");
            }
        }
        let hello = hello(wire::PROTOCOL, nonce());
        assert!(matches!(
            check_proof(&hello, &handshake, &token),
            Err(HelloError::NotProof { .. })
        ));
    }

    #[tokio::test]
    async fn an_agent_holding_the_secret_and_the_driver_prove_themselves_to_each_other() {
        let token = token();
        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let mut framed = wire::framed(ours);
        let driver = authenticate(&mut framed, &token, |_| true, HELLO_TIMEOUT);
        let (hello, (_link, driver_proved)) = tokio::join!(driver, agent(peer, &token));
        assert_eq!(
            hello.expect("the agent proved itself").0,
            Hello {
                actor: ActorId(3),
                pid: 77
            }
        );
        assert!(driver_proved, "the driver's proof did not check");

        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let mut framed = wire::framed(ours);
        let driver = authenticate(&mut framed, &token, |_| true, HELLO_TIMEOUT);
        let other = self::token();
        let (hello, (_link, driver_proved)) = tokio::join!(driver, agent(peer, &other));
        assert!(matches!(hello, Err(HelloError::WrongProof { .. })));
        assert!(!driver_proved, "a driver with another secret proved itself");
    }

    #[tokio::test]
    async fn a_hello_for_an_actor_nobody_waits_for_gets_no_challenge() {
        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let mut framed = wire::framed(ours);
        let mut link = wire::framed(peer);
        link.send(hello(wire::PROTOCOL, nonce()))
            .await
            .expect("send");
        let refused = authenticate(&mut framed, &token(), |_| false, HELLO_TIMEOUT).await;
        assert!(
            matches!(
                refused,
                Err(HelloError::NotWaiting {
                    actor: ActorId(3),
                    pid: 77
                })
            ),
            "{refused:?}"
        );
        drop(framed);
        assert!(
            link.next().await.is_none(),
            "the driver answered a stranger"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_and_an_oversized_frame_is_an_error() {
        let token = token();
        let (_peer, ours) = tokio::io::duplex(64);
        let mut framed = wire::framed(ours);
        let silent = authenticate(&mut framed, &token, |_| true, HELLO_TIMEOUT).await;
        assert!(matches!(silent, Err(HelloError::Timeout(_))));

        // One that says hello and then nothing: the bound is over the whole handshake.
        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let mut link = wire::framed(peer);
        link.send(hello(wire::PROTOCOL, nonce()))
            .await
            .expect("send");
        let mut framed = wire::framed(ours);
        let stalled = authenticate(&mut framed, &token, |_| true, HELLO_TIMEOUT).await;
        assert!(
            matches!(stalled, Err(HelloError::Timeout(_))),
            "{stalled:?}"
        );

        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let mut sender = LengthDelimitedCodec::builder().new_framed(peer);
        sender
            .send(Bytes::from(vec![b'{'; wire::HELLO_FRAME_LIMIT + 1]))
            .await
            .expect("send");
        let mut framed = wire::framed(ours);
        let big = authenticate(&mut framed, &token, |_| true, HELLO_TIMEOUT).await;
        assert!(matches!(big, Err(HelloError::Frame(_))), "{big:?}");

        let (peer, ours) = tokio::io::duplex(64);
        drop(peer);
        let mut framed = wire::framed(ours);
        let closed = authenticate(&mut framed, &token, |_| true, HELLO_TIMEOUT).await;
        assert!(matches!(closed, Err(HelloError::Closed)));
    }
}
