//! The driver⇄agent protocol: length-delimited frames (tokio-util) holding JSON messages.
//!
//! A connection starts with a handshake in which each side proves that it holds the run's
//! secret ([`Token`](crate::token::Token)) without sending it ([`crate::auth`]):
//!
//! 1. the agent connects and sends [`AgentMessage::Hello`]: the protocol, its actor and pid,
//!    and a fresh nonce;
//! 2. the driver answers only a hello for an actor it waits for, with
//!    [`DriverMessage::Challenge`]: a nonce of its own and its proof over both nonces;
//! 3. the agent checks the driver's proof (and, when it does not check, exits without
//!    running anything that peer sends), then sends [`AgentMessage::Proof`], its own;
//! 4. the driver checks it, and only then takes the connection as the actor's.
//!
//! A recorded hello or proof is worth nothing on another connection: the other side's nonce
//! is new each time. Until the handshake is done, frames are limited to
//! [`HELLO_FRAME_LIMIT`] bytes, so an unauthenticated peer cannot make either side allocate;
//! after it, to [`FRAME_LIMIT`]. From then on every frame is sealed ([`crate::seal`]) with
//! a key that only the two ends of this connection can derive, so a frame that either did not
//! send, or that was altered, replayed or reordered on the way, ends the connection: whoever
//! can intercept the connection cannot run anything on the agent. Payloads are not encrypted:
//! whoever sees the traffic reads the requests and events, but never the secret.
//!
//! Then the driver sends [`DriverMessage::Request`]s and the agent answers each with an
//! [`AgentMessage::Reply`] carrying the same id, and pushes task events
//! ([`AgentMessage::Event`], [`AgentMessage::TaskExited`]) as they happen, each with the
//! attempt of the task it is about, so that the driver refuses one of an attempt that has
//! ended (fencing). Errors travel as data ([`WireError`]), never as text to be parsed.
//!
//! Each side says it is alive while it has nothing else to say ([`AgentMessage::Heartbeat`],
//! [`DriverMessage::Heartbeat`]): the driver kills an agent that falls silent, and an agent
//! that hears nothing from its driver for
//! [`AgentConfig::driver_lost_ms`](crate::config::AgentConfig::driver_lost_ms) stops its task
//! and exits, as it does at once when the connection ends.
//!
//! Replies and events share the connection, so events are flow-controlled and replies are
//! not: the agent sends an event only while it holds credit, which the driver grants
//! ([`DriverMessage::Credit`]) as it passes events on. The driver therefore always reads
//! the connection, a reply never waits behind events a slow reader has not taken yet, and
//! the driver buffers at most the credit it granted.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::bytes::Bytes;
use tokio_util::codec::Framed;
use trainyard_runtime::{
    ActorId, AttemptNumber, Request, Response, TaskEvent, TaskExit, TaskRejection,
};

use crate::auth::Proof;
use crate::seal::{FrameCodec, SessionKey};
use crate::token::{Nonce, Role};

/// The protocol version both sides must speak.
pub const PROTOCOL: u32 = 5;

/// The largest frame accepted before the handshake is done.
pub const HELLO_FRAME_LIMIT: usize = 4 * 1024;

/// The largest frame accepted after it.
pub const FRAME_LIMIT: usize = 16 * 1024 * 1024;

/// A message from the driver to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum DriverMessage {
    /// The answer to a hello: the driver's nonce, and its proof that it holds the run's
    /// secret (see [`crate::auth`]).
    Challenge {
        /// The driver's fresh nonce, which the agent's proof covers.
        nonce: Nonce,
        /// The driver's proof over both nonces, the actor and the agent's pid.
        proof: Proof,
    },
    /// A request to answer with [`AgentMessage::Reply`] of the same `id`.
    Request {
        /// Matches the reply to the request.
        id: u64,
        /// What to do.
        request: Request,
    },
    /// Room for `events` more events ([`AgentMessage::Event`] or [`AgentMessage::TaskExited`])
    /// and `bytes` more bytes of their frames: the agent starts with none and sends an event
    /// only while it holds credit of both (the event it sends may take its byte credit below
    /// zero, so the driver holds at most the bytes it granted and one frame more).
    Credit {
        /// How many events.
        events: u32,
        /// How many bytes of frames.
        bytes: u64,
    },
    /// The driver is alive; sent every
    /// [`AgentConfig::heartbeat_ms`](crate::config::AgentConfig::heartbeat_ms) while nothing
    /// else is, so that an agent tells a driver it cannot hear from one that has nothing to say.
    Heartbeat,
}

/// A message from an agent to the driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum AgentMessage {
    /// The first message: who is connecting, and its challenge to the driver.
    Hello {
        /// [`PROTOCOL`].
        protocol: u32,
        /// The actor this agent serves.
        actor: ActorId,
        /// The agent's process id.
        pid: u32,
        /// The agent's fresh nonce, which the driver's proof covers.
        nonce: Nonce,
    },
    /// The answer to [`DriverMessage::Challenge`]: the agent's proof that it holds the run's
    /// secret (see [`crate::auth`]).
    Proof {
        /// The agent's proof over both nonces, the actor and its pid.
        proof: Proof,
    },
    /// The answer to a request.
    Reply {
        /// The request's id.
        id: u64,
        /// The answer, or why there is none.
        result: Result<Response, WireError>,
    },
    /// Something the running task produced.
    Event {
        /// The attempt of the task that produced it.
        attempt: AttemptNumber,
        /// What.
        event: TaskEvent,
    },
    /// The task ended.
    TaskExited {
        /// The attempt of the task that ended.
        attempt: AttemptNumber,
        /// How.
        exit: TaskExit,
    },
    /// The agent is alive; sent every [`AgentConfig::heartbeat_ms`](crate::config::AgentConfig::heartbeat_ms)
    /// while nothing else is, so that the driver tells a hung agent from a quiet one.
    Heartbeat,
}

/// Why an agent could not answer a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WireError {
    /// The task was refused.
    #[error("the task was refused: {rejection}")]
    TaskRejected {
        /// Why.
        rejection: TaskRejection,
    },
    /// The agent does not serve this request.
    #[error("`{request}` is not served: {reason}")]
    Unsupported {
        /// The request's name.
        request: String,
        /// Why.
        reason: String,
    },
}

/// A connection's frames: see [`framed`].
pub type Link<T> = Framed<T, FrameCodec>;

/// Frames over `io`, limited to [`HELLO_FRAME_LIMIT`] and not sealed until [`authenticated`].
pub fn framed<T: AsyncRead + AsyncWrite>(io: T) -> Link<T> {
    Framed::new(io, FrameCodec::new(HELLO_FRAME_LIMIT))
}

/// Once the peer has proved it holds the secret: seals every frame from now on under the
/// connection's `key` ([`crate::auth::Handshake::session_key`]), this end speaking as `role`,
/// and raises the frame limit to [`FRAME_LIMIT`].
pub fn authenticated<T>(framed: &mut Link<T>, key: &SessionKey, role: Role) {
    framed.codec_mut().seal(key, role, FRAME_LIMIT);
}

/// A message as one frame.
///
/// # Errors
/// When the message cannot be serialised (it always can: wire types are plain data).
pub fn encode<M: Serialize>(message: &M) -> Result<Bytes, serde_json::Error> {
    serde_json::to_vec(message).map(Bytes::from)
}

/// A frame as a message.
///
/// # Errors
/// When the frame is not a message of this protocol.
pub fn decode<'a, M: Deserialize<'a>>(frame: &'a [u8]) -> Result<M, serde_json::Error> {
    serde_json::from_slice(frame)
}

#[cfg(test)]
mod tests {
    use futures::{SinkExt, StreamExt};
    use tokio_util::codec::LengthDelimitedCodec;

    use super::*;
    use crate::token::Token;

    #[test]
    fn replies_carry_errors_as_data() {
        let reply = AgentMessage::Reply {
            id: 3,
            result: Err(WireError::TaskRejected {
                rejection: TaskRejection::ProgramNotFound {
                    program: "pyhton".into(),
                },
            }),
        };
        let frame = encode(&reply).expect("encode");
        assert_eq!(decode::<AgentMessage>(&frame).expect("decode"), reply);
        assert!(decode::<AgentMessage>(b"{\"message\":\"nonsense\"}").is_err());
    }

    #[test]
    fn handshake_messages_round_trip_in_a_hello_frame_and_carry_no_secret() {
        let token = Token::random().expect("randomness");
        let handshake = crate::auth::Handshake {
            agent_nonce: Nonce::random().expect("randomness"),
            driver_nonce: Nonce::random().expect("randomness"),
            actor: ActorId(u64::MAX),
            pid: u32::MAX,
        };
        let hello = AgentMessage::Hello {
            protocol: PROTOCOL,
            actor: handshake.actor,
            pid: handshake.pid,
            nonce: handshake.agent_nonce,
        };
        let challenge = DriverMessage::Challenge {
            nonce: handshake.driver_nonce,
            proof: handshake.prove(&token, Role::Driver),
        };
        let proof = AgentMessage::Proof {
            proof: handshake.prove(&token, Role::Agent),
        };
        for frame in [
            encode(&hello).expect("encode"),
            encode(&challenge).expect("encode"),
            encode(&proof).expect("encode"),
        ] {
            assert!(frame.len() <= HELLO_FRAME_LIMIT, "{}", frame.len());
            let text = String::from_utf8_lossy(&frame);
            assert!(!text.contains(&token.to_hex()), "{text}");
        }
        let frame = encode(&hello).expect("encode");
        assert_eq!(decode::<AgentMessage>(&frame).expect("decode"), hello);
        let frame = encode(&challenge).expect("encode");
        assert_eq!(decode::<DriverMessage>(&frame).expect("decode"), challenge);
        let frame = encode(&proof).expect("encode");
        assert_eq!(decode::<AgentMessage>(&frame).expect("decode"), proof);
        // A hello of the previous protocol, with its token and no nonce, is no hello now.
        let old = format!(
            "{{\"message\":\"hello\",\"protocol\":3,\"token\":\"{}\",\"actor\":0,\"pid\":1}}",
            token.to_hex()
        );
        assert!(decode::<AgentMessage>(old.as_bytes()).is_err());
    }

    #[tokio::test]
    async fn a_frame_over_the_hello_limit_is_refused_before_authentication() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let mut sender = LengthDelimitedCodec::builder().new_framed(a);
        let mut receiver = framed(b);
        sender
            .send(Bytes::from(vec![b'x'; HELLO_FRAME_LIMIT + 1]))
            .await
            .expect("send");
        let next = receiver.next().await.expect("an item");
        assert!(next.is_err(), "an oversized frame must be an error");
    }
}
