//! The channel's adaptive mode end to end over loopback TCP. It chooses by timing, so these
//! tests live in a binary of their own and run one at a time: the channel's other tests,
//! run beside them, loaded the CPUs, and the loaded loopback passed for a link that bounds
//! plain sending (the mode then probed dedup more: CI failed once that way).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use dedupwire_wire::{
    ChannelConfig, ChannelStats, ChunkStore, DedupListener, DedupStream, MemoryStore, Mode,
    Security,
};

mod common;

use common::{keyed, random, small_segments, structured};

/// Held by each test for its whole run, so that the tests do not load each other's timing.
fn alone() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Connections tried before [`adaptive_mode_sends_random_data_plain_over_loopback`] fails.
const TRIES: usize = 3;

#[test]
fn adaptive_mode_sends_random_data_plain_over_loopback() {
    let _alone = alone();
    // Most segments go plain; the share of dedup probes depends on timing (the first segments
    // alternate until both ways are measured), so only a majority is asked. On a host loaded
    // by something else (one busy loop on two cores) one connection in five to ten still
    // sends most segments with dedup: the loopback then passes for a link that bounds plain,
    // and dedup is probed every other segment. So a fresh connection gets another try; a
    // mode that never chose plain fails every one.
    let mut seen = Vec::new();
    for attempt in 0..TRIES {
        let messages: Vec<Vec<u8>> = (0..12)
            .map(|i| random(512 << 10, 60 + 12 * attempt as u64 + i))
            .collect();
        let st = adaptive_connection(Arc::new(MemoryStore::new()), messages);
        if st.segments_plain > st.segments_dedup {
            return;
        }
        seen.push(format!(
            "plain {} (kept {}) dedup {} (rates: dedup {:.0} B/s, plain {:.0} B/s)",
            st.segments_plain, st.segments_kept, st.segments_dedup, st.dedup_rate, st.plain_rate
        ));
    }
    panic!("no connection of {TRIES} sent most segments plain: {seen:#?}");
}

/// A prior as `Prior::encode` lays it out (FORMAT.md, "Adaptive prior"): dedup's and plain's
/// sender seconds per byte, nothing on the wire or at the receiver, the link not limiting.
fn prior_note(dedup_secs: f64, plain_secs: f64) -> Vec<u8> {
    let mut b = vec![1, 0, 0];
    for v in [dedup_secs, 0.0, 0.0, plain_secs, 0.0, 0.0, 0.0] {
        b.extend_from_slice(&f64::to_le_bytes(v));
    }
    b
}

/// Sends `messages` over a new plaintext connection in the adaptive mode, the sender's store
/// being `store`; returns the sender's stats.
fn adaptive_connection(store: Arc<MemoryStore>, messages: Vec<Vec<u8>>) -> ChannelStats {
    let mut c = small_segments(ChannelConfig::default());
    c.mode = Mode::Adaptive;
    let expect = messages.clone();
    let listener = DedupListener::bind(
        "127.0.0.1:0",
        Security::InsecurePlaintext,
        Arc::new(MemoryStore::new()),
        c.clone(),
    )
    .unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        for m in &expect {
            assert_eq!(&s.recv().unwrap(), m);
        }
    });
    let mut s = DedupStream::connect(addr, Security::InsecurePlaintext, store, c).unwrap();
    for m in &messages {
        s.send(m).unwrap();
    }
    let st = s.stats();
    s.close().unwrap();
    h.join().unwrap();
    st
}

/// The prior a connection as far away as loopback reads: the LAN's, or the WAN's where the
/// handshake's round trip took over a millisecond (a loaded machine).
fn loopback_prior(store: &MemoryStore) -> Option<Vec<u8>> {
    let lan = store.note("adaptive-lan").unwrap();
    lan.or_else(|| store.note("adaptive-wan").unwrap())
}

fn keep_loopback_prior(store: &MemoryStore, note: &[u8]) {
    for key in ["adaptive-lan", "adaptive-wan"] {
        store.keep_note(key, note).unwrap();
    }
}

#[test]
fn the_next_connection_starts_from_what_the_last_one_measured() {
    let _alone = alone();
    let store = Arc::new(MemoryStore::new());
    let messages: Vec<Vec<u8>> = (0..6).map(|i| random(512 << 10, 90 + i)).collect();
    adaptive_connection(store.clone(), messages);
    let kept = loopback_prior(&store).expect("a prior kept at close");
    assert!(dedupwire_wire::channel::Prior::decode(&kept).is_some());

    // 384 KiB: at most six segments, fewer than the probe interval. Without a prior, segments
    // alternate from the first, dedup first (at least two each way), or a WAN away dedup
    // segments carry it all; with one, its way goes first and the other is probed once.
    keep_loopback_prior(&store, &prior_note(1e-3, 1e-9));
    let st = adaptive_connection(store.clone(), vec![random(384 << 10, 97)]);
    assert!(
        st.segments_dedup <= 1 && st.segments_plain >= 2,
        "the prior favours plain: {st:?}"
    );
    keep_loopback_prior(&store, &prior_note(1e-9, 1e-3));
    let st = adaptive_connection(store.clone(), vec![random(384 << 10, 98)]);
    assert!(st.segments_plain <= 1, "the prior favours dedup: {st:?}");
}

/// A relay on loopback that holds every byte `delay` in each direction before passing it on:
/// a WAN's round trip without a WAN. Returns the address to connect to instead of `target`.
fn delayed_relay(target: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (near, _) = listener.accept().unwrap();
        let far = TcpStream::connect(target).unwrap();
        for (from, to) in [
            (near.try_clone().unwrap(), far.try_clone().unwrap()),
            (far, near),
        ] {
            let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
            let mut from = from;
            thread::spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if tx
                                .send((Instant::now() + delay, buf[..n].to_vec()))
                                .is_err()
                            {
                                break;
                            }
                        }
                    }
                }
            });
            let mut to = to;
            thread::spawn(move || {
                for (due, bytes) in rx {
                    thread::sleep(due.saturating_duration_since(Instant::now()));
                    if to.write_all(&bytes).is_err() {
                        return;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    addr
}

#[test]
fn a_wan_away_the_adaptive_mode_samples_plain_without_sending_it() {
    let _alone = alone();
    let mut c = small_segments(ChannelConfig::default());
    c.mode = Mode::Adaptive;
    let base = structured(2 << 20, 80);
    let mut edited = base.clone();
    for at in (0..edited.len()).step_by(300_000) {
        edited[at..at + 64].copy_from_slice(&random(64, at as u64));
    }
    let messages = vec![base, edited, random(1 << 20, 81)];
    let expect = messages.clone();
    let listener = DedupListener::bind(
        "127.0.0.1:0",
        keyed(),
        Arc::new(MemoryStore::new()),
        c.clone(),
    )
    .unwrap();
    let relay = delayed_relay(listener.local_addr().unwrap(), Duration::from_millis(3));
    let h = thread::spawn(move || {
        let mut s = listener.accept().unwrap();
        for m in &expect {
            assert_eq!(&s.recv().unwrap(), m);
        }
    });
    let mut s = DedupStream::connect(relay, keyed(), Arc::new(MemoryStore::new()), c).unwrap();
    for m in &messages {
        s.send(m).unwrap();
    }
    let st = s.stats();
    s.close().unwrap();
    h.join().unwrap();
    assert!(
        st.plain_estimates > 0,
        "6 ms away, plain is sampled dry: {st:?}"
    );
}
