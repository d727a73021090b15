//! The frames of an agent's connection: length-delimited, and after the handshake each one
//! sealed, so that nobody but the two ends of the connection can make a frame the other
//! end takes.
//!
//! Once both sides have proved they hold the run's secret ([`crate::auth`]), each derives
//! the connection's [`SessionKey`] from the secret and the handshake, and every frame then
//! carries, after its bytes, an HMAC-SHA256 tag under that key over its sender's role, its
//! number in that direction and its bytes:
//!
//! ```text
//! tag = HMAC(session key, "trainyard/4 driver frame" or "trainyard/4 agent frame" || number (u64 BE) || bytes)
//! ```
//!
//! A frame that was altered, made up, replayed, dropped from the middle or reordered fails its
//! check, and the connection ends. Frames are not encrypted: whoever sees the traffic reads
//! them.

use std::fmt;
use std::io;

use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;
use tokio_util::bytes::{Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::token::Role;

type HmacSha256 = Hmac<Sha256>;

/// How many bytes a frame's tag has.
pub const TAG_LEN: usize = 32;

/// The key that seals the frames of one connection, known only to its two ends: see the
/// [module docs](self). Never shown by `Debug`.
#[derive(Clone)]
pub struct SessionKey(pub(crate) [u8; 32]);

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

/// Length-delimited frames ([`LengthDelimitedCodec`]'s 4-byte big-endian length), sealed
/// once [`FrameCodec::seal`] was called.
#[derive(Debug)]
pub struct FrameCodec {
    frames: LengthDelimitedCodec,
    seal: Option<Seal>,
}

/// The state of a sealed connection at one end.
struct Seal {
    /// HMAC-SHA256 keyed with the session key, cloned for each frame.
    keyed: HmacSha256,
    /// The label of the frames this end sends, and of those it receives.
    sends: &'static [u8],
    receives: &'static [u8],
    /// How many frames went each way so far: the number of the next one.
    sent: u64,
    received: u64,
}

impl fmt::Debug for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Seal")
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// The label of the frames `role` sends.
const fn label(role: Role) -> &'static [u8] {
    match role {
        Role::Driver => b"trainyard/4 driver frame",
        Role::Agent => b"trainyard/4 agent frame",
    }
}

impl Seal {
    fn tag(&self, label: &[u8], number: u64, bytes: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(label);
        mac.update(&number.to_be_bytes());
        mac.update(bytes);
        mac
    }
}

impl FrameCodec {
    /// Frames of at most `limit` bytes, not sealed.
    #[must_use]
    pub fn new(limit: usize) -> Self {
        Self {
            frames: LengthDelimitedCodec::builder()
                .max_frame_length(limit)
                .new_codec(),
            seal: None,
        }
    }

    /// Seals every frame from now on under `key`, this end speaking as `role`, and allows
    /// frames of `limit` bytes (besides their tags).
    pub fn seal(&mut self, key: &SessionKey, role: Role, limit: usize) {
        let peer = match role {
            Role::Driver => Role::Agent,
            Role::Agent => Role::Driver,
        };
        // HMAC takes a key of any length: this never fails.
        let keyed = HmacSha256::new_from_slice(&key.0).expect("HMAC takes any key");
        self.seal = Some(Seal {
            keyed,
            sends: label(role),
            receives: label(peer),
            sent: 0,
            received: 0,
        });
        self.frames
            .set_max_frame_length(limit.saturating_add(TAG_LEN));
    }

    /// Whether frames are sealed.
    #[must_use]
    pub const fn is_sealed(&self) -> bool {
        self.seal.is_some()
    }
}

impl Decoder for FrameCodec {
    type Item = BytesMut;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> io::Result<Option<BytesMut>> {
        let Some(mut frame) = self.frames.decode(src)? else {
            return Ok(None);
        };
        let Some(seal) = &mut self.seal else {
            return Ok(Some(frame));
        };
        let Some(end) = frame.len().checked_sub(TAG_LEN) else {
            return Err(broken("a frame is shorter than its tag"));
        };
        let tag = frame.split_off(end);
        seal.tag(seal.receives, seal.received, &frame)
            .verify_slice(&tag)
            .map_err(|_| {
                broken(
                    "a frame failed its integrity check: the other end of this connection did \
                     not send it as it came",
                )
            })?;
        seal.received += 1;
        Ok(Some(frame))
    }
}

impl Encoder<Bytes> for FrameCodec {
    type Error = io::Error;

    fn encode(&mut self, item: Bytes, dst: &mut BytesMut) -> io::Result<()> {
        let Some(seal) = &mut self.seal else {
            return self.frames.encode(item, dst);
        };
        let tag = seal
            .tag(seal.sends, seal.sent, &item)
            .finalize()
            .into_bytes();
        let mut sealed = BytesMut::with_capacity(item.len() + TAG_LEN);
        sealed.extend_from_slice(&item);
        sealed.extend_from_slice(&tag);
        self.frames.encode(sealed.freeze(), dst)?;
        seal.sent += 1;
        Ok(())
    }
}

fn broken(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (FrameCodec, FrameCodec) {
        let key = SessionKey([7; 32]);
        let mut driver = FrameCodec::new(64);
        let mut agent = FrameCodec::new(64);
        driver.seal(&key, Role::Driver, 1024);
        agent.seal(&key, Role::Agent, 1024);
        (driver, agent)
    }

    fn sent(codec: &mut FrameCodec, bytes: &'static [u8]) -> BytesMut {
        let mut wire = BytesMut::new();
        codec
            .encode(Bytes::from_static(bytes), &mut wire)
            .expect("encode");
        wire
    }

    #[test]
    fn sealed_frames_arrive_as_they_were_sent_in_order() {
        let (mut driver, mut agent) = pair();
        let mut wire = sent(&mut driver, b"one");
        wire.extend_from_slice(&sent(&mut driver, b"two"));
        assert_eq!(
            agent.decode(&mut wire).expect("ok").expect("a frame"),
            "one"
        );
        assert_eq!(
            agent.decode(&mut wire).expect("ok").expect("a frame"),
            "two"
        );
        let mut back = sent(&mut agent, b"three");
        assert_eq!(
            driver.decode(&mut back).expect("ok").expect("a frame"),
            "three"
        );
    }

    #[test]
    fn an_altered_replayed_reflected_or_reordered_frame_fails_its_check() {
        let (mut driver, mut agent) = pair();
        // Altered: one byte of the payload flipped.
        let mut wire = sent(&mut driver, b"run this");
        wire[5] ^= 1;
        assert!(agent.decode(&mut wire).is_err());

        // Replayed: the first frame again in the place of the second.
        let (mut driver, mut agent) = pair();
        let first = sent(&mut driver, b"one");
        let mut wire = first.clone();
        agent.decode(&mut wire).expect("ok").expect("a frame");
        let mut wire = first;
        assert!(agent.decode(&mut wire).is_err());

        // Reflected: a frame the agent sent, sent back to it as if from the driver.
        let (_, mut agent) = pair();
        let mut wire = sent(&mut agent, b"mine");
        assert!(agent.decode(&mut wire).is_err());

        // Reordered: the second frame first.
        let (mut driver, mut agent) = pair();
        let _first = sent(&mut driver, b"one");
        let mut second = sent(&mut driver, b"two");
        assert!(agent.decode(&mut second).is_err());
    }

    #[test]
    fn a_frame_under_another_key_or_without_a_tag_fails_and_unsealed_frames_pass() {
        let (mut driver, _) = pair();
        let mut other = FrameCodec::new(64);
        other.seal(&SessionKey([8; 32]), Role::Agent, 1024);
        let mut wire = sent(&mut driver, b"hello");
        assert!(other.decode(&mut wire).is_err());

        let mut plain = FrameCodec::new(64);
        let (_, mut agent) = pair();
        let mut wire = sent(&mut plain, b"short");
        assert!(agent.decode(&mut wire).is_err());
        let mut wire = sent(&mut plain, b"hello");
        assert!(!plain.is_sealed());
        assert_eq!(
            plain.decode(&mut wire).expect("ok").expect("a frame"),
            "hello"
        );
    }
}
