//! Frames round-trip through any chunking of the stream; every damage is an error, never a
//! panic or a wrong frame; handshakes over real sockets refuse mismatched peers clearly.

use std::io::{self, Cursor, Read};
use std::net::{TcpListener, TcpStream};

use dedupwire_wire::{
    encode_frame, Error, FrameConfig, FrameReader, FrameType, FrameWriter, Framed, Hello,
};
use proptest::prelude::*;

/// Delivers at most `step` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn frames() -> impl Strategy<Value = Vec<(u8, Vec<u8>)>> {
    prop::collection::vec(
        (1u8..=255, prop::collection::vec(any::<u8>(), 0..600)),
        0..12,
    )
}

proptest! {
    #[test]
    fn round_trip(frames in frames(), step in 1usize..64) {
        let mut w = FrameWriter::new(Vec::new());
        for (k, p) in &frames {
            w.write_frame(FrameType(*k), p).unwrap();
        }
        let bytes = w.into_inner();
        let mut r = FrameReader::new(Trickle { data: &bytes, step });
        let mut offset = 0u64;
        for (k, p) in &frames {
            let f = r.read_frame().unwrap();
            prop_assert_eq!(f.kind, FrameType(*k));
            prop_assert_eq!(&f.payload, p);
            prop_assert_eq!(f.offset, offset);
            offset += (p.len() + dedupwire_wire::frame::OVERHEAD) as u64;
        }
        let end = r.read_frame().unwrap_err();
        prop_assert!(matches!(end, Error::PeerClosed { mid_frame: false, .. }), "{}", end);
    }

    /// Any single flipped bit makes the read fail; nothing wrong is ever returned.
    #[test]
    fn every_bit_flip_is_caught(frames in frames().prop_filter("non-empty", |f| !f.is_empty()), bit in any::<prop::sample::Index>()) {
        let mut bytes = Vec::new();
        for (k, p) in &frames {
            encode_frame(FrameType(*k), p, &mut bytes);
        }
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        let mut r = FrameReader::with_config(Cursor::new(&bytes), FrameConfig::with_max_payload(1 << 16));
        let mut got = Vec::new();
        let err = loop {
            match r.read_frame() {
                Ok(f) => got.push((f.kind.0, f.payload)),
                Err(e) => break e,
            }
        };
        prop_assert!(got.len() < frames.len(), "a damaged stream read back whole");
        prop_assert_eq!(&got[..], &frames[..got.len()], "frames before the damage are intact");
        prop_assert!(!matches!(err, Error::PeerClosed { mid_frame: false, .. }), "{}", err);
    }

    /// Cutting the stream anywhere inside a frame is a truncation, never a clean end.
    #[test]
    fn every_cut_is_caught(frames in frames().prop_filter("non-empty", |f| !f.is_empty()), cut in any::<prop::sample::Index>()) {
        let mut bytes = Vec::new();
        let mut ends = vec![0];
        for (k, p) in &frames {
            encode_frame(FrameType(*k), p, &mut bytes);
            ends.push(bytes.len());
        }
        let cut = cut.index(bytes.len());
        let mut r = FrameReader::new(Cursor::new(&bytes[..cut]));
        let whole = ends.iter().filter(|&&e| e <= cut).count() - 1;
        for _ in 0..whole {
            r.read_frame().unwrap();
        }
        let e = r.read_frame().unwrap_err();
        let mid = !ends.contains(&cut);
        prop_assert!(matches!(e, Error::PeerClosed { mid_frame, offset } if mid_frame == mid && offset == cut as u64), "{}", e);
    }
}

#[test]
fn garbage_is_not_a_frame_stream() {
    let mut r = FrameReader::new(Cursor::new(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()));
    let e = r.read_frame().unwrap_err();
    assert!(matches!(e, Error::Corrupt { offset: 0, .. }), "{e}");
    assert!(
        e.to_string().contains("not a dedupwire frame stream"),
        "{e}"
    );
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

#[test]
fn handshake_over_tcp_agrees_or_refuses() {
    // Overlapping versions: both ends agree on the highest shared one.
    let (a, b) = pair();
    let t = std::thread::spawn(move || {
        Framed::new(b)
            .handshake(&Hello::new("proto", 2..=4).with_data(b"server".to_vec()))
            .unwrap()
    });
    let got = Framed::new(a)
        .handshake(&Hello::new("proto", 1..=3).with_data(b"client".to_vec()))
        .unwrap();
    let other = t.join().unwrap();
    assert_eq!((got.version, other.version), (3, 3));
    assert_eq!(
        (got.peer.data.as_slice(), other.peer.data.as_slice()),
        (&b"server"[..], &b"client"[..])
    );

    // Disjoint versions: each end gets a clear error, whichever way it learns it.
    let (a, b) = pair();
    let t = std::thread::spawn(move || {
        let mut f = Framed::new(b);
        f.handshake(&Hello::new("proto", 3..=3)).unwrap_err()
    });
    let mut f = Framed::new(a);
    let mine = f.handshake(&Hello::new("proto", 1..=2)).unwrap_err();
    let theirs = t.join().unwrap();
    for e in [&mine, &theirs] {
        let text = e.to_string();
        assert!(text.contains("version mismatch"), "{text}");
        assert!(matches!(e, Error::Protocol(_)), "{e:?}");
    }

    // A server that reads first: a client speaking another protocol is told so.
    let (a, b) = pair();
    let t = std::thread::spawn(move || {
        let mut f = Framed::new(b);
        f.recv_hello(&Hello::new("replicate", 1..=1)).unwrap_err()
    });
    let mut f = Framed::new(a);
    f.send_hello(&Hello::new("channel", 1..=1)).unwrap();
    let server = t.join().unwrap();
    assert!(server.to_string().contains("\"channel\""), "{server}");
    let client = f.read_frame().unwrap().into_checked().unwrap_err();
    assert!(
        matches!(&client, Error::Remote(m) if m.contains("handshake refused") && m.contains("replicate")),
        "{client}"
    );
}

#[test]
fn peer_going_away_is_peer_closed() {
    let (a, b) = pair();
    let mut fa = Framed::new(a);
    fa.write_frame(FrameType(0x10), b"one").unwrap();
    // Half a frame, then gone.
    let mut half = Vec::new();
    encode_frame(FrameType(0x10), &[7u8; 100], &mut half);
    io::Write::write_all(fa.get_mut(), &half[..50]).unwrap();
    drop(fa);
    let mut fb = Framed::new(b);
    assert_eq!(fb.read_frame().unwrap().payload, b"one");
    let e = fb.read_frame().unwrap_err();
    assert!(
        matches!(e, Error::PeerClosed { mid_frame: true, offset } if offset == (20 + 50) as u64),
        "{e}"
    );

    // Writing to a peer that closed fails as PeerClosed (possibly after one buffered write).
    let (a, b) = pair();
    drop(b);
    let mut fa = Framed::new(a);
    let mut err = None;
    for _ in 0..100 {
        if let Err(e) = fa.write_frame(FrameType(0x10), &[0u8; 4096]) {
            err = Some(e);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let e = err.expect("writing to a closed peer fails");
    assert!(e.is_peer_closed(), "{e:?}");
}
