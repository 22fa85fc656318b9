//! `dedupwire._dedupwire`: the native half of the `dedupwire` Python package.
//!
//! It wraps the dedup channel ([`DedupStream`], [`DedupListener`]), its shared [`Key`] and
//! the persistent chunk store ([`Environment`]) of `dedupwire-wire`. Channels are encrypted
//! with a key unless the caller says `insecure_plaintext=True`; with neither, `connect` and
//! `listen` refuse and say how to make a key. Every blocking call (connect, accept, send,
//! recv, close) releases the GIL, so a listener thread and a client can share one process.
//! Each stream sits behind a mutex taken with the GIL released: calls on one stream from
//! several threads queue up instead of deadlocking against the GIL. Every error of the
//! channel is raised as `dedupwire.DedupError` carrying the Rust message.
#![deny(missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_wire::{
    ChannelConfig, ChannelStats, ChunkStore, DedupListener, DedupStream, EnvConfig, Environment,
    Key, MemoryStore, Mode, Security, Transport,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

create_exception!(
    _dedupwire,
    DedupError,
    PyException,
    "An error of the dedup channel or its chunk store; the message is the Rust error's."
);

fn dedup_err(e: impl std::fmt::Display) -> PyErr {
    DedupError::new_err(e.to_string())
}

/// An address as Python gives it: `"host:port"` or a `(host, port)` tuple.
#[derive(FromPyObject)]
enum Address {
    /// `(host, port)`, as `socket` takes it.
    Pair(String, u16),
    /// `"host:port"`.
    Text(String),
}

impl Address {
    fn resolve(self) -> String {
        match self {
            Address::Pair(host, port) if host.contains(':') => format!("[{host}]:{port}"),
            Address::Pair(host, port) => format!("{host}:{port}"),
            Address::Text(s) => s,
        }
    }
}

fn parse_mode(mode: &str) -> PyResult<Mode> {
    match mode {
        "adaptive" => Ok(Mode::Adaptive),
        "dedup" => Ok(Mode::Dedup),
        "plain" => Ok(Mode::Plain),
        m => Err(PyValueError::new_err(format!(
            "mode must be \"adaptive\", \"dedup\" or \"plain\", got {m:?}"
        ))),
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Adaptive => "adaptive",
        Mode::Dedup => "dedup",
        Mode::Plain => "plain",
    }
}

/// The configuration a connecting end proposes: the defaults, with what the caller set.
fn channel_config(
    mode: &str,
    levels: Option<Vec<usize>>,
    segment_size: Option<usize>,
) -> PyResult<ChannelConfig> {
    let bad = |e: dedupwire_wire::Error| PyValueError::new_err(e.to_string());
    let mut config = match levels {
        Some(sizes) => {
            let specs: Vec<ChunkerSpec> = sizes.into_iter().map(ChunkerSpec::cdc).collect();
            ChannelConfig::with_levels(&specs).map_err(bad)?
        }
        None => ChannelConfig::default(),
    };
    config.mode = parse_mode(mode)?;
    if let Some(size) = segment_size {
        config.segment_size = size;
    }
    config.validate().map_err(bad)?;
    Ok(config)
}

/// A level as Python shows it: a CDC level's average chunk size, else its name and parameters.
fn level_value(py: Python<'_>, c: &dyn dedupwire_wire::Chunker) -> PyResult<PyObject> {
    let p = c.params();
    if c.name() == "cdc" && p.len() == 12 {
        let avg = u32::from_le_bytes([p[4], p[5], p[6], p[7]]);
        return Ok(avg.into_pyobject(py)?.into_any().unbind());
    }
    let hex: String = p.iter().map(|b| format!("{b:02x}")).collect();
    let text = if hex.is_empty() {
        c.name().to_string()
    } else {
        format!("{}:{hex}", c.name())
    };
    Ok(text.into_pyobject(py)?.into_any().unbind())
}

fn config_dict<'py>(py: Python<'py>, c: &ChannelConfig) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("mode", mode_name(c.mode))?;
    let levels = c
        .levels
        .iter()
        .map(|l| level_value(py, l.as_ref()))
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("levels", levels)?;
    d.set_item("segment_size", c.segment_size)?;
    d.set_item("window", c.window)?;
    d.set_item("identifier", c.identifier.name())?;
    d.set_item("compression", c.compression.to_string())?;
    d.set_item("delta", c.delta)?;
    Ok(d)
}

/// A key as Python gives it: a `Key`, or its text (64 hex digits or a passphrase).
#[derive(FromPyObject)]
enum KeyArg {
    /// A `dedupwire.Key`.
    Key(PyKey),
    /// 64 hexadecimal digits or a passphrase of 16+ characters.
    Text(String),
}

/// The security `key` and `insecure_plaintext` ask for; `end` names the call in errors.
fn security(key: Option<KeyArg>, insecure_plaintext: bool, end: &str) -> PyResult<Security> {
    match (key, insecure_plaintext) {
        (Some(_), true) => Err(DedupError::new_err(format!(
            "{end}: give either key= or insecure_plaintext=True, not both"
        ))),
        (Some(KeyArg::Key(k)), false) => Ok(Security::Key(k.inner)),
        (Some(KeyArg::Text(text)), false) => Key::from_text(&text, "key=")
            .map(Security::Key)
            .map_err(dedup_err),
        (None, true) => Ok(Security::InsecurePlaintext),
        (None, false) => Err(DedupError::new_err(format!(
            "{end}: no key. Channels are encrypted with a key both ends share: make one with \
             dedupwire.Key.generate() (save it with key.save(path), copy the file to the other \
             end, read it there with dedupwire.Key.load(path)) and pass key=... to both \
             connect and listen; a passphrase of 16+ characters as key=\"...\" works too. \
             insecure_plaintext=True on both ends sends everything unencrypted instead"
        ))),
    }
}

fn store_of(env: Option<&PyEnvironment>) -> Arc<dyn ChunkStore> {
    match env {
        Some(e) => e.inner.clone(),
        None => Arc::new(MemoryStore::new()),
    }
}

/// The key both ends of a channel share (32 bytes); its `repr` shows only its public id.
#[pyclass(name = "Key", module = "dedupwire", frozen, eq)]
#[derive(Clone, PartialEq)]
struct PyKey {
    inner: Key,
}

#[pymethods]
impl PyKey {
    /// A fresh random key.
    #[staticmethod]
    fn generate() -> PyResult<PyKey> {
        Key::generate()
            .map(|inner| PyKey { inner })
            .map_err(dedup_err)
    }

    /// The key in a key file: 64 hexadecimal digits (`key.save`, `dedupwire key generate`)
    /// or a passphrase of 16+ characters.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<PyKey> {
        Key::load(&path)
            .map(|inner| PyKey { inner })
            .map_err(dedup_err)
    }

    /// The key written as text: 64 hexadecimal digits, or a passphrase of 16+ characters.
    #[staticmethod]
    fn from_text(text: &str) -> PyResult<PyKey> {
        Key::from_text(text, "the key text")
            .map(|inner| PyKey { inner })
            .map_err(dedup_err)
    }

    /// Writes the key to a new file (readable by its owner only); an existing file is kept.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        self.inner.save(&path).map_err(dedup_err)
    }

    /// The key as 64 hexadecimal digits (a secret: whoever has it can join the channel).
    fn hex(&self) -> String {
        self.inner.to_hex()
    }

    /// A short public name of the key, equal on both ends when they hold the same key.
    #[getter]
    fn id(&self) -> String {
        self.inner.id()
    }

    fn __repr__(&self) -> String {
        format!("<dedupwire.Key id {}>", self.inner.id())
    }
}

/// A persistent, size-bounded chunk store in a directory, shared by every stream given it.
#[pyclass(name = "Environment", module = "dedupwire", frozen)]
struct PyEnvironment {
    inner: Arc<Environment>,
}

#[pymethods]
impl PyEnvironment {
    /// Opens (creating if needed) the environment in `path`.
    #[new]
    #[pyo3(signature = (path, max_bytes = None, segment_bytes = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        max_bytes: Option<u64>,
        segment_bytes: Option<u64>,
    ) -> PyResult<Self> {
        let mut config = EnvConfig::default();
        if let Some(s) = segment_bytes {
            config.segment_bytes = s;
        }
        if let Some(m) = max_bytes {
            config.max_bytes = m;
        }
        let env = py
            .allow_threads(|| Environment::open(&path, config))
            .map_err(dedup_err)?;
        Ok(PyEnvironment {
            inner: Arc::new(env),
        })
    }

    /// The directory it lives in.
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.dir().to_path_buf()
    }

    /// What it holds and has done, as a dict of counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("chunks", s.chunks),
            ("chunk_bytes", s.chunk_bytes),
            ("bytes", s.bytes),
            ("segments", s.segments),
            ("evictions", s.evictions),
            ("evicted_chunks", s.evicted_chunks),
            ("rescued_chunks", s.rescued_chunks),
            ("hits", s.hits),
            ("misses", s.misses),
            ("index_bytes", s.index_bytes),
            ("corrupt_dropped", s.corrupt_dropped),
            ("torn_bytes", s.torn_bytes),
            ("skipped_records", s.skipped_records),
            ("skipped_bytes", s.skipped_bytes),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Writes what was put so far to disk.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.inner.sync()).map_err(dedup_err)
    }

    fn __repr__(&self) -> String {
        format!("Environment({:?})", self.inner.dir().display().to_string())
    }
}

/// A deduplicating message channel: `send` a message, `recv` one.
#[pyclass(name = "Stream", module = "dedupwire", frozen)]
struct PyStream {
    inner: Mutex<Option<DedupStream<Transport>>>,
    config: ChannelConfig,
    encrypted: bool,
    peer: Option<SocketAddr>,
    peer_gone: AtomicBool,
    closed: AtomicBool,
    last_stats: Mutex<Option<ChannelStats>>,
}

impl PyStream {
    fn wrap(s: DedupStream<Transport>) -> PyStream {
        PyStream {
            config: s.config().clone(),
            encrypted: s.get_ref().is_encrypted(),
            peer: s.get_ref().peer_addr().ok(),
            inner: Mutex::new(Some(s)),
            peer_gone: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last_stats: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<DedupStream<Transport>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_open<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut DedupStream<Transport>) -> dedupwire_wire::Result<T> + Send,
    ) -> PyResult<T>
    where
        T: Send,
    {
        py.allow_threads(|| match self.lock().as_mut() {
            Some(s) => f(s).map_err(|e| {
                if e.is_peer_closed() {
                    self.peer_gone.store(true, Ordering::Relaxed);
                }
                e.to_string()
            }),
            None => Err("the stream is closed".to_string()),
        })
        .map_err(DedupError::new_err)
    }
}

#[pymethods]
impl PyStream {
    /// Sends `data` as one message; returns once the peer has rebuilt and verified it.
    fn send(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        self.with_open(py, |s| s.send(data))
    }

    /// The next message from the peer, verified end to end.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let m = self.with_open(py, |s| s.recv())?;
        Ok(PyBytes::new(py, &m))
    }

    /// Finishes what is in flight, says goodbye and drops the connection (only drops it once
    /// the peer is known to have gone); closing twice is allowed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.closed.store(true, Ordering::Relaxed);
        py.allow_threads(|| {
            let Some(s) = self.lock().take() else {
                return Ok(());
            };
            *self.last_stats.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.stats());
            if self.peer_gone.load(Ordering::Relaxed) {
                return Ok(());
            }
            s.close().map_err(|e| e.to_string())
        })
        .map_err(DedupError::new_err)
    }

    /// Whether `close` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// The settings both ends agreed on (the connecting end's proposal), as a dict: `mode`,
    /// `levels` (average chunk size of each CDC level, coarsest first), `segment_size`,
    /// `window`, `identifier`, `compression`, `delta`.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        config_dict(py, &self.config)
    }

    /// Whether the channel is encrypted and authenticated (false only with
    /// `insecure_plaintext=True`).
    #[getter]
    fn encrypted(&self) -> bool {
        self.encrypted
    }

    /// The peer's `(host, port)`.
    #[getter]
    fn peer_address(&self) -> Option<(String, u16)> {
        self.peer.map(|a| (a.ip().to_string(), a.port()))
    }

    /// What this end has moved so far, both directions, as a dict (after `close`, what it
    /// had moved when closed).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let last = self
            .last_stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let s = match last {
            Some(s) => s,
            None => self.with_open(py, |s| Ok(s.stats()))?,
        };
        stats_dict(py, &s)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        let how = if self.encrypted {
            "encrypted"
        } else {
            "INSECURE PLAINTEXT"
        };
        match self.peer {
            Some(a) => format!("<dedupwire.Stream to {a} ({how}, {state})>"),
            None => format!("<dedupwire.Stream ({how}, {state})>"),
        }
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &ChannelStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in [
        ("messages_sent", s.messages_sent),
        ("messages_received", s.messages_received),
        ("message_bytes_sent", s.message_bytes_sent),
        ("message_bytes_received", s.message_bytes_received),
        ("socket_bytes_sent", s.socket_bytes_sent),
        ("socket_bytes_received", s.socket_bytes_received),
        ("chunks_hit", s.chunks_hit),
        ("bytes_hit", s.bytes_hit),
        ("chunks_delta", s.chunks_delta),
        ("bytes_delta", s.bytes_delta),
        ("chunks_zdelta", s.chunks_zdelta),
        ("chunks_literal", s.chunks_literal),
        ("bytes_literal", s.bytes_literal),
        ("segments_plain", s.segments_plain),
        ("bytes_plain", s.bytes_plain),
        ("segments_kept", s.segments_kept),
        ("segments_dedup", s.segments_dedup),
        ("plain_estimates", s.plain_estimates),
        ("round_trips", s.round_trips),
        ("chunks_needed", s.chunks_needed),
        ("chunks_resent", s.chunks_resent),
    ] {
        d.set_item(k, v)?;
    }
    for (k, v) in [
        ("send_time", s.send_time.as_secs_f64()),
        ("recv_time", s.recv_time.as_secs_f64()),
        ("dedup_rate", s.dedup_rate),
        ("plain_rate", s.plain_rate),
        ("redundancy", s.redundancy()),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// Accepts dedup channels on a TCP port, all sharing one chunk store.
#[pyclass(name = "Listener", module = "dedupwire", frozen)]
struct PyListener {
    inner: Mutex<Option<Arc<DedupListener>>>,
    address: SocketAddr,
    encrypted: bool,
}

impl PyListener {
    fn get(&self) -> PyResult<Arc<DedupListener>> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| DedupError::new_err("the listener is closed"))
    }
}

#[pymethods]
impl PyListener {
    /// The `(host, port)` it listens on (the port chosen when bound to port 0).
    #[getter]
    fn address(&self) -> (String, u16) {
        (self.address.ip().to_string(), self.address.port())
    }

    /// Whether accepted channels are encrypted (false only with `insecure_plaintext=True`).
    #[getter]
    fn encrypted(&self) -> bool {
        self.encrypted
    }

    /// Waits for the next connection and returns it after the handshakes; a peer refused by
    /// them (another key, plaintext against encrypted) is a `DedupError` here, and the
    /// listener goes on accepting.
    fn accept(&self, py: Python<'_>) -> PyResult<PyStream> {
        let l = self.get()?;
        let s = py.allow_threads(|| l.accept()).map_err(dedup_err)?;
        Ok(PyStream::wrap(s))
    }

    /// Stops listening once no `accept` is running; closing twice is allowed.
    fn close(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Whether `close` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.close();
    }

    fn __repr__(&self) -> String {
        let how = if self.encrypted {
            "encrypted"
        } else {
            "INSECURE PLAINTEXT"
        };
        format!("<dedupwire.Listener on {} ({how})>", self.address)
    }
}

/// Listens on `addr` for channels encrypted with `key` (a `Key`, or 64 hex digits or a
/// passphrase of 16+ characters), or plaintext if `insecure_plaintext`; accepted streams keep
/// their chunks in `env`, or in one in-memory store shared by this listener's streams when
/// `env` is `None`. The settings of each channel are its connecting end's.
#[pyfunction]
#[pyo3(signature = (addr, *, key = None, insecure_plaintext = false, env = None))]
fn listen(
    py: Python<'_>,
    addr: Address,
    key: Option<KeyArg>,
    insecure_plaintext: bool,
    env: Option<PyRef<'_, PyEnvironment>>,
) -> PyResult<PyListener> {
    let security = security(key, insecure_plaintext, "listen")?;
    let encrypted = security.is_encrypted();
    let store = store_of(env.as_deref());
    let addr = addr.resolve();
    let l = py
        .allow_threads(|| DedupListener::bind(addr, security, store, ChannelConfig::default()))
        .map_err(dedup_err)?;
    let address = l.local_addr().map_err(dedup_err)?;
    Ok(PyListener {
        inner: Mutex::new(Some(Arc::new(l))),
        address,
        encrypted,
    })
}

/// Connects to a listener at `addr`, encrypted with `key` (as for `listen`) or plaintext if
/// `insecure_plaintext`, proposing `mode`, `levels` (average chunk sizes of the CDC levels,
/// coarsest first) and `segment_size` (the defaults when `None`), which the listener adopts;
/// chunks are kept in `env`, or in an in-memory store of this stream's own when `env` is
/// `None`.
#[pyfunction]
#[pyo3(signature = (
    addr, *, key = None, insecure_plaintext = false, env = None, mode = "adaptive",
    levels = None, segment_size = None
))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
fn connect(
    py: Python<'_>,
    addr: Address,
    key: Option<KeyArg>,
    insecure_plaintext: bool,
    env: Option<PyRef<'_, PyEnvironment>>,
    mode: &str,
    levels: Option<Vec<usize>>,
    segment_size: Option<usize>,
) -> PyResult<PyStream> {
    let config = channel_config(mode, levels, segment_size)?;
    let security = security(key, insecure_plaintext, "connect")?;
    let store = store_of(env.as_deref());
    let addr = addr.resolve();
    let s = py
        .allow_threads(|| DedupStream::connect(addr, security, store, config))
        .map_err(dedup_err)?;
    Ok(PyStream::wrap(s))
}

/// The native module: classes, functions and the exception the package re-exports.
#[pymodule]
fn _dedupwire(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DedupError", m.py().get_type::<DedupError>())?;
    m.add_class::<PyKey>()?;
    m.add_class::<PyEnvironment>()?;
    m.add_class::<PyStream>()?;
    m.add_class::<PyListener>()?;
    m.add_function(wrap_pyfunction!(listen, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
