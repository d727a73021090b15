//! What a peer may send the driver and the agent: bytes cut into frames by the protocol's
//! codec (with the limit before the handshake), each frame decoded as either side's message,
//! and the handshake's checks run over them as the driver and the agent run them: a hello
//! of this protocol gets a challenge, and whatever follows it as the agent's proof (or, the
//! other way round, as the driver's) must not check, since nobody here holds the secret.
//! After the handshake, the same bytes go to a sealed codec as the agent's connection reads
//! them: no frame made without the connection's key passes its seal.
//! Never a panic, never a frame over the limit, never a proof forged from arbitrary bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};
use trainyard_runtime::ActorId;
use trainyard_wire::auth::Handshake;
use trainyard_wire::seal::FrameCodec;
use trainyard_wire::token::{Nonce, Role, Token};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage, FRAME_LIMIT, HELLO_FRAME_LIMIT};

/// The run's secret as the fuzzer's peers never learn it.
const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// The driver's nonce of the fuzzed connection.
fn driver_nonce() -> Nonce {
    "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
        .parse()
        .expect("64 hex digits")
}

fuzz_target!(|data: &[u8]| {
    let secret = Token::from_hex(SECRET).expect("64 hex digits");
    let mut codec = LengthDelimitedCodec::builder()
        .max_frame_length(HELLO_FRAME_LIMIT)
        .new_codec();
    let mut buffer = BytesMut::from(data);
    let mut frames = Vec::new();
    while let Ok(Some(frame)) = codec.decode(&mut buffer) {
        assert!(frame.len() <= HELLO_FRAME_LIMIT);
        let _ = wire::decode::<AgentMessage>(&frame);
        let _ = wire::decode::<DriverMessage>(&frame);
        frames.push(frame);
    }
    let _ = wire::decode::<AgentMessage>(data);

    // The driver's side: the first frame as a hello, the second as the agent's proof.
    let mut frames = frames.iter();
    let hello = frames
        .next()
        .map(|frame| wire::decode::<AgentMessage>(frame));
    if let Some(Ok(AgentMessage::Hello {
        protocol,
        actor,
        pid,
        nonce,
    })) = hello
    {
        if protocol == wire::PROTOCOL {
            let handshake = Handshake {
                agent_nonce: nonce,
                driver_nonce: driver_nonce(),
                actor,
                pid,
            };
            let challenge = DriverMessage::Challenge {
                nonce: handshake.driver_nonce,
                proof: handshake.prove(&secret, Role::Driver),
            };
            let frame = wire::encode(&challenge).expect("wire messages serialise");
            assert!(frame.len() <= HELLO_FRAME_LIMIT);
            if let Some(Ok(AgentMessage::Proof { proof })) = frames
                .next()
                .map(|frame| wire::decode::<AgentMessage>(frame))
            {
                assert!(handshake.verify(&secret, Role::Agent, &proof).is_err());
            }
        }
    }

    // The agent's side: any frame as the driver's challenge to a hello of its own.
    for frame in frames {
        if let Ok(DriverMessage::Challenge { nonce, proof }) = wire::decode(frame) {
            let handshake = Handshake {
                agent_nonce: driver_nonce(),
                driver_nonce: nonce,
                actor: ActorId(0),
                pid: 1,
            };
            assert!(handshake.verify(&secret, Role::Driver, &proof).is_err());
        }
    }

    // A sealed connection: what arrives without the session key never passes.
    let handshake = Handshake {
        agent_nonce: driver_nonce(),
        driver_nonce: driver_nonce(),
        actor: ActorId(0),
        pid: 1,
    };
    let mut sealed = FrameCodec::new(HELLO_FRAME_LIMIT);
    sealed.seal(&handshake.session_key(&secret), Role::Agent, FRAME_LIMIT);
    let mut buffer = BytesMut::from(data);
    while let Ok(Some(frame)) = sealed.decode(&mut buffer) {
        panic!("a frame of {} bytes passed a seal nobody here could make", frame.len());
    }
});
