//! The window of recent units both sides keep, evicted oldest-first by bytes.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};

use crate::exact_index::PassThrough;
use crate::fingerprint::Fingerprint;

/// A buffer several holders share: the encoder's window may keep parts of it instead of
/// copies (see [`super::Encoder::encode_prepared_from`]).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One held unit: its own copy, or a range of a shared buffer.
pub(super) enum Unit {
    Owned(Vec<u8>),
    Shared(SharedBytes, Range<usize>),
}

impl Unit {
    /// `unit` as a range of `owner` when it lies inside it, else a copy.
    pub(super) fn of(unit: &[u8], owner: Option<&SharedBytes>) -> Unit {
        if let Some(owner) = owner {
            let base = (**owner).as_ref();
            let start = (unit.as_ptr() as usize).wrapping_sub(base.as_ptr() as usize);
            if start <= base.len() && unit.len() <= base.len() - start {
                return Unit::Shared(Arc::clone(owner), start..start + unit.len());
            }
        }
        Unit::Owned(unit.to_vec())
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Unit::Owned(v) => v,
            Unit::Shared(owner, range) => &(**owner).as_ref()[range.clone()],
        }
    }

    fn len(&self) -> usize {
        match self {
            Unit::Owned(v) => v.len(),
            Unit::Shared(_, range) => range.len(),
        }
    }
}

/// Copies of units that several encoders' windows hold, by fingerprint: an encoder given
/// one (see [`super::Encoder::with_unit_store`]) keeps each unit of its window as the copy
/// any other window holding the same fingerprint, and pins no input buffer. An analysis
/// running two scopes over the same data then holds each byte once. Encoders sharing a store
/// must share a fingerprinter: like the encoder's own exact index, the store takes equal
/// fingerprints (and lengths) for equal bytes. Where two of them pick the same copy as the
/// source of the same unit, the second takes the delta the first computed.
///
/// Copies are packed one after another into slabs of 256 KiB; a slab whose units no
/// window holds any more gives its block to the next slab. A window of a GiB was a hundred
/// thousand allocations, each growing the allocator's heap by a system call (`mprotect`,
/// 110 000 calls on the disk images, now 4 500); its memory now turns over in place.
///
/// The copies are kept in [`STORE_SHARDS`] shards by fingerprint, each under its own lock and
/// filling its own slab, so two windows holding units at once rarely wait for each other.
/// (Under one lock, the analysis' two similarity threads slept on it 14 000 times on the five
/// Debian images, leaving a core idle 11 000 of those times; sharded, 260.)
///
/// Blocks are cut from regions of [`REGION_BYTES`], which a store made
/// [`with_populate`](UnitStore::with_populate) hands to its hook before any is used: the
/// analysis maps them in with one system call each instead of a page fault per 4 KiB (a GiB
/// window was 262 000 faults, a quarter of a second of the kernel's time on the disk images).
#[derive(Default)]
pub struct UnitStore {
    shards: [Mutex<StoreMap>; STORE_SHARDS],
    free: FreeBlocks,
    /// Deltas one encoder computed from a held copy, for another that picks the same.
    deltas: super::delta_share::DeltaShare,
}

/// Shards of a [`UnitStore`].
const STORE_SHARDS: usize = 16;

#[derive(Default)]
struct StoreMap {
    copies: HashMap<Fingerprint, (Weak<Slab>, u32, u32), PassThrough>,
    /// Entries at the last sweep of dropped copies.
    swept_at: usize,
    /// The slab new copies go to.
    open: Option<Arc<Slab>>,
}

impl std::fmt::Debug for UnitStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitStore").finish_non_exhaustive()
    }
}

/// Bytes in a slab of copies: a unit that outlives its neighbours in the windows keeps at
/// most this much alive.
const SLAB_BYTES: usize = 256 << 10;

/// Units longer than this get a slab of their own length.
const SLAB_UNIT_MAX: usize = SLAB_BYTES / 8;

impl UnitStore {
    /// A store that hands each new region (its address and length) to `populate` before its
    /// blocks are used, so the caller can map its pages in at once. The hook must neither
    /// read the region (it is uninitialized) nor keep the pointer.
    pub fn with_populate(populate: fn(*mut u8, usize)) -> Self {
        let store = UnitStore::default();
        store
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .populate = Some(populate);
        store
    }

    /// The deltas encoders sharing this store offer each other.
    pub(super) fn deltas(&self) -> &super::delta_share::DeltaShare {
        &self.deltas
    }

    /// `unit` (fingerprint `fp`) as a held copy: one another window holds under `fp`, else a
    /// new one, remembered for the others.
    pub(super) fn hold(&self, unit: &[u8], fp: &Fingerprint) -> Unit {
        if u32::try_from(unit.len()).is_err() {
            // Past what an entry records: a copy of its own, not shared.
            return Unit::Owned(unit.to_vec());
        }
        let mut map = self.map(fp);
        if let Some((slab, range)) = Self::held_copy(&map, unit, fp) {
            return Unit::Shared(slab, range);
        }
        let room = |s: &Arc<Slab>| s.room() >= unit.len();
        let slab = match map.open.as_ref().filter(|s| room(s)) {
            Some(open) => Arc::clone(open),
            None => {
                let slab = Arc::new(Slab::new(unit.len(), &self.free));
                if unit.len() <= SLAB_UNIT_MAX {
                    map.open = Some(Arc::clone(&slab));
                }
                slab
            }
        };
        let range = slab.push(unit);
        map.copies.insert(
            *fp,
            (Arc::downgrade(&slab), range.start as u32, unit.len() as u32),
        );
        if map.copies.len() >= 2 * map.swept_at.max(1 << 16) {
            map.copies.retain(|_, (w, _, _)| w.strong_count() > 0);
            map.swept_at = map.copies.len();
        }
        Unit::Shared(slab, range)
    }

    /// The live copy under `fp`, if it is as long as `unit`.
    fn held_copy(
        map: &StoreMap,
        unit: &[u8],
        fp: &Fingerprint,
    ) -> Option<(SharedBytes, Range<usize>)> {
        let (slab, at, len) = map.copies.get(fp)?;
        let slab = slab.upgrade()?;
        let (at, len) = (*at as usize, *len as usize);
        (len == unit.len()).then_some((slab as SharedBytes, at..at + len))
    }

    /// The shard `fp` belongs to, locked. (By a byte the shard maps' [`PassThrough`] hash
    /// takes neither its bucket bits nor its tag bits from, so each map still spreads.)
    fn map(&self, fp: &Fingerprint) -> std::sync::MutexGuard<'_, StoreMap> {
        let shard = &self.shards[usize::from(fp.0[4]) % STORE_SHARDS];
        shard.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A slab's buffer: `cap` bytes, its own allocation or a part of a shared region, freed on
/// drop (a region with its last block).
struct Block {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    region: Option<Arc<Region>>,
}

// SAFETY: a block is plain memory owned by one value; access goes through its slab.
unsafe impl Send for Block {}

fn layout(cap: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(cap, 64).expect("slab sizes fit a layout")
}

/// A raw allocation of `cap` bytes aligned for a slab.
fn allocate(cap: usize) -> std::ptr::NonNull<u8> {
    let layout = layout(cap);
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc(layout) };
    std::ptr::NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

impl Block {
    fn new(cap: usize) -> Block {
        Block {
            ptr: allocate(cap),
            cap,
            region: None,
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.region.is_none() {
            // SAFETY: allocated in `new` with this layout, and freed only here.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout(self.cap)) }
        }
    }
}

/// Bytes in a region that [`SLAB_BYTES`] blocks are cut from.
const REGION_BYTES: usize = 8 << 20;

/// One allocation of [`REGION_BYTES`], freed when its last block is.
struct Region(std::ptr::NonNull<u8>);

// SAFETY: the region only frees its allocation; its blocks own their bytes.
unsafe impl Send for Region {}
// SAFETY: as above: a region gives no access to its bytes.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `FreeList::take` with this layout, and freed only here.
        unsafe { std::alloc::dealloc(self.0.as_ptr(), layout(REGION_BYTES)) }
    }
}

/// Blocks of [`SLAB_BYTES`] whose slabs were dropped or that no slab has had yet, for the next
/// slabs: the window's memory is reused as it turns over, never faulted in again nor
/// fragmented among other allocations.
#[derive(Default)]
struct FreeList {
    blocks: Vec<Block>,
    populate: Option<fn(*mut u8, usize)>,
}

impl FreeList {
    /// A block of [`SLAB_BYTES`]: a free one, else one of a new region's.
    fn take(&mut self) -> Block {
        if let Some(block) = self.blocks.pop() {
            return block;
        }
        let ptr = allocate(REGION_BYTES);
        if let Some(populate) = self.populate {
            populate(ptr.as_ptr(), REGION_BYTES);
        }
        let region = Arc::new(Region(ptr));
        let block = |k: usize| Block {
            // SAFETY: `k * SLAB_BYTES` lies inside the region.
            ptr: unsafe { ptr.add(k * SLAB_BYTES) },
            cap: SLAB_BYTES,
            region: Some(Arc::clone(&region)),
        };
        self.blocks
            .extend((1..REGION_BYTES / SLAB_BYTES).rev().map(block));
        block(0)
    }
}

type FreeBlocks = Arc<Mutex<FreeList>>;

/// A buffer copies are appended to and never changed in: only the store, under its lock,
/// appends; readers see the bytes written before the copy was handed out.
struct Slab {
    block: Option<Block>,
    len: std::sync::atomic::AtomicUsize,
    /// Where a block of the usual size goes back to.
    free: Weak<Mutex<FreeList>>,
}

// SAFETY: the bytes below `len` are never written again, and only one thread at a time (the
// store's lock holder) writes above it.
unsafe impl Sync for Slab {}

impl Slab {
    /// A slab for a unit of `len` bytes: one of [`SLAB_BYTES`] (on a block from `free` if
    /// one is there) that later units fill too, or for a unit longer than [`SLAB_UNIT_MAX`]
    /// one of its very length, so a large unit wastes nothing.
    fn new(len: usize, free: &FreeBlocks) -> Slab {
        let block = if len <= SLAB_UNIT_MAX {
            free.lock().unwrap_or_else(|e| e.into_inner()).take()
        } else {
            Block::new(len)
        };
        Slab {
            block: Some(block),
            len: Default::default(),
            free: Arc::downgrade(free),
        }
    }

    fn block(&self) -> &Block {
        self.block
            .as_ref()
            .expect("a slab has its block until dropped")
    }

    fn room(&self) -> usize {
        self.block().cap - self.len()
    }

    fn len(&self) -> usize {
        self.len.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Appends `bytes` (the caller holds the store's lock and checked the room): their range.
    fn push(&self, bytes: &[u8]) -> Range<usize> {
        let at = self.len();
        assert!(bytes.len() <= self.room(), "a slab holds what fits");
        // SAFETY: `at..at + len` lies inside the block, above every byte handed out, and
        // only the lock holder writes there.
        unsafe {
            let to = self.block().ptr.as_ptr().add(at);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), to, bytes.len())
        };
        self.len
            .store(at + bytes.len(), std::sync::atomic::Ordering::Release);
        at..at + bytes.len()
    }
}

impl AsRef<[u8]> for Slab {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the bytes below `len` were written before `len` was stored and are never
        // written again.
        unsafe { std::slice::from_raw_parts(self.block().ptr.as_ptr(), self.len()) }
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let block = self.block.take().expect("dropped once");
        if let Some(free) = self.free.upgrade().filter(|_| block.cap == SLAB_BYTES) {
            free.lock()
                .unwrap_or_else(|e| e.into_inner())
                .blocks
                .push(block);
        }
    }
}

/// Whether `a` and `b` are the same buffer (their data, whatever their vtables).
fn same_buffer(a: &SharedBytes, b: &SharedBytes) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// Units numbered from 0 in arrival order; those still held are `first..next`.
#[derive(Default)]
pub(super) struct Window {
    units: VecDeque<Unit>,
    first: u64,
    bytes: u64,
    limit: u64,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("first", &self.first)
            .field("units", &self.units.len())
            .field("bytes", &self.bytes)
            .field("limit", &self.limit)
            .finish()
    }
}

impl Window {
    pub(super) fn new(limit: u64) -> Self {
        Window {
            limit,
            ..Default::default()
        }
    }

    /// The id of the oldest unit held (the next id when none is).
    pub(super) fn first_id(&self) -> u64 {
        self.first
    }

    /// The id the next pushed unit gets.
    pub(super) fn next_id(&self) -> u64 {
        self.first + self.units.len() as u64
    }

    /// The unit `id`, if still held.
    pub(super) fn get(&self, id: u64) -> Option<&[u8]> {
        let i = id.checked_sub(self.first)?;
        self.units.get(usize::try_from(i).ok()?).map(Unit::bytes)
    }

    /// Appends a unit, then evicts the oldest until the window fits its limit (keeping the newest).
    pub(super) fn push(&mut self, unit: Unit) -> u64 {
        let id = self.next_id();
        self.bytes += unit.len() as u64;
        self.units.push_back(unit);
        while self.bytes > self.limit && self.units.len() > 1 {
            let old = self.units.pop_front().expect("non-empty");
            self.bytes -= old.len() as u64;
            self.first += 1;
        }
        id
    }

    /// Copies the units from `from` on that lie in `owner` out of it unless they hold at least
    /// half of it: a buffer pinned for a few units (a batch of mostly duplicates) would hold
    /// far more memory than the window counts. Units in other buffers (a [`UnitStore`]'s
    /// copies) stay shared.
    pub(super) fn own_if_sparse(&mut self, from: u64, owner: &SharedBytes) {
        let skip = usize::try_from(from.saturating_sub(self.first))
            .unwrap_or(usize::MAX)
            .min(self.units.len());
        let in_owner = |u: &Unit| matches!(u, Unit::Shared(b, _) if same_buffer(b, owner));
        let pinned: usize = self
            .units
            .range(skip..)
            .filter(|u| in_owner(u))
            .map(Unit::len)
            .sum();
        if pinned == 0 || pinned * 2 >= (**owner).as_ref().len() {
            return;
        }
        for unit in self.units.range_mut(skip..) {
            if in_owner(unit) {
                *unit = Unit::Owned(unit.bytes().to_vec());
            }
        }
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint([n; 32])
    }

    #[test]
    fn a_unit_inside_its_owner_is_shared_and_one_outside_is_copied() {
        let owner: SharedBytes = Arc::new(b"0123456789".to_vec());
        let inside = &(*owner).as_ref()[3..7];
        let elsewhere = b"3456".to_vec();
        let mut w = Window::new(100);
        let a = w.push(Unit::of(inside, Some(&owner)));
        let b = w.push(Unit::of(&elsewhere, Some(&owner)));
        let c = w.push(Unit::of(inside, None));
        assert!(matches!(w.units[0], Unit::Shared(_, ref r) if *r == (3..7)));
        assert!(matches!(w.units[1], Unit::Owned(_)));
        assert!(matches!(w.units[2], Unit::Owned(_)));
        for id in [a, b, c] {
            assert_eq!(w.get(id), Some(&b"3456"[..]));
        }
        assert_eq!(w.bytes(), 12);
        let empty_at_end = &(*owner).as_ref()[10..];
        assert!(
            matches!(Unit::of(empty_at_end, Some(&owner)), Unit::Shared(_, ref r) if r.is_empty())
        );
    }

    #[test]
    fn a_buffer_that_gives_the_window_little_is_not_pinned() {
        let owner: SharedBytes = Arc::new(vec![9u8; 100]);
        let bytes = (*owner).as_ref();
        let mut w = Window::new(1000);
        let first = w.push(Unit::of(&bytes[..30], Some(&owner)));
        w.push(Unit::of(&bytes[50..60], Some(&owner)));
        w.own_if_sparse(first, &owner);
        assert!(w.units.iter().all(|u| matches!(u, Unit::Owned(_))));
        let next = w.push(Unit::of(&bytes[..60], Some(&owner)));
        w.own_if_sparse(next, &owner);
        assert!(matches!(w.units[2], Unit::Shared(..)));
        assert_eq!(Arc::strong_count(&owner), 2);
        assert_eq!(w.get(first), Some(&[9u8; 30][..]));
    }

    #[test]
    fn a_sparse_buffer_gives_up_its_units_but_store_copies_stay_shared() {
        let store = UnitStore::default();
        let owner: SharedBytes = Arc::new(vec![7u8; 100]);
        let mut w = Window::new(1000);
        let first = w.push(store.hold(b"stored", &fp(1)));
        w.push(Unit::of(&(*owner).as_ref()[..10], Some(&owner)));
        w.own_if_sparse(first, &owner);
        assert!(
            matches!(w.units[0], Unit::Shared(..)),
            "the store's copy is not duplicated"
        );
        assert!(matches!(w.units[1], Unit::Owned(_)));
        assert_eq!(
            Arc::strong_count(&owner),
            1,
            "the sparse buffer is not pinned"
        );
    }

    #[test]
    fn windows_given_one_store_hold_each_unit_once() {
        let store = UnitStore::default();
        let (mut a, mut b) = (Window::new(100), Window::new(100));
        let ia = a.push(store.hold(b"same", &fp(1)));
        let ib = b.push(store.hold(b"same", &fp(1)));
        let other = b.push(store.hold(b"else", &fp(2)));
        let longer = b.push(store.hold(b"same, longer", &fp(1)));
        let (Unit::Shared(x, _), Unit::Shared(y, _)) = (&a.units[0], &b.units[0]) else {
            panic!("stored units are shared");
        };
        assert!(Arc::ptr_eq(x, y), "identical bytes are held once");
        assert_eq!(a.units[0].bytes().as_ptr(), b.units[0].bytes().as_ptr());
        assert_eq!(
            (a.get(ia), b.get(ib)),
            (Some(&b"same"[..]), Some(&b"same"[..]))
        );
        assert_eq!(b.get(other), Some(&b"else"[..]));
        assert_eq!(
            b.get(longer),
            Some(&b"same, longer"[..]),
            "a fingerprint held at another length gets its own copy"
        );
        drop((a, b));
        let mut c = Window::new(100);
        let ic = c.push(store.hold(b"same", &fp(1)));
        assert_eq!(
            c.get(ic),
            Some(&b"same"[..]),
            "a dropped copy is made again"
        );
    }

    #[test]
    fn windows_holding_the_same_units_at_once_share_one_copy_of_each() {
        let store = UnitStore::default();
        // Spread over the store's shards, as real fingerprints are.
        let key = |k: usize| {
            let mut f = [0u8; 32];
            f[..8].copy_from_slice(&(k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
            Fingerprint(f)
        };
        // Every other unit has a slab of its own.
        let units: Vec<Vec<u8>> = (0..1000u32)
            .map(|k| {
                let len = 100 + k as usize + if k % 2 == 0 { SLAB_UNIT_MAX } else { 0 };
                (0..len as u32)
                    .map(|i| (i ^ k).wrapping_mul(31) as u8)
                    .collect()
            })
            .collect();
        let start = std::sync::Barrier::new(2);
        let held: Vec<Vec<Unit>> = std::thread::scope(|s| {
            let both: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        let hold = |(k, u): (usize, &Vec<u8>)| store.hold(u, &key(k));
                        units.iter().enumerate().map(hold).collect()
                    })
                })
                .collect();
            both.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for (k, (a, b)) in held[0].iter().zip(&held[1]).enumerate() {
            assert_eq!((a.bytes(), b.bytes()), (&units[k][..], &units[k][..]));
            let (Unit::Shared(x, rx), Unit::Shared(y, ry)) = (a, b) else {
                panic!("unit {k} is not in the store");
            };
            assert!(same_buffer(x, y) && rx == ry, "unit {k} was copied twice");
        }
    }

    #[test]
    fn blocks_of_evicted_units_hold_new_ones_and_big_units_get_their_own() {
        let store = UnitStore::default();
        let mut w = Window::new(4 * SLAB_BYTES as u64);
        let unit = |k: u32| -> Vec<u8> {
            let len = 1000 + (k as usize * 7919) % 9000;
            (0..len as u32)
                .map(|i| (i.wrapping_mul(2 * k + 1) >> 5) as u8)
                .collect()
        };
        let key = |k: u32| {
            let mut f = [0u8; 32];
            f[..4].copy_from_slice(&k.to_le_bytes());
            Fingerprint(f)
        };
        let mut ids = Vec::new();
        let (mut free_before, mut given_back) = (0, false);
        for k in 0..3000u32 {
            ids.push((w.push(store.hold(&unit(k), &key(k))), k));
            let free = store.free.lock().unwrap().blocks.len();
            // A window of four slabs lives on one region's 32 blocks for good.
            assert!(free >= 32 - 8, "free blocks are taken again: {free} left");
            given_back |= free > free_before;
            free_before = free;
        }
        assert!(given_back, "evicted units gave their blocks back");
        let held: Vec<_> = ids.iter().filter(|&&(id, _)| w.get(id).is_some()).collect();
        assert!(held.len() > 100 && held.len() < ids.len());
        for &&(id, k) in &held {
            assert_eq!(w.get(id), Some(&unit(k)[..]), "unit {k}");
        }
        for len in [3 * SLAB_BYTES, SLAB_UNIT_MAX + 1] {
            let big: Vec<u8> = (0..len as u32).map(|i| (i >> 9) as u8).collect();
            let id = w.push(store.hold(&big, &key(u32::MAX - len as u32)));
            let after = w.push(store.hold(&unit(7), &key(7)));
            assert_eq!(w.get(id), Some(&big[..]));
            assert_eq!(w.get(after), Some(&unit(7)[..]));
            // Where the open slab has no room: a block of the unit's length, not a slab's.
            assert_eq!(Slab::new(len, &store.free).block().cap, len);
        }
        assert_eq!(
            Slab::new(SLAB_UNIT_MAX, &store.free).block().cap,
            SLAB_BYTES
        );
    }

    #[test]
    fn a_populating_store_hands_each_new_region_to_its_hook_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static REGIONS: AtomicUsize = AtomicUsize::new(0);
        let store = UnitStore::with_populate(|region, len| {
            assert_eq!(len, REGION_BYTES);
            // SAFETY: the hook may write the new region, which nothing else refers to yet.
            unsafe { region.write_bytes(0xa5, len) };
            REGIONS.fetch_add(1, Ordering::Relaxed);
        });
        let units: Vec<Vec<u8>> = (0..40u32)
            .map(|k| (0..SLAB_UNIT_MAX as u32).map(|i| (i ^ k) as u8).collect())
            .collect();
        let held: Vec<Unit> = units
            .iter()
            .enumerate()
            .map(|(k, u)| {
                let mut fp = [0u8; 32];
                fp[..8].copy_from_slice(&(k as u64).to_le_bytes());
                store.hold(u, &Fingerprint(fp))
            })
            .collect();
        for (u, h) in units.iter().zip(&held) {
            assert_eq!(h.bytes(), &u[..]);
        }
        // 40 units of an eighth of a slab fill five slabs, in one region.
        assert_eq!(REGIONS.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_oldest_units_leave_first_and_the_newest_stays() {
        let mut w = Window::new(10);
        let a = w.push(Unit::Owned(vec![1; 6]));
        let b = w.push(Unit::Owned(vec![2; 6]));
        assert_eq!(w.get(a), None);
        assert_eq!(w.get(b), Some(&[2u8; 6][..]));
        let c = w.push(Unit::Owned(vec![3; 20]));
        assert_eq!((w.get(b), w.get(c).map(<[u8]>::len)), (None, Some(20)));
        assert_eq!(w.bytes(), 20);
    }
}
