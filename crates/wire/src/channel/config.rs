//! What a channel is configured with, how a configuration travels in the handshake, and the
//! rule by which two ends agree on one.
//!
//! The chunking levels and the identifier are plug-ins ([`Chunker`], [`Identifier`]): each has
//! a stable name and a parameter encoding, and a [`Registry`] turns names and parameters back
//! into algorithms on the other end. A user type is plugged in by registering the same name on
//! both ends.
//!
//! **Defaults** (`ChannelConfig::default()`): levels `[CDC 256 KiB avg, CDC 16 KiB avg]`,
//! delta on. Measured with `dedupwire-bench channel` on consecutive Django 4.2.x sdist tars
//! (59 MB each; bytes on the socket for releases 2 and 3): 16 KiB alone 0.95 + 0.62 MB,
//! `[256 KiB, 16 KiB]` 0.95 + 0.61, 32 KiB 0.96 + 0.73, 8 KiB 2.1 + 1.3, `[64 KiB, 16 KiB]`
//! 1.35 + 0.73, `[64 KiB, 4 KiB]` 1.93 + 1.29, `[64 KiB, 8 KiB, 1 KiB]` 3.3 + 2.8 (rsync -z
//! of the unpacked trees: 1.03 + 1.02). Every tar header changes between releases (mtimes), so
//! small exact chunks mostly buy ids (35 bytes each): a 16 KiB chunk with a changed header is a
//! ~100-byte delta against its predecessor, found by its super-features, while the id bill
//! grows with every halving. The 256 KiB level costs ~0.01% in ids and pays off wherever long
//! stretches are unchanged (images, archives of unchanged files); only what it misses is cut
//! again at 16 KiB. Identifier BLAKE3 (a peer must not be able to forge a collision into a
//! shared store), zstd level 3, adaptive mode, segments of 8 MiB with 4 in flight (32 MiB of
//! sender memory per stream at most).
//!
//! **Agreement**: the connecting end proposes its whole configuration; the listening end
//! accepts it when its registry knows every chunker and the identifier (with valid
//! parameters) and the identifier is its own (a chunk store holds one kind of id, and a weak
//! identifier must not be forced on a store by a peer). Everything else is the proposal's:
//! levels, compression, delta, mode, window and segment size then govern both directions.
//! A refusal names the element at fault, on both ends.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use dedupwire_engine::chunk::{self as engine_chunk, ChunkerSpec};
use dedupwire_engine::compress::Compression;

use crate::error::{Error, Result};
use crate::store::ChunkId;

/// Cuts bytes into chunks, the unit a dedup level looks up: one level of the channel.
pub trait Chunker: Send + Sync + fmt::Debug {
    /// The stable name both ends use for this algorithm in the handshake (1..=255 bytes).
    fn name(&self) -> &str;
    /// The parameters in a stable encoding, rebuilt by the registry's constructor.
    fn params(&self) -> Vec<u8>;
    /// Appends the lengths of the chunks of `data` (each ≥ 1, summing to `data.len()`).
    fn cut(&self, data: &[u8], out: &mut Vec<usize>);
}

/// Names a chunk by its content: what both ends compare to find redundant chunks.
pub trait Identifier: Send + Sync + fmt::Debug {
    /// The stable name both ends use for this algorithm in the handshake (1..=255 bytes).
    fn name(&self) -> &str;
    /// The parameters in a stable encoding, rebuilt by the registry's constructor.
    fn params(&self) -> Vec<u8> {
        Vec::new()
    }
    /// Bytes of an id on the wire (1..=32): the id is the first `id_len` bytes of a
    /// [`ChunkId`], the rest zero.
    fn id_len(&self) -> usize;
    /// The id of `data`.
    fn identify(&self, data: &[u8]) -> ChunkId;
}

/// A built-in chunker: whole-stream, fixed-size or FastCDC, from the engine.
pub struct EngineChunker {
    spec: ChunkerSpec,
    inner: Box<dyn engine_chunk::Chunker>,
}

impl fmt::Debug for EngineChunker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EngineChunker({})", self.spec.label())
    }
}

impl EngineChunker {
    /// The engine chunker for `spec`, its parameters checked.
    pub fn new(spec: ChunkerSpec) -> Result<EngineChunker> {
        let inner = spec
            .build()
            .map_err(|e| Error::Config(format!("chunker {}: {e}", spec.label())))?;
        Ok(EngineChunker { spec, inner })
    }

    /// The engine specification it was built from.
    pub fn spec(&self) -> ChunkerSpec {
        self.spec
    }

    fn from_params(name: &str, p: &[u8]) -> Result<Arc<dyn Chunker>> {
        let bad = || Error::Config(format!("chunker {name:?}: malformed parameters {p:02x?}"));
        let word = |i: usize| -> Result<usize> {
            let b = p.get(4 * i..4 * i + 4).ok_or_else(bad)?;
            Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        };
        let spec = match (name, p.len()) {
            ("whole", 0) => ChunkerSpec::Whole,
            ("fixed", 4) => ChunkerSpec::Fixed { size: word(0)? },
            ("cdc", 12) => ChunkerSpec::Cdc {
                min: word(0)?,
                avg: word(1)?,
                max: word(2)?,
            },
            _ => return Err(bad()),
        };
        Ok(Arc::new(EngineChunker::new(spec)?))
    }
}

impl Chunker for EngineChunker {
    fn name(&self) -> &str {
        match self.spec {
            ChunkerSpec::Whole => "whole",
            ChunkerSpec::Fixed { .. } => "fixed",
            ChunkerSpec::Cdc { .. } => "cdc",
        }
    }

    fn params(&self) -> Vec<u8> {
        let words: Vec<usize> = match self.spec {
            ChunkerSpec::Whole => vec![],
            ChunkerSpec::Fixed { size } => vec![size],
            ChunkerSpec::Cdc { min, avg, max } => vec![min, avg, max],
        };
        words
            .iter()
            .flat_map(|&w| (w.min(u32::MAX as usize) as u32).to_le_bytes())
            .collect()
    }

    fn cut(&self, mut data: &[u8], out: &mut Vec<usize>) {
        while !data.is_empty() {
            let n = self.inner.cut(data).clamp(1, data.len());
            out.push(n);
            data = &data[n..];
        }
    }
}

/// BLAKE3-256: collision resistant, the default identifier.
#[derive(Debug, Clone, Copy, Default)]
pub struct Blake3Id;

impl Identifier for Blake3Id {
    fn name(&self) -> &str {
        "blake3"
    }
    fn id_len(&self) -> usize {
        32
    }
    fn identify(&self, data: &[u8]) -> ChunkId {
        ChunkId(*blake3::hash(data).as_bytes())
    }
}

/// xxh3-128: about 5x faster than BLAKE3 and half the id bytes, for trusted peers only (a
/// collision is easy to construct).
#[derive(Debug, Clone, Copy, Default)]
pub struct Xxh3Id;

impl Identifier for Xxh3Id {
    fn name(&self) -> &str {
        "xxh3-128"
    }
    fn id_len(&self) -> usize {
        16
    }
    fn identify(&self, data: &[u8]) -> ChunkId {
        let mut id = [0u8; 32];
        id[..16].copy_from_slice(&dedupwire_engine::fingerprint::fast_id(data).to_le_bytes());
        ChunkId(id)
    }
}

/// Builds a chunker from its handshake parameters.
pub type ChunkerCtor = fn(&str, &[u8]) -> Result<Arc<dyn Chunker>>;
/// Builds an identifier from its handshake parameters.
pub type IdentifierCtor = fn(&str, &[u8]) -> Result<Arc<dyn Identifier>>;

/// The algorithms an end can build from a peer's proposal, by name.
#[derive(Clone)]
pub struct Registry {
    chunkers: HashMap<String, ChunkerCtor>,
    identifiers: HashMap<String, IdentifierCtor>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut c: Vec<_> = self.chunkers.keys().collect();
        let mut i: Vec<_> = self.identifiers.keys().collect();
        c.sort();
        i.sort();
        f.debug_struct("Registry")
            .field("chunkers", &c)
            .field("identifiers", &i)
            .finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        let mut r = Registry {
            chunkers: HashMap::new(),
            identifiers: HashMap::new(),
        };
        for name in ["whole", "fixed", "cdc"] {
            r.chunkers.insert(name.into(), EngineChunker::from_params);
        }
        r.identifiers.insert("blake3".into(), |n, p| {
            if !p.is_empty() {
                return Err(Error::Config(format!(
                    "identifier {n:?} takes no parameters"
                )));
            }
            Ok(Arc::new(Blake3Id))
        });
        r.identifiers.insert("xxh3-128".into(), |n, p| {
            if !p.is_empty() {
                return Err(Error::Config(format!(
                    "identifier {n:?} takes no parameters"
                )));
            }
            Ok(Arc::new(Xxh3Id))
        });
        r
    }
}

impl Registry {
    /// Adds (or replaces) the chunker called `name`.
    pub fn register_chunker(&mut self, name: &str, ctor: ChunkerCtor) {
        self.chunkers.insert(name.into(), ctor);
    }

    /// Adds (or replaces) the identifier called `name`.
    pub fn register_identifier(&mut self, name: &str, ctor: IdentifierCtor) {
        self.identifiers.insert(name.into(), ctor);
    }

    fn chunker(&self, name: &str, params: &[u8]) -> Result<Arc<dyn Chunker>> {
        let ctor = self.chunkers.get(name).ok_or_else(|| {
            Error::Config(format!(
                "chunker {name:?} is not registered on the listening end"
            ))
        })?;
        ctor(name, params)
    }

    fn identifier(&self, name: &str, params: &[u8]) -> Result<Arc<dyn Identifier>> {
        let ctor = self.identifiers.get(name).ok_or_else(|| {
            Error::Config(format!(
                "identifier {name:?} is not registered on the listening end"
            ))
        })?;
        let id = ctor(name, params)?;
        if !(1..=32).contains(&id.id_len()) {
            return Err(Error::Config(format!(
                "identifier {name:?} has {}-byte ids; 1..=32 are possible",
                id.id_len()
            )));
        }
        Ok(id)
    }
}

/// When a sender deduplicates and when it sends plain compressed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Measure both ways on this connection and use the faster, probing the other now and then.
    Adaptive,
    /// Always deduplicate: fewest bytes on the link.
    Dedup,
    /// Never deduplicate: compressed bytes only, as a plain socket with zstd would.
    Plain,
}

impl Mode {
    fn tag(self) -> u8 {
        match self {
            Mode::Adaptive => 0,
            Mode::Dedup => 1,
            Mode::Plain => 2,
        }
    }

    fn from_tag(t: u8) -> Result<Mode> {
        Ok(match t {
            0 => Mode::Adaptive,
            1 => Mode::Dedup,
            2 => Mode::Plain,
            _ => return Err(Error::Config(format!("unknown channel mode {t}"))),
        })
    }
}

/// The most chunking levels a configuration has.
pub const MAX_LEVELS: usize = 4;
/// The largest segment (unit of one request/data round): 32 MiB.
pub const MAX_SEGMENT: usize = 32 << 20;
/// The most segments in flight.
pub const MAX_WINDOW: usize = 64;

/// How a dedup channel cuts, names, compresses and paces what it sends.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    /// Chunking levels, coarsest first: chunks the receiver lacks at one level are cut again
    /// by the next (1..=[`MAX_LEVELS`]).
    pub levels: Vec<Arc<dyn Chunker>>,
    /// How chunks are named.
    pub identifier: Arc<dyn Identifier>,
    /// How data frames and plain segments are compressed.
    pub compression: Compression,
    /// Whether missing chunks may be sent as a delta against a similar chunk the receiver holds.
    pub delta: bool,
    /// Dedup, plain, or measure and choose.
    pub mode: Mode,
    /// Segments in flight at once (1..=[`MAX_WINDOW`]): the pipelining depth.
    pub window: usize,
    /// Bytes per segment (64 KiB..=[`MAX_SEGMENT`]): a message is sent in segments of at most
    /// this size (the adaptive mode's samples, and its plain segments on a fast link, are
    /// shorter).
    pub segment_size: usize,
    /// The longest message this end accepts (a local limit, not negotiated).
    pub max_message: u64,
    /// The algorithms this end can build from a peer's proposal.
    pub registry: Registry,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            levels: vec![
                Arc::new(EngineChunker::new(ChunkerSpec::cdc(256 << 10)).expect("valid")),
                Arc::new(EngineChunker::new(ChunkerSpec::cdc(16 << 10)).expect("valid")),
            ],
            identifier: Arc::new(Blake3Id),
            compression: Compression::Zstd(3),
            delta: true,
            mode: Mode::Adaptive,
            window: 4,
            segment_size: 8 << 20,
            max_message: 4 << 30,
            registry: Registry::default(),
        }
    }
}

/// The layout version of the configuration carried in the hello.
const CONFIG_FORMAT: u8 = 1;

impl ChannelConfig {
    /// The defaults with `levels` built from engine specifications.
    pub fn with_levels(specs: &[ChunkerSpec]) -> Result<ChannelConfig> {
        let mut c = ChannelConfig::default();
        c.levels = specs
            .iter()
            .map(|s| EngineChunker::new(*s).map(|c| Arc::new(c) as Arc<dyn Chunker>))
            .collect::<Result<_>>()?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the ranges of every field.
    pub fn validate(&self) -> Result<()> {
        if self.levels.is_empty() || self.levels.len() > MAX_LEVELS {
            return Err(Error::Config(format!(
                "a channel has 1..={MAX_LEVELS} chunking levels, got {}",
                self.levels.len()
            )));
        }
        if !(1..=MAX_WINDOW).contains(&self.window) {
            return Err(Error::Config(format!(
                "window must be 1..={MAX_WINDOW} segments, got {}",
                self.window
            )));
        }
        if !((64 << 10)..=MAX_SEGMENT).contains(&self.segment_size) {
            return Err(Error::Config(format!(
                "segment size must be 64 KiB..=32 MiB, got {} bytes",
                self.segment_size
            )));
        }
        if let Compression::Zstd(l) = self.compression {
            if !(-7..=22).contains(&l) {
                return Err(Error::Config(format!("zstd level {l} is out of -7..=22")));
            }
        }
        for c in &self.levels {
            check_name("chunker", c.name())?;
        }
        check_name("identifier", self.identifier.name())?;
        Ok(())
    }

    /// The configuration as carried in the hello's data (layout in `crates/wire/FORMAT.md`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![CONFIG_FORMAT, self.levels.len() as u8];
        for c in &self.levels {
            put_algorithm(&mut out, c.name(), &c.params());
        }
        put_algorithm(&mut out, self.identifier.name(), &self.identifier.params());
        let (tag, level) = match self.compression {
            Compression::Zstd(l) => (1u8, l as i8),
            c => (c.tag(), 0),
        };
        out.push(tag);
        out.push(level as u8);
        out.push(u8::from(self.delta));
        out.push(self.mode.tag());
        out.extend_from_slice(&(self.window as u16).to_le_bytes());
        out.extend_from_slice(&(self.segment_size as u32).to_le_bytes());
        out
    }

    /// Parses a peer's proposal with this end's registry (the local fields, `max_message` and
    /// `registry`, are this end's).
    pub fn decode(&self, bytes: &[u8]) -> Result<ChannelConfig> {
        let mut r = Cursor { bytes, pos: 0 };
        let format = r.u8()?;
        if format != CONFIG_FORMAT {
            return Err(Error::Config(format!(
                "the peer's channel configuration has layout version {format}; this end reads \
                 {CONFIG_FORMAT}"
            )));
        }
        let n = r.u8()? as usize;
        if n == 0 || n > MAX_LEVELS {
            return Err(Error::Config(format!(
                "the peer proposes {n} chunking levels; 1..={MAX_LEVELS} are possible"
            )));
        }
        let mut levels = Vec::with_capacity(n);
        for i in 0..n {
            let (name, params) = r.algorithm()?;
            let c = self
                .registry
                .chunker(&name, params)
                .map_err(|e| Error::Config(format!("level {}: {}", i + 1, inner_text(e))))?;
            levels.push(c);
        }
        let (name, params) = r.algorithm()?;
        let identifier = self.registry.identifier(&name, params)?;
        let tag = r.u8()?;
        let level = r.u8()? as i8;
        let compression = match tag {
            0 => Compression::None,
            1 => Compression::Zstd(i32::from(level)),
            2 => Compression::Lz4,
            t => return Err(Error::Config(format!("unknown compression method {t}"))),
        };
        let delta = match r.u8()? {
            0 => false,
            1 => true,
            d => return Err(Error::Config(format!("delta flag {d} is neither 0 nor 1"))),
        };
        let mode = Mode::from_tag(r.u8()?)?;
        let window = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes")) as usize;
        let segment_size = u32::from_le_bytes(r.take(4)?.try_into().expect("4 bytes")) as usize;
        if r.pos != bytes.len() {
            return Err(Error::Config(format!(
                "{} unexpected bytes after the channel configuration",
                bytes.len() - r.pos
            )));
        }
        let c = ChannelConfig {
            levels,
            identifier,
            compression,
            delta,
            mode,
            window,
            segment_size,
            max_message: self.max_message,
            registry: self.registry.clone(),
        };
        c.validate()?;
        Ok(c)
    }

    /// The listening end's rule: the configuration both ends use, given the connecting end's
    /// proposal, or why it is refused (naming the element at fault).
    pub fn accept(&self, proposal: &[u8]) -> Result<ChannelConfig> {
        let theirs = self.decode(proposal)?;
        if theirs.identifier.name() != self.identifier.name()
            || theirs.identifier.params() != self.identifier.params()
        {
            return Err(Error::Config(format!(
                "identifier mismatch: the connecting end proposes {:?}, the listening end's \
                 store holds {:?} ids",
                theirs.identifier.name(),
                self.identifier.name()
            )));
        }
        Ok(theirs)
    }

    /// A one-line description for logs and reports, e.g. `cdc(16384,65536,262144)+... blake3`.
    pub fn describe(&self) -> String {
        let levels: Vec<String> = self
            .levels
            .iter()
            .map(|c| format!("{}{:02x?}", c.name(), c.params()))
            .collect();
        format!(
            "levels [{}], {}, {}, delta {}, {:?}, window {}, segment {} B",
            levels.join(", "),
            self.identifier.name(),
            self.compression,
            if self.delta { "on" } else { "off" },
            self.mode,
            self.window,
            self.segment_size
        )
    }
}

fn inner_text(e: Error) -> String {
    match e {
        Error::Config(m) => m,
        e => e.to_string(),
    }
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(Error::Config(format!(
            "{what} name {name:?} must have 1..=255 bytes"
        )));
    }
    Ok(())
}

fn put_algorithm(out: &mut Vec<u8>, name: &str, params: &[u8]) {
    let name = &name.as_bytes()[..name.len().min(255)];
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    let params = &params[..params.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(params.len() as u16).to_le_bytes());
    out.extend_from_slice(params);
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let s = self
            .bytes
            .get(self.pos..self.pos.saturating_add(n))
            .ok_or_else(|| {
                Error::Config(format!(
                    "the peer's channel configuration is cut short at byte {}",
                    self.pos
                ))
            })?;
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn algorithm(&mut self) -> Result<(String, &'a [u8])> {
        let n = self.u8()? as usize;
        let name = std::str::from_utf8(self.take(n)?)
            .map_err(|_| Error::Config("an algorithm name is not UTF-8".into()))?
            .to_string();
        let p = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as usize;
        Ok((name, self.take(p)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_round_trips_through_the_handshake_encoding() {
        let c = ChannelConfig::default();
        let back = c.accept(&c.encode()).unwrap();
        assert_eq!(back.encode(), c.encode());
        assert_eq!(back.levels.len(), 2);
        let bytes = c.encode();
        for cut in 0..bytes.len() {
            assert!(c.decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn refusals_name_the_element() {
        let ours = ChannelConfig::default();
        let theirs = ChannelConfig {
            identifier: Arc::new(Xxh3Id),
            ..Default::default()
        };
        let e = ours.accept(&theirs.encode()).unwrap_err().to_string();
        assert!(
            e.contains("identifier mismatch") && e.contains("xxh3-128"),
            "{e}"
        );

        #[derive(Debug)]
        struct Odd;
        impl Chunker for Odd {
            fn name(&self) -> &str {
                "odd"
            }
            fn params(&self) -> Vec<u8> {
                vec![]
            }
            fn cut(&self, data: &[u8], out: &mut Vec<usize>) {
                out.push(data.len());
            }
        }
        let mut theirs = ChannelConfig::default();
        theirs.levels.push(Arc::new(Odd));
        let e = ours.accept(&theirs.encode()).unwrap_err().to_string();
        assert!(e.contains("level 3") && e.contains("\"odd\""), "{e}");

        let mut ours = ChannelConfig::default();
        ours.registry
            .register_chunker("odd", |_, _| Ok(Arc::new(Odd)));
        assert_eq!(ours.accept(&theirs.encode()).unwrap().levels.len(), 3);
    }

    #[test]
    fn engine_chunker_cuts_cover_the_input() {
        let c = EngineChunker::new(ChunkerSpec::cdc(1024)).unwrap();
        let data: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut lens = Vec::new();
        c.cut(&data, &mut lens);
        assert_eq!(lens.iter().sum::<usize>(), data.len());
        assert!(lens.len() > 20);
    }
}
