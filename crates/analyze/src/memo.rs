//! Compressed sizes shared between streams.
//!
//! Several compressed streams often hold the very same batch: every stream has one batch per
//! input batch, and an exact method that removed nothing from an input batch (a large chunk
//! size may find no duplicate in a whole image) holds its bytes unchanged, as compression
//! alone does. Every stream samples the same input batches, so such streams ask for the same
//! compressions. The memo answers the second request with the first one's size and CPU time,
//! so every method is still charged what it would pay alone.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use dedupwire_engine::compress::{Compression, Compressor};

use crate::cpu::charge;

thread_local! {
    /// Where this thread's compressions write the output nobody reads, kept between them:
    /// one per compressing thread instead of one per stream (a 4 MiB batch's bound each, 34
    /// streams on the disk images: 138 MB at the peak).
    static OUTPUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Entries kept at most (about 40 MB); past that, new sizes are measured but not kept.
const MAX_ENTRIES: usize = 1 << 20;

/// Input batches whose slice sizes are kept behind the newest noted (4 GiB of input): streams
/// lag the reader by their queue's batches and an item's buffer at most, far fewer.
const SLICES_KEPT: u64 = 1 << 10;

type Key = (Compression, usize, Content);

/// What a compression's input is: bytes known by their hash, or an input batch's very bytes,
/// known by its number without hashing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Content {
    Hash(u128),
    Input(u64),
}

/// One compression's length and CPU seconds, filled by the first stream to ask for it.
type Entry = Arc<OnceLock<(usize, f64)>>;

/// What each of an input batch's proxy slices adds to their compressed length.
pub type SliceSizes = Vec<u32>;

/// An input batch's [`SliceSizes`] and their CPU seconds, filled by the first stream to ask.
type SliceEntry = Arc<OnceLock<(SliceSizes, f64)>>;

/// Compressed lengths and their CPU seconds, by method and content, shared by all runners.
///
/// Runners work on the same input batch at about the same moment, so a second request often
/// comes while the first is still compressing: it waits for that result instead of compressing
/// the same bytes again (on the five Debian images, a sixth of the zstd-3 bytes were compressed
/// twice that way).
#[derive(Clone, Default)]
pub struct Memo {
    map: Arc<Mutex<HashMap<Key, Entry>>>,
    /// What each proxy slice of an input batch adds to their compression, by batch number.
    slices: Arc<Mutex<HashMap<u64, SliceEntry>>>,
    /// Compressions actually run.
    runs: Arc<AtomicU64>,
    /// Bytes hashed to find requests.
    hashed: Arc<AtomicU64>,
    reference: Arc<Reference>,
}

/// The input's own sampled batches, by method: what compression alone made of each, published
/// by the stream that compresses the input as it is (see [`Memo::expect_reference`]), for the
/// streams that estimate most of their dense sampled batches from it.
#[derive(Default)]
struct Reference {
    state: Mutex<RefState>,
    done: Condvar,
}

#[derive(Default)]
struct RefState {
    /// The methods a reference stream runs for, and whether it has ended.
    streams: HashMap<Compression, bool>,
    /// `(proxy estimate, compressed bytes)` of each sampled input batch, by method and number.
    pairs: HashMap<(Compression, u64), (f64, f64)>,
}

/// Sampled input batches by number: `(proxy estimate, compressed bytes)`.
pub type ReferencePairs = HashMap<u64, (f64, f64)>;

impl fmt::Debug for Memo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.map.lock().map_or(0, |m| m.len());
        f.debug_struct("Memo").field("entries", &n).finish()
    }
}

impl Memo {
    /// Compressions remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().expect("no panics while held").len()
    }

    /// The method and input length of each compression remembered.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<(Compression, usize)> {
        let map = self.map.lock().expect("no panics while held");
        map.keys().map(|k| (k.0, k.1)).collect()
    }

    /// Compressions run so far (requests answered from the memo not counted).
    #[cfg(test)]
    pub(crate) fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Bytes hashed so far to match requests (those of input batches held whole are not).
    #[cfg(test)]
    pub(crate) fn hashed(&self) -> u64 {
        self.hashed.load(Ordering::Relaxed)
    }

    /// Says that a stream will publish the input's sampled batches compressed with `method`
    /// (before any stream starts, so that all of them know it from their first batch).
    pub fn expect_reference(&self, method: Compression) {
        self.ref_state().streams.insert(method, false);
    }

    /// Whether a stream publishes the input's sampled batches compressed with `method`.
    pub fn has_reference(&self, method: Compression) -> bool {
        self.ref_state().streams.contains_key(&method)
    }

    /// Publishes input batch `seq`'s proxy estimate and compressed bytes under `method`.
    pub fn publish_reference(&self, method: Compression, seq: u64, proxy: f64, out: f64) {
        self.ref_state().pairs.insert((method, seq), (proxy, out));
        self.reference.done.notify_all();
    }

    /// Says that the reference stream for `method` has published all it will.
    pub fn end_reference(&self, method: Compression) {
        self.ref_state().streams.insert(method, true);
        self.reference.done.notify_all();
    }

    /// The input's sampled batches `seqs` under `method`, once the reference stream has
    /// published them all or ended (this waits for it); those it has if it ended first.
    ///
    /// The reference publishes a batch as soon as it has it whole, so a stream that has
    /// reached input batch `t` can wait for any batch before `t`: every method's thread was
    /// sent all of them before `t`, and the reference waits for nothing else.
    pub fn reference_pairs(&self, method: Compression, seqs: &[u64]) -> ReferencePairs {
        let mut state = self.ref_state();
        while state.streams.get(&method) == Some(&false)
            && !seqs.iter().all(|&s| state.pairs.contains_key(&(method, s)))
        {
            state = self
                .reference
                .done
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        seqs.iter()
            .filter_map(|&s| Some((s, *state.pairs.get(&(method, s))?)))
            .collect()
    }

    fn ref_state(&self) -> std::sync::MutexGuard<'_, RefState> {
        self.reference
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure the slice sizes of input batch `seq` are known: `compute` gives them
    /// unless another stream did or is doing so (this then waits for it). Adds their CPU
    /// seconds to `cpu`, as every stream would pay them alone.
    pub fn note_slices(&self, seq: u64, cpu: &mut f64, compute: impl FnOnce() -> SliceSizes) {
        let entry = {
            let mut map = self.slices.lock().expect("no panics while held");
            if map.len() as u64 >= 2 * SLICES_KEPT {
                map.retain(|&s, _| s + SLICES_KEPT > seq);
            }
            Arc::clone(map.entry(seq).or_default())
        };
        let (_, secs) = entry.get_or_init(|| {
            let mut secs = 0.0;
            let sizes = charge(&mut secs, compute);
            (sizes, secs)
        });
        *cpu += secs;
    }

    /// The slice sizes of input batch `seq`, if a stream noted them.
    pub fn slices(&self, seq: u64) -> Option<SliceSizes> {
        let map = self.slices.lock().expect("no panics while held");
        map.get(&seq)?.get().map(|(sizes, _)| sizes.clone())
    }

    /// Compresses `data` with `c` unless it was compressed before or is being compressed now,
    /// adds the CPU seconds the compression took to `cpu`, and returns the compressed length.
    pub fn compress(&self, c: &mut Compressor, data: &[u8], cpu: &mut f64) -> usize {
        self.compress_input(c, data, None, cpu)
    }

    /// [`Memo::compress`] for `data` that is, when `input` says so, what every stream holding
    /// all of input batch `input` holds for it (its bytes): such requests are
    /// matched by the batch's number, and the bytes are not hashed. (Hashing the requests was
    /// 2% of the analysis' CPU on the Debian images.)
    pub fn compress_input(
        &self,
        c: &mut Compressor,
        data: &[u8],
        input: Option<u64>,
        cpu: &mut f64,
    ) -> usize {
        let content = match input {
            Some(seq) => Content::Input(seq),
            None => {
                self.hashed.fetch_add(data.len() as u64, Ordering::Relaxed);
                Content::Hash(crate::hash::xxh3_128(data))
            }
        };
        let key = (c.method(), data.len(), content);
        let entry = {
            let mut map = self.map.lock().expect("no panics while held");
            match map.get(&key) {
                Some(e) => Some(Arc::clone(e)),
                None if map.len() < MAX_ENTRIES => Some(Arc::clone(map.entry(key).or_default())),
                None => None,
            }
        };
        let mut measure = || {
            self.runs.fetch_add(1, Ordering::Relaxed);
            let mut secs = 0.0;
            let len =
                OUTPUT.with_borrow_mut(|out| charge(&mut secs, || c.compress_reusing(data, out)));
            (len, secs)
        };
        let (len, secs) = match entry {
            Some(e) => *e.get_or_init(&mut measure),
            None => measure(),
        };
        *cpu += secs;
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_bytes_are_compressed_once_and_charged_each_time() {
        let memo = Memo::default();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut c = Compressor::new(Compression::Zstd(3));
        let (mut first, mut second) = (0.0, 0.0);
        let a = memo.compress(&mut c, &data, &mut first);
        let b = memo.compress(&mut c, &data, &mut second);
        assert_eq!(a, b);
        assert_eq!(a, Compression::Zstd(3).compress(&data).len());
        assert_eq!(first, second);
        let mut lz4 = Compressor::new(Compression::Lz4);
        let l = memo.compress(&mut lz4, &data, &mut 0.0);
        assert_eq!(l, Compression::Lz4.compress(&data).len());
        let mut other = data.clone();
        other[5] ^= 1;
        memo.compress(&mut c, &other, &mut 0.0);
        assert_eq!(memo.map.lock().unwrap().len(), 3);
        assert_eq!(memo.runs(), 3);
    }

    #[test]
    fn slice_sizes_are_computed_once_per_batch_and_old_ones_dropped() {
        let memo = Memo::default();
        let calls = AtomicU64::new(0);
        let count = |sizes: Vec<u32>| {
            calls.fetch_add(1, Ordering::Relaxed);
            sizes
        };
        let (mut first, mut second) = (0.0, 0.0);
        memo.note_slices(7, &mut first, || count(vec![1, 2]));
        memo.note_slices(7, &mut second, || count(vec![9]));
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert_eq!(memo.slices(7), Some(vec![1, 2]));
        assert_eq!(first, second);
        assert_eq!(memo.slices(8), None);
        let last = 8 + 2 * SLICES_KEPT;
        for seq in 8..=last {
            memo.note_slices(seq, &mut 0.0, Vec::new);
        }
        assert_eq!(memo.slices(7), None);
        assert_eq!(memo.slices(last - SLICES_KEPT + 1), Some(Vec::new()));
    }

    #[test]
    fn streams_asking_at_once_wait_for_one_compression() {
        let memo = Memo::default();
        let data: Vec<u8> = (0..4u32 << 20)
            .map(|i| (i.wrapping_mul(i) >> 7) as u8)
            .collect();
        let start = std::sync::Barrier::new(4);
        let sizes: Vec<(usize, f64)> = std::thread::scope(|s| {
            let jobs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = Compressor::new(Compression::Zstd(3));
                        let mut cpu = 0.0;
                        start.wait();
                        let len = memo.compress(&mut c, &data, &mut cpu);
                        (len, cpu)
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        assert_eq!(memo.runs(), 1);
        assert!(sizes.iter().all(|&s| s == sizes[0]), "{sizes:?}");
        assert_eq!(sizes[0].0, Compression::Zstd(3).compress(&data).len());
    }
}
