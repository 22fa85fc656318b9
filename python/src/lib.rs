//! `dedupwire._dedupwire`: the native half of the `dedupwire` Python package.
//!
//! It wraps the dedup channel ([`DedupStream`], [`DedupListener`]) and the persistent chunk
//! store ([`Environment`]) of `dedupwire-wire`. Every blocking call (connect, accept, send,
//! recv, close) releases the GIL, so a listener thread and a client can share one process.
//! Each stream sits behind a mutex taken with the GIL released: calls on one stream from
//! several threads queue up instead of deadlocking against the GIL. Every error of the
//! channel is raised as `dedupwire.DedupError` carrying the Rust message.
#![deny(missing_docs)]

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dedupwire_wire::{
    ChannelConfig, ChannelStats, ChunkStore, DedupListener, DedupStream, EnvConfig, Environment,
    MemoryStore, Mode,
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

fn store_of(env: Option<&PyEnvironment>) -> Arc<dyn ChunkStore> {
    match env {
        Some(e) => e.inner.clone(),
        None => Arc::new(MemoryStore::new()),
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
    inner: Mutex<Option<DedupStream<TcpStream>>>,
    peer: Option<SocketAddr>,
    peer_gone: AtomicBool,
    closed: AtomicBool,
    last_stats: Mutex<Option<ChannelStats>>,
}

impl PyStream {
    fn wrap(s: DedupStream<TcpStream>) -> PyStream {
        PyStream {
            peer: s.get_ref().peer_addr().ok(),
            inner: Mutex::new(Some(s)),
            peer_gone: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last_stats: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<DedupStream<TcpStream>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_open<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut DedupStream<TcpStream>) -> dedupwire_wire::Result<T> + Send,
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
        match self.peer {
            Some(a) => format!("<dedupwire.Stream to {a} ({state})>"),
            None => format!("<dedupwire.Stream ({state})>"),
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
        ("chunks_literal", s.chunks_literal),
        ("bytes_literal", s.bytes_literal),
        ("segments_plain", s.segments_plain),
        ("bytes_plain", s.bytes_plain),
        ("segments_kept", s.segments_kept),
        ("segments_dedup", s.segments_dedup),
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

    /// Waits for the next connection and returns it after the handshake.
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
        format!("<dedupwire.Listener on {}>", self.address)
    }
}

/// Listens on `addr`; accepted streams keep their chunks in `env`, or in one in-memory store
/// shared by this listener's streams when `env` is `None`.
#[pyfunction]
#[pyo3(signature = (addr, env = None))]
fn listen(
    py: Python<'_>,
    addr: Address,
    env: Option<PyRef<'_, PyEnvironment>>,
) -> PyResult<PyListener> {
    let store = store_of(env.as_deref());
    let addr = addr.resolve();
    let l = py
        .allow_threads(|| DedupListener::bind(addr, store, ChannelConfig::default()))
        .map_err(dedup_err)?;
    let address = l.local_addr().map_err(dedup_err)?;
    Ok(PyListener {
        inner: Mutex::new(Some(Arc::new(l))),
        address,
    })
}

/// Connects to a listener at `addr`, proposing `mode`; chunks are kept in `env`, or in an
/// in-memory store of this stream's own when `env` is `None`.
#[pyfunction]
#[pyo3(signature = (addr, env = None, mode = "adaptive"))]
fn connect(
    py: Python<'_>,
    addr: Address,
    env: Option<PyRef<'_, PyEnvironment>>,
    mode: &str,
) -> PyResult<PyStream> {
    let store = store_of(env.as_deref());
    let config = ChannelConfig {
        mode: parse_mode(mode)?,
        ..ChannelConfig::default()
    };
    let addr = addr.resolve();
    let s = py
        .allow_threads(|| DedupStream::connect(addr, store, config))
        .map_err(dedup_err)?;
    Ok(PyStream::wrap(s))
}

/// The native module: classes, functions and the exception the package re-exports.
#[pymodule]
fn _dedupwire(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DedupError", m.py().get_type::<DedupError>())?;
    m.add_class::<PyEnvironment>()?;
    m.add_class::<PyStream>()?;
    m.add_class::<PyListener>()?;
    m.add_function(wrap_pyfunction!(listen, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
