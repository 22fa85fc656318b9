//! Arbitrary bytes at a server-side secure stream, two ways: as everything a would-be client
//! sends (preamble, handshake, messages, read as frames), and injected raw into a connection
//! after a genuine handshake and some genuine data. Either must end in data or a clear error,
//! never a panic; and injected bytes must never be taken for data.
#![no_main]

use std::io::{Cursor, Read, Write};
use std::os::unix::net::UnixStream;

use dedupwire_wire::{FrameConfig, FrameReader, Key, SecureStream};
use libfuzzer_sys::fuzz_target;

struct Duplex<'a> {
    input: Cursor<&'a [u8]>,
    output: Vec<u8>,
}

impl Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const KEY: [u8; 32] = [7; 32];

fuzz_target!(|data: &[u8]| {
    let key = Key::from_bytes(KEY);
    let peer = Duplex {
        input: Cursor::new(data),
        output: Vec::new(),
    };
    if let Ok(stream) = SecureStream::server(peer, &key) {
        let mut frames = FrameReader::with_config(stream, FrameConfig::with_max_payload(4096));
        for _ in 0..64 {
            match frames.read_frame() {
                Ok(frame) => assert!(frame.payload.len() <= 4096),
                Err(_) => break,
            }
        }
    }

    let Some((&n, injected)) = data.split_first() else {
        return;
    };
    let genuine: Vec<u8> = (0..usize::from(n) * 97).map(|i| i as u8).collect();
    let (a, b) = UnixStream::pair().expect("socket pair");
    let sent = genuine.clone();
    let injected = injected.to_vec();
    let client = std::thread::spawn(move || {
        let mut s = SecureStream::client(a, &key).expect("client handshake");
        s.write_all(&sent).and_then(|()| s.flush()).expect("genuine data");
        let _ = s.get_mut().write_all(&injected);
    });
    let mut server = SecureStream::server(b, &Key::from_bytes(KEY)).expect("server handshake");
    let mut got = Vec::new();
    let _ = server.read_to_end(&mut got);
    client.join().expect("client thread");
    assert!(got == genuine, "injected bytes were taken for data");
});
