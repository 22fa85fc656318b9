//! Arbitrary bytes as channel messages and DATA bodies, and as a frame stream fed to a real
//! receiving channel end: decoding must end in a message or a clear error, never a panic.
#![no_main]

use std::io::{Cursor, Read, Write};
use std::sync::Arc;

use dedupwire_wire::channel::protocol::{decode_entries, Limits, Message, PROTOCOL};
use dedupwire_wire::channel::Role;
use dedupwire_wire::{encode_frame, ChannelConfig, DedupStream, FrameType, Hello, MemoryStore};
use libfuzzer_sys::fuzz_target;

/// The peer's side of a connection: scripted bytes in, whatever the end writes discarded.
struct Scripted {
    input: Cursor<Vec<u8>>,
}

impl Read for Scripted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Scripted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        id_len: 32,
        max_segment: 1 << 16,
    };
    if let Some((&kind, payload)) = data.split_first() {
        let _ = Message::decode(FrameType(0x20 | (kind & 0x07)), payload, &limits);
        let _ = decode_entries(payload, &limits);
    }
    // The input after a valid handshake is split into frames: [kind, len_lo, len_hi, payload].
    let config = ChannelConfig {
        segment_size: 64 << 10,
        max_message: 1 << 20,
        ..Default::default()
    };
    let mut script = Vec::new();
    let hello = Hello::new(PROTOCOL, 1..=1).with_data(config.encode());
    encode_frame(FrameType::HELLO, &hello.encode(), &mut script);
    let mut rest = data;
    while rest.len() >= 3 {
        let kind = 0x20 | (rest[0] & 0x07);
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        encode_frame(FrameType(kind), &rest[3..3 + len], &mut script);
        rest = &rest[3 + len..];
    }
    let stream = Scripted {
        input: Cursor::new(script),
    };
    if let Ok(mut end) = DedupStream::new(stream, Arc::new(MemoryStore::new()), config, Role::Accept)
    {
        for _ in 0..8 {
            match end.recv() {
                Ok(m) => assert!(m.len() <= 1 << 20),
                Err(_) => break,
            }
        }
    }
});
