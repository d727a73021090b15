//! What a peer may send the driver and the agent: bytes cut into frames by the protocol's
//! codec (with the limit before the hello), each frame decoded as either side's message.
//! Never a panic, never a frame over the limit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};
use trainyard_agent::wire::{self, AgentMessage, DriverMessage, HELLO_FRAME_LIMIT};

fuzz_target!(|data: &[u8]| {
    let mut codec = LengthDelimitedCodec::builder()
        .max_frame_length(HELLO_FRAME_LIMIT)
        .new_codec();
    let mut buffer = BytesMut::from(data);
    while let Ok(Some(frame)) = codec.decode(&mut buffer) {
        assert!(frame.len() <= HELLO_FRAME_LIMIT);
        let _ = wire::decode::<AgentMessage>(&frame);
        let _ = wire::decode::<DriverMessage>(&frame);
    }
    let _ = wire::decode::<AgentMessage>(data);
});
