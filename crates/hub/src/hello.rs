//! The first frame of a connection: who the peer says it is, checked before anything else
//! is read from it.

use std::io;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use trainyard_agent::wire::{self, AgentMessage, Token};
use trainyard_runtime::ActorId;

/// How long a peer may take to send its hello.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A hello whose protocol and token are right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The actor the agent serves.
    pub(crate) actor: ActorId,
    /// The agent's process id.
    pub(crate) pid: u32,
}

/// Why a connection was dropped before it was handed to an actor. Never holds the token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HelloError {
    #[error("no hello within {0:?}")]
    Timeout(Duration),
    #[error("the connection closed before the hello")]
    Closed,
    #[error("the first frame cannot be read")]
    Frame(#[source] io::Error),
    #[error("the first frame is not a message of this protocol")]
    Malformed(#[source] serde_json::Error),
    #[error("the first message is not a hello")]
    NotHello,
    #[error("the hello speaks protocol {got}, the driver speaks {expected}")]
    Protocol { got: u32, expected: u32 },
    #[error("the hello for {actor} (pid {pid}) carries a wrong token")]
    Token { actor: ActorId, pid: u32 },
    #[error("no agent for {actor} is waiting to connect (hello from pid {pid})")]
    NotWaiting { actor: ActorId, pid: u32 },
}

/// Checks the first frame: a [`AgentMessage::Hello`] of [`wire::PROTOCOL`] carrying `token`.
pub(crate) fn check_hello(frame: &[u8], token: &Token) -> Result<Hello, HelloError> {
    let message: AgentMessage = wire::decode(frame).map_err(HelloError::Malformed)?;
    let AgentMessage::Hello {
        protocol,
        token: presented,
        actor,
        pid,
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
    if !token.matches(&presented) {
        return Err(HelloError::Token { actor, pid });
    }
    Ok(Hello { actor, pid })
}

/// Reads and checks the first frame within `limit`.
pub(crate) async fn read_hello<T>(
    framed: &mut Framed<T, LengthDelimitedCodec>,
    token: &Token,
    limit: Duration,
) -> Result<Hello, HelloError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(limit, framed.next()).await {
        Err(_) => Err(HelloError::Timeout(limit)),
        Ok(None) => Err(HelloError::Closed),
        Ok(Some(Err(error))) => Err(HelloError::Frame(error)),
        Ok(Some(Ok(frame))) => check_hello(&frame, token),
    }
}

#[cfg(test)]
mod tests {
    use futures::SinkExt as _;
    use tokio_util::bytes::Bytes;
    use trainyard_runtime::Response;

    use super::*;

    fn token() -> Token {
        Token::random().expect("randomness")
    }

    fn hello(protocol: u32, token: &Token) -> Vec<u8> {
        let message = AgentMessage::Hello {
            protocol,
            token: token.to_hex(),
            actor: ActorId(3),
            pid: 77,
        };
        wire::encode(&message).expect("encode").to_vec()
    }

    #[test]
    fn a_hello_with_the_run_token_names_its_actor_and_pid() {
        let token = token();
        let hello = check_hello(&hello(wire::PROTOCOL, &token), &token).expect("accepted");
        assert_eq!(
            hello,
            Hello {
                actor: ActorId(3),
                pid: 77
            }
        );
    }

    #[test]
    fn a_wrong_token_is_refused_and_not_repeated_in_the_error() {
        let token = token();
        let other = self::token();
        let error = check_hello(&hello(wire::PROTOCOL, &other), &token).expect_err("refused");
        assert!(matches!(error, HelloError::Token { actor, pid: 77 } if actor == ActorId(3)));
        let text = error.to_string();
        assert!(!text.contains(&other.to_hex()) && !text.contains(&token.to_hex()));
    }

    #[test]
    fn another_protocol_garbage_and_other_messages_are_refused() {
        let token = token();
        assert!(matches!(
            check_hello(&hello(wire::PROTOCOL + 1, &token), &token),
            Err(HelloError::Protocol { got, .. }) if got == wire::PROTOCOL + 1
        ));
        assert!(matches!(
            check_hello(b"\x00\xffnot json", &token),
            Err(HelloError::Malformed(_))
        ));
        let reply = AgentMessage::Reply {
            id: 1,
            result: Ok(Response::Done),
        };
        let frame = wire::encode(&reply).expect("encode");
        assert!(matches!(
            check_hello(&frame, &token),
            Err(HelloError::NotHello)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_and_an_oversized_frame_is_an_error() {
        let token = token();
        let (_peer, ours) = tokio::io::duplex(64);
        let mut framed = wire::framed(ours);
        let silent = read_hello(&mut framed, &token, HELLO_TIMEOUT).await;
        assert!(matches!(silent, Err(HelloError::Timeout(_))));

        let (peer, ours) = tokio::io::duplex(64 * 1024);
        let mut sender = LengthDelimitedCodec::builder().new_framed(peer);
        sender
            .send(Bytes::from(vec![b'{'; wire::HELLO_FRAME_LIMIT + 1]))
            .await
            .expect("send");
        let mut framed = wire::framed(ours);
        let big = read_hello(&mut framed, &token, HELLO_TIMEOUT).await;
        assert!(matches!(big, Err(HelloError::Frame(_))), "{big:?}");

        let (peer, ours) = tokio::io::duplex(64);
        drop(peer);
        let mut framed = wire::framed(ours);
        let closed = read_hello(&mut framed, &token, HELLO_TIMEOUT).await;
        assert!(matches!(closed, Err(HelloError::Closed)));
    }
}
