//! The driver⇄agent protocol: length-delimited frames (tokio-util) holding JSON messages.
//!
//! The agent connects to the driver and sends [`AgentMessage::Hello`] with the run's token
//! first. Until the driver has checked it, frames are limited to [`HELLO_FRAME_LIMIT`] bytes,
//! so an unauthenticated peer cannot make the driver allocate; after it, to
//! [`FRAME_LIMIT`]. Then the driver sends [`DriverMessage::Request`]s and the agent answers
//! each with an [`AgentMessage::Reply`] carrying the same id, and pushes task events
//! ([`AgentMessage::Event`], [`AgentMessage::TaskExited`]) as they happen. Errors travel as
//! data ([`WireError`]), never as text to be parsed.
//!
//! Replies and events share the connection, so events are flow-controlled and replies are
//! not: the agent sends an event only while it holds credit, which the driver grants
//! ([`DriverMessage::Credit`]) as it passes events on. The driver therefore always reads
//! the connection, a reply never waits behind events a slow reader has not taken yet, and
//! the driver buffers at most the credit it granted.

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::bytes::Bytes;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use trainyard_runtime::{ActorId, Request, Response, TaskEvent, TaskExit, TaskRejection};

/// The protocol version both sides must speak.
pub const PROTOCOL: u32 = 3;

/// The largest frame accepted before the hello is checked.
pub const HELLO_FRAME_LIMIT: usize = 4 * 1024;

/// The largest frame accepted after it.
pub const FRAME_LIMIT: usize = 16 * 1024 * 1024;

/// The run's secret: 32 random bytes, handed to agents in their environment as hex.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; 32]);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A fresh random token.
    ///
    /// # Errors
    /// When the operating system has no randomness to give.
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        Ok(Self(bytes))
    }

    /// The token as 64 hex digits.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    #[must_use]
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut bytes).ok()?;
        Some(Self(bytes))
    }

    /// Whether `presented` (hex) is this token, compared in constant time.
    #[must_use]
    pub fn matches(&self, presented: &str) -> bool {
        Self::from_hex(presented).is_some_and(|other| bool::from(self.0.ct_eq(&other.0)))
    }
}

/// A message from the driver to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum DriverMessage {
    /// A request to answer with [`AgentMessage::Reply`] of the same `id`.
    Request {
        /// Matches the reply to the request.
        id: u64,
        /// What to do.
        request: Request,
    },
    /// Room for `events` more events ([`AgentMessage::Event`] or [`AgentMessage::TaskExited`]):
    /// the agent starts with none and sends an event only while it holds some.
    Credit {
        /// How many.
        events: u32,
    },
}

/// A message from an agent to the driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "message", rename_all = "snake_case")]
pub enum AgentMessage {
    /// The first message: who is connecting, and the run's token.
    Hello {
        /// [`PROTOCOL`].
        protocol: u32,
        /// The run's token, as hex.
        token: String,
        /// The actor this agent serves.
        actor: ActorId,
        /// The agent's process id.
        pid: u32,
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
        /// What.
        event: TaskEvent,
    },
    /// The task ended.
    TaskExited {
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

/// Frames over `io`, limited to [`HELLO_FRAME_LIMIT`] until [`authenticated`] raises it.
pub fn framed<T: AsyncRead + AsyncWrite>(io: T) -> Framed<T, LengthDelimitedCodec> {
    LengthDelimitedCodec::builder()
        .max_frame_length(HELLO_FRAME_LIMIT)
        .new_framed(io)
}

/// Raises the frame limit to [`FRAME_LIMIT`] once the peer is known.
pub fn authenticated<T>(framed: &mut Framed<T, LengthDelimitedCodec>) {
    framed.codec_mut().set_max_frame_length(FRAME_LIMIT);
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

    use super::*;

    #[test]
    fn tokens_match_only_themselves_and_never_show_in_debug() {
        let token = Token::random().expect("randomness");
        assert!(token.matches(&token.to_hex()));
        assert!(!token.matches(&Token::random().expect("randomness").to_hex()));
        assert!(!token.matches("short"));
        assert!(!token.matches(""));
        assert!(!format!("{token:?}").contains(&token.to_hex()[..8]));
    }

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
