//! `AsyncDedupStream` (feature `tokio`) on a tokio runtime: futures and AsyncRead/AsyncWrite
//! carry messages, errors come through typed, a cancelled `recv` loses nothing, and dropping
//! the stream ends its thread and the connection.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dedupwire_wire::{
    AsyncDedupStream, ChannelConfig, DedupListener, Error, Key, MemoryStore, Mode, Security,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::random;

fn keyed() -> Security {
    Security::Key(Key::from_token("the async tests' shared passphrase"))
}

fn config() -> ChannelConfig {
    ChannelConfig {
        mode: Mode::Dedup,
        segment_size: 1 << 20,
        ..ChannelConfig::default()
    }
}

fn listener(security: Security) -> DedupListener {
    DedupListener::bind(
        "127.0.0.1:0",
        security,
        Arc::new(MemoryStore::new()),
        config(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn futures_and_async_io_carry_messages() {
    let listener = listener(keyed());
    let addr = listener.local_addr().unwrap();
    let big = random(9 << 20, 1); // more than one AsyncWrite batch
    let expect = big.clone();
    let server = thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        let m = s.recv().unwrap();
        s.send(&m).unwrap(); // echo the futures' message
        assert_eq!(s.recv().unwrap(), expect); // the AsyncWrite message
        assert_eq!(s.recv().unwrap(), b"tail");
        s.send(b"one ").unwrap();
        s.send(b"").unwrap();
        s.send(b"two").unwrap();
        s.close().unwrap();
    });
    let mut c = AsyncDedupStream::connect(addr, keyed(), Arc::new(MemoryStore::new()), config())
        .await
        .unwrap();
    assert!(c.is_encrypted());
    assert_eq!(c.peer_addr(), Some(addr));
    assert_eq!(c.config().segment_size, 1 << 20);
    c.send(b"hello".to_vec()).await.unwrap();
    assert_eq!(c.recv().await.unwrap(), b"hello");

    for piece in big.chunks(100_000) {
        c.write_all(piece).await.unwrap();
    }
    c.flush().await.unwrap();
    c.flush().await.unwrap(); // nothing open: no empty message
    c.write_all(b"tail").await.unwrap();
    c.flush().await.unwrap();
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.messages_sent, 3);
    assert_eq!(stats.message_bytes_sent, 5 + big.len() as u64 + 4);

    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, b"one two");
    server.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_stream_runs_async_too_and_shutdown_closes_it() {
    let listener = listener(keyed());
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || {
        let mut c = dedupwire_wire::DedupStream::connect(
            addr,
            keyed(),
            Arc::new(MemoryStore::new()),
            config(),
        )
        .unwrap();
        c.send(b"from the blocking end").unwrap();
        let reply = c.recv().unwrap();
        let e = c.recv().unwrap_err();
        (reply, e)
    });
    let accepted = tokio::task::spawn_blocking(move || listener.accept())
        .await
        .unwrap()
        .unwrap();
    let mut s = AsyncDedupStream::from(accepted);
    assert_eq!(s.recv().await.unwrap(), b"from the blocking end");
    s.write_all(b"from the async end").await.unwrap();
    s.shutdown().await.unwrap(); // ends the message, then closes
    let e = s.recv().await.unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
    let (reply, e) = client.join().unwrap();
    assert_eq!(reply, b"from the async end");
    assert!(
        matches!(
            e,
            Error::PeerClosed {
                mid_frame: false,
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_come_through_typed() {
    let listener = listener(keyed());
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || listener.accept().unwrap_err());
    let e = AsyncDedupStream::connect(
        addr,
        Security::Key(Key::from_token("not the server's passphrase")),
        Arc::new(MemoryStore::new()),
        config(),
    )
    .await
    .unwrap_err();
    assert!(e.is_auth(), "{e}");
    assert!(server.join().unwrap().is_auth());

    // A peer that vanishes: recv fails, so does a read, and send after it.
    let listener = self::listener(keyed());
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || drop(listener.accept().unwrap()));
    let mut c = AsyncDedupStream::connect(addr, keyed(), Arc::new(MemoryStore::new()), config())
        .await
        .unwrap();
    server.join().unwrap();
    let e = c.recv().await.unwrap_err();
    assert!(e.is_peer_closed(), "{e}");
    assert!(c.send(b"late".to_vec()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_recv_loses_nothing_and_drop_ends_the_connection() {
    let listener = listener(keyed());
    let addr = listener.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        go_rx.recv().unwrap();
        s.send(b"after the timeout").unwrap();
        // The client drops its stream while a recv waits: this end sees it go.
        s.recv().unwrap_err()
    });
    let mut c = AsyncDedupStream::connect(addr, keyed(), Arc::new(MemoryStore::new()), config())
        .await
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(200), c.recv()).await;
    assert!(waited.is_err(), "nothing was sent yet");
    go_tx.send(()).unwrap();
    assert_eq!(c.recv().await.unwrap(), b"after the timeout");

    // A recv left waiting on the thread, then the stream dropped.
    let waited = tokio::time::timeout(Duration::from_millis(100), c.recv()).await;
    assert!(waited.is_err());
    drop(c);
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || tx.send(server.join().unwrap()));
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the server saw the connection end");
    assert!(e.is_peer_closed(), "{e}");
}
