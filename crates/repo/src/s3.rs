//! A repository in an S3-compatible object store: [`S3Backend`], for locations
//! `s3:http://HOST:PORT/BUCKET/PREFIX` (or `https://`), through Apache Arrow's `object_store`.
//!
//! Objects have the local layout's names under `PREFIX/` (`config`, `keys/NAME`,
//! `data/XX/NAME`, `index/NAME`, `snapshots/NAME`, `locks/NAME`). Create-once writes are
//! `PUT` with `If-None-Match: *` (412 means "already there"); objects from
//! [`S3Options::multipart_threshold`] bytes up are uploaded in parts, after a `HEAD` that finds
//! none of that name. Every request is retried with exponential backoff on connection errors,
//! 5xx, 408 and 429, and every request that got an answer is counted ([`Backend::stats`]).

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};
use object_store::path::Path;
use object_store::{
    BackoffConfig, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig, WriteMultipart,
};

use crate::backend::{check_name, Backend, BackendError, BackendStats, ObjectKind, OpStats};

/// How an [`S3Backend`] reaches its store: credentials, region, retries, multipart sizes.
#[derive(Clone)]
pub struct S3Options {
    /// The access key id (`AWS_ACCESS_KEY_ID`).
    pub access_key_id: String,
    /// The secret access key (`AWS_SECRET_ACCESS_KEY`).
    pub secret_access_key: String,
    /// A session token for temporary credentials (`AWS_SESSION_TOKEN`).
    pub session_token: Option<String>,
    /// The region requests are signed for (`AWS_DEFAULT_REGION`, else `AWS_REGION`, else
    /// `us-east-1`).
    pub region: String,
    /// How long a request is retried before its error is returned
    /// (`DEDUPWIRE_S3_RETRY_SECONDS`, default 120 s; at most 10 retries).
    pub retry_timeout: Duration,
    /// The first wait before a retry (doubling up to 15 s).
    pub first_backoff: Duration,
    /// The time one request may take, body included.
    pub request_timeout: Duration,
    /// Objects of this size and up are uploaded in parts (default 8 MiB).
    pub multipart_threshold: usize,
    /// The size of each part but the last (default 8 MiB; S3 requires at least 5 MiB).
    pub part_size: usize,
    /// Parts uploaded at once.
    pub part_concurrency: usize,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("access_key_id", &self.access_key_id)
            .field("region", &self.region)
            .field("retry_timeout", &self.retry_timeout)
            .field("multipart_threshold", &self.multipart_threshold)
            .field("part_size", &self.part_size)
            .finish_non_exhaustive()
    }
}

impl S3Options {
    /// Options from the usual AWS variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION` / `AWS_REGION`) and
    /// `DEDUPWIRE_S3_RETRY_SECONDS`.
    pub fn from_env(url: &str) -> Result<S3Options, BackendError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (Some(access_key_id), Some(secret_access_key)) =
            (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(remote(
                url,
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ));
        };
        let retry_timeout = match var("DEDUPWIRE_S3_RETRY_SECONDS") {
            None => Duration::from_secs(120),
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    remote(
                        url,
                        format!("DEDUPWIRE_S3_RETRY_SECONDS={v:?} is not a number of seconds"),
                    )
                })?,
        };
        let mut options = S3Options::new(&access_key_id, &secret_access_key);
        options.session_token = var("AWS_SESSION_TOKEN");
        if let Some(region) = var("AWS_DEFAULT_REGION").or_else(|| var("AWS_REGION")) {
            options.region = region;
        }
        options.retry_timeout = retry_timeout;
        Ok(options)
    }

    /// Options with these credentials and the defaults: region `us-east-1`, retries for up
    /// to 120 s, 8 MiB parts from 8 MiB up, 4 parts at once.
    pub fn new(access_key_id: &str, secret_access_key: &str) -> S3Options {
        S3Options {
            access_key_id: access_key_id.to_string(),
            secret_access_key: secret_access_key.to_string(),
            session_token: None,
            region: "us-east-1".to_string(),
            retry_timeout: Duration::from_secs(120),
            first_backoff: Duration::from_millis(100),
            request_timeout: Duration::from_secs(120),
            multipart_threshold: 8 << 20,
            part_size: 8 << 20,
            part_concurrency: 4,
        }
    }
}

/// An `s3:` location, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    /// `http://HOST:PORT` or `https://HOST[:PORT]`.
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The prefix objects go under, without slashes at either end (may be empty).
    pub prefix: String,
}

impl S3Url {
    /// Parses `s3:http://HOST:PORT/BUCKET/PREFIX` (`https://` too; no scheme means `https://`).
    pub fn parse(text: &str) -> Result<S3Url, BackendError> {
        let bad = |why: &str| {
            remote(
                text,
                format!("{why}: an S3 location is s3:http://HOST:PORT/BUCKET/PREFIX (or https://)"),
            )
        };
        let rest = text
            .strip_prefix("s3:")
            .ok_or_else(|| bad("not an s3: location"))?;
        let (scheme, rest) = if let Some(r) = rest.strip_prefix("http://") {
            ("http", r)
        } else if let Some(r) = rest.strip_prefix("https://") {
            ("https", r)
        } else if rest.starts_with("//") || rest.contains("://") {
            return Err(bad("the scheme must be http or https"));
        } else {
            ("https", rest)
        };
        let mut parts = rest.splitn(3, '/');
        let host = parts.next().unwrap_or_default();
        let bucket = parts.next().unwrap_or_default();
        let prefix = parts.next().unwrap_or_default().trim_matches('/');
        if host.is_empty() {
            return Err(bad("no host"));
        }
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        if host.contains(['?', '#', '@'])
            || bucket.contains(['?', '#'])
            || prefix.contains(['?', '#'])
        {
            return Err(bad("no query, fragment or user part allowed"));
        }
        if prefix
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
            && !prefix.is_empty()
        {
            return Err(bad("the prefix has an empty, `.` or `..` part"));
        }
        Ok(S3Url {
            endpoint: format!("{scheme}://{host}"),
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// Whether `text` names an S3 location (starts with `s3:`).
    pub fn is_s3(text: &str) -> bool {
        text.starts_with("s3:")
    }

    fn host_port(&self) -> String {
        let (scheme, host) = self.endpoint.split_once("://").unwrap_or(("https", ""));
        let has_port = match host.rfind(':') {
            Some(i) => !host.ends_with(']') && host[i + 1..].bytes().all(|b| b.is_ascii_digit()),
            None => false,
        };
        if has_port {
            host.to_string()
        } else if scheme == "http" {
            format!("{host}:80")
        } else {
            format!("{host}:443")
        }
    }
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3:{}/{}", self.endpoint, self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

/// A repository in an S3 bucket (see the module documentation).
pub struct S3Backend {
    url: S3Url,
    store: Arc<AmazonS3>,
    runtime: tokio::runtime::Runtime,
    counters: Arc<Counters>,
    options: S3Options,
}

impl std::fmt::Debug for S3Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Backend")
            .field("url", &self.url.to_string())
            .finish_non_exhaustive()
    }
}

impl S3Backend {
    /// A backend on `url` with `options`, without a request: nothing is checked yet.
    pub fn connect(url: S3Url, options: S3Options) -> Result<S3Backend, BackendError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let counters = Arc::new(Counters::default());
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: options.first_backoff,
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: 10,
            retry_timeout: options.retry_timeout,
        };
        let mut builder = AmazonS3Builder::new()
            .with_endpoint(&url.endpoint)
            .with_bucket_name(&url.bucket)
            .with_region(&options.region)
            .with_access_key_id(&options.access_key_id)
            .with_secret_access_key(&options.secret_access_key)
            .with_allow_http(url.endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false)
            .with_disable_bulk_delete(true)
            .with_retry(retry)
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(url.endpoint.starts_with("http://"))
                    .with_timeout(options.request_timeout)
                    .with_connect_timeout(Duration::from_secs(10)),
            )
            .with_http_connector(CountingConnector {
                counters: counters.clone(),
            });
        if let Some(token) = &options.session_token {
            builder = builder.with_token(token);
        }
        let store = builder
            .build()
            .map_err(|e| remote(url.to_string(), e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dedupwire-s3")
            .enable_all()
            .build()
            .map_err(|e| BackendError::Io {
                what: format!("{url}: starting the S3 client's runtime"),
                source: e,
            })?;
        Ok(S3Backend {
            url,
            store: Arc::new(store),
            runtime,
            counters,
            options,
        })
    }

    /// Opens the repository at `url` (the text after `--repo`) with credentials from the
    /// environment: the server must answer, the bucket exist, and `config` be there.
    pub fn open(url: &str) -> Result<S3Backend, BackendError> {
        S3Backend::open_with(url, S3Options::from_env(url)?)
    }

    /// [`S3Backend::open`] with these options.
    pub fn open_with(url: &str, options: S3Options) -> Result<S3Backend, BackendError> {
        let backend = S3Backend::connect(S3Url::parse(url)?, options)?;
        backend.probe()?;
        match backend.head(&backend.path(ObjectKind::Config, "config")) {
            Ok(Some(_)) => Ok(backend),
            Ok(None) => {
                backend.check_bucket()?;
                Err(BackendError::NoRepository(url.into()))
            }
            Err(e) => Err(backend.diagnose(e)),
        }
    }

    /// Prepares `url` for a new repository: the server must answer, the bucket exist, and
    /// nothing be stored under the prefix yet.
    pub fn create(url: &str) -> Result<S3Backend, BackendError> {
        S3Backend::create_with(url, S3Options::from_env(url)?)
    }

    /// [`S3Backend::create`] with these options.
    pub fn create_with(url: &str, options: S3Options) -> Result<S3Backend, BackendError> {
        let backend = S3Backend::connect(S3Url::parse(url)?, options)?;
        backend.probe()?;
        let root = backend.root();
        let found: Vec<Path> = backend
            .runtime
            .block_on(async {
                let mut list = backend.store.list(Some(&root)).take(1000);
                let mut out = Vec::new();
                while let Some(meta) = list.next().await {
                    out.push(meta?.location);
                }
                Ok::<_, object_store::Error>(out)
            })
            .map_err(|e| backend.error(&backend.url.to_string(), e))?;
        let under = |dir: &str| {
            let dir = backend.dir(dir);
            found.iter().any(|p| p.prefix_matches(&dir))
        };
        if found
            .iter()
            .any(|p| *p == backend.path(ObjectKind::Config, "config"))
        {
            return Err(BackendError::AlreadyExists(url.into()));
        }
        if under("keys") {
            return Err(BackendError::Unfinished(url.into()));
        }
        if !found.is_empty() {
            return Err(BackendError::NotEmpty(url.into()));
        }
        backend.check_create_once()?;
        Ok(backend)
    }

    /// Writes a probe object twice: a server that lets the second write through ignores
    /// `If-None-Match: *`, and a repository there could lose objects to concurrent writers.
    fn check_create_once(&self) -> Result<(), BackendError> {
        let mut salt = [0u8; 8];
        getrandom::fill(&mut salt).map_err(|e| remote(self.url.to_string(), e.to_string()))?;
        let name = format!("create-once-probe-{}", hex::encode(salt));
        let first = self.put_new(ObjectKind::Lock, &name, b"1")?;
        let second = self.put_new(ObjectKind::Lock, &name, b"2")?;
        self.delete(ObjectKind::Lock, &name)?;
        if first && !second {
            Ok(())
        } else {
            Err(remote(
                self.url.to_string(),
                "the server ignores `If-None-Match: *` (a second create-once write of an \
                 object went through): dedupwire needs conditional writes (AWS S3, MinIO, \
                 versitygw, Cloudflare R2 have them)",
            ))
        }
    }

    /// The location, as `s3:ENDPOINT/BUCKET/PREFIX`.
    pub fn url(&self) -> &S3Url {
        &self.url
    }

    fn root(&self) -> Path {
        Path::from(self.url.prefix.as_str())
    }

    fn dir(&self, sub: &str) -> Path {
        self.root().join(sub)
    }

    fn path(&self, kind: ObjectKind, name: &str) -> Path {
        relative(kind, name)
            .split('/')
            .fold(self.root(), |path, part| path.join(part))
    }

    fn what(&self, kind: ObjectKind, name: &str) -> String {
        format!("{}/{}", self.url, relative(kind, name))
    }

    /// Fails fast, without an HTTP request, when nothing listens at the endpoint.
    fn probe(&self) -> Result<(), BackendError> {
        let target = self.url.host_port();
        let addrs = target.to_socket_addrs().map_err(|e| {
            remote(
                self.url.to_string(),
                format!("cannot resolve the S3 server's address {target}: {e}"),
            )
        })?;
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(10)) {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(remote(
            self.url.to_string(),
            format!(
                "cannot connect to the S3 server at {}: {} (is it running?)",
                self.url.endpoint,
                last.map_or_else(|| "no address".to_string(), |e| e.to_string())
            ),
        ))
    }

    /// The object's size, or `None` when there is none of that name.
    fn head(&self, path: &Path) -> Result<Option<u64>, object_store::Error> {
        match self.runtime.block_on(self.store.head(path)) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A LIST of the prefix, whose error body says what is wrong (a HEAD's has no body).
    fn check_bucket(&self) -> Result<(), BackendError> {
        let root = self.root();
        self.runtime
            .block_on(self.store.list_with_delimiter(Some(&root)))
            .map(drop)
            .map_err(|e| self.error(&self.url.to_string(), e))
    }

    /// A HEAD's error made specific by a LIST of the prefix.
    fn diagnose(&self, e: object_store::Error) -> BackendError {
        match self.check_bucket() {
            Err(listed) => listed,
            Ok(()) => self.error(&self.url.to_string(), e),
        }
    }

    fn error(&self, what: &str, e: object_store::Error) -> BackendError {
        remote(what, describe(&self.url, &self.options, &e))
    }

    fn put_multipart(&self, path: &Path, bytes: &[u8]) -> Result<(), object_store::Error> {
        self.runtime.block_on(async {
            let upload = self.store.put_multipart(path).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, self.options.part_size);
            for part in bytes.chunks(self.options.part_size.max(1)) {
                if let Err(e) = writer
                    .wait_for_capacity(self.options.part_concurrency.max(1) - 1)
                    .await
                {
                    let _ = writer.abort().await;
                    return Err(e);
                }
                writer.put(Bytes::copy_from_slice(part));
            }
            writer.finish().await.map(drop)
        })
    }
}

impl Backend for S3Backend {
    fn list(&self, kind: ObjectKind) -> Result<Vec<(String, u64)>, BackendError> {
        if kind == ObjectKind::Config {
            let path = self.path(kind, "config");
            return match self.head(&path) {
                Ok(Some(size)) => Ok(vec![("config".to_string(), size)]),
                Ok(None) => Ok(Vec::new()),
                Err(e) => Err(self.error(&self.what(kind, "config"), e)),
            };
        }
        let dir = self.dir(kind.prefix());
        let metas = self
            .runtime
            .block_on(async {
                let mut list = self.store.list(Some(&dir));
                let mut out = Vec::new();
                while let Some(meta) = list.next().await {
                    out.push(meta?);
                }
                Ok::<_, object_store::Error>(out)
            })
            .map_err(|e| self.error(&format!("{}/{}/", self.url, kind.prefix()), e))?;
        let mut out = Vec::new();
        for meta in metas {
            let Some(parts) = meta.location.prefix_match(&dir) else {
                continue;
            };
            let parts: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
            let name = match (kind, parts.as_slice()) {
                (ObjectKind::Pack, [fan, name]) if name.get(..2) == Some(fan.as_str()) => name,
                (ObjectKind::Pack, _) => continue,
                (_, [name]) => name,
                _ => continue,
            };
            if check_name(kind, name).is_ok() {
                out.push((name.clone(), meta.size));
            }
        }
        Ok(out)
    }

    fn get(&self, kind: ObjectKind, name: &str) -> Result<Vec<u8>, BackendError> {
        check_name(kind, name)?;
        let path = self.path(kind, name);
        self.runtime
            .block_on(async { self.store.get(&path).await?.bytes().await })
            .map(|b| b.to_vec())
            .map_err(|e| self.object_error(kind, name, e))
    }

    fn get_range(
        &self,
        kind: ObjectKind,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, BackendError> {
        check_name(kind, name)?;
        let path = self.path(kind, name);
        if len == 0 {
            return match self.head(&path) {
                Ok(Some(_)) => Ok(Vec::new()),
                Ok(None) => Err(not_found(kind, name)),
                Err(e) => Err(self.object_error(kind, name, e)),
            };
        }
        let range = match offset.checked_add(len) {
            Some(end) if len < 1 << 62 => Some(GetRange::Bounded(offset..end)),
            _ if offset == 0 => None,
            _ => Some(GetRange::Offset(offset)),
        };
        let options = GetOptions {
            range,
            ..GetOptions::default()
        };
        let result = self
            .runtime
            .block_on(async { self.store.get_opts(&path, options).await?.bytes().await });
        match result {
            Ok(b) => Ok(b.to_vec()),
            Err(e) if is_unsatisfiable_range(&e) => match self.head(&path) {
                Ok(Some(_)) => Ok(Vec::new()),
                Ok(None) => Err(not_found(kind, name)),
                Err(e) => Err(self.object_error(kind, name, e)),
            },
            Err(e) => Err(self.object_error(kind, name, e)),
        }
    }

    fn put_new(&self, kind: ObjectKind, name: &str, bytes: &[u8]) -> Result<bool, BackendError> {
        check_name(kind, name)?;
        let path = self.path(kind, name);
        if bytes.len() >= self.options.multipart_threshold {
            return match self.head(&path) {
                Ok(Some(_)) => Ok(false),
                Ok(None) => self
                    .put_multipart(&path, bytes)
                    .map(|()| true)
                    .map_err(|e| self.object_error(kind, name, e)),
                Err(e) => Err(self.object_error(kind, name, e)),
            };
        }
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let payload = PutPayload::from(Bytes::copy_from_slice(bytes));
        match self
            .runtime
            .block_on(self.store.put_opts(&path, payload, options))
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.object_error(kind, name, e)),
        }
    }

    fn delete(&self, kind: ObjectKind, name: &str) -> Result<(), BackendError> {
        check_name(kind, name)?;
        let path = self.path(kind, name);
        match self.runtime.block_on(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.object_error(kind, name, e)),
        }
    }

    fn stats(&self) -> Option<BackendStats> {
        Some(self.counters.snapshot())
    }
}

impl S3Backend {
    fn object_error(&self, kind: ObjectKind, name: &str, e: object_store::Error) -> BackendError {
        match e {
            object_store::Error::NotFound { .. } if !is_no_such_bucket(&e) => not_found(kind, name),
            e => self.error(&self.what(kind, name), e),
        }
    }
}

/// An object's key under the prefix: the local layout's path.
fn relative(kind: ObjectKind, name: &str) -> String {
    match kind {
        ObjectKind::Config => "config".to_string(),
        ObjectKind::Pack => format!("data/{}/{name}", &name[..2.min(name.len())]),
        _ => format!("{}/{name}", kind.prefix()),
    }
}

fn not_found(kind: ObjectKind, name: &str) -> BackendError {
    match kind {
        ObjectKind::Config => BackendError::NotFound("config".to_string()),
        _ => BackendError::NotFound(format!("{}/{name}", kind.prefix())),
    }
}

fn remote(what: impl Into<String>, message: impl Into<String>) -> BackendError {
    BackendError::Remote {
        what: what.into(),
        message: message.into(),
    }
}

/// The whole chain of an error's causes, as text.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The text of `<TAG>…</TAG>` in an S3 error body.
fn xml_field(text: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = text.find(&open)? + open.len();
    let end = text[start..].find(&format!("</{tag}>"))? + start;
    Some(
        text[start..end]
            .replace("&#34;", "\"")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

fn is_no_such_bucket(e: &object_store::Error) -> bool {
    xml_field(&chain(e), "Code").as_deref() == Some("NoSuchBucket")
}

fn is_unsatisfiable_range(e: &object_store::Error) -> bool {
    let text = chain(e);
    text.contains("416") || xml_field(&text, "Code").as_deref() == Some("InvalidRange")
}

/// The transport error at the root of `e`, if it is one.
fn transport_error(e: &(dyn std::error::Error + 'static)) -> Option<(HttpErrorKind, String)> {
    let mut current = Some(e);
    while let Some(err) = current {
        if let Some(http) = err.downcast_ref::<HttpError>() {
            let mut root: &(dyn std::error::Error + 'static) = http;
            while let Some(s) = root.source() {
                root = s;
            }
            return Some((http.kind(), root.to_string()));
        }
        current = err.source();
    }
    None
}

/// What went wrong, in words a user acts on: credentials, the bucket, the server.
fn describe(url: &S3Url, options: &S3Options, e: &object_store::Error) -> String {
    let text = chain(e);
    let code = xml_field(&text, "Code");
    let said = match (&code, xml_field(&text, "Message")) {
        (Some(c), Some(m)) => format!(" (the server said {c}: {m})"),
        (Some(c), None) => format!(" (the server said {c})"),
        _ => String::new(),
    };
    let status = text
        .split("status code: ")
        .nth(1)
        .and_then(|s| s.split(':').next())
        .map(str::to_string);
    let denied = matches!(
        e,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    ) || status
        .as_deref()
        .is_some_and(|s| s.starts_with("401") || s.starts_with("403"))
        || matches!(
            code.as_deref(),
            Some("InvalidAccessKeyId" | "XAdminUserNotFound" | "SignatureDoesNotMatch")
        );
    match e {
        _ if denied => {
            let what = match code.as_deref() {
                Some("SignatureDoesNotMatch") => "the secret key does not match the access key",
                Some("InvalidAccessKeyId" | "XAdminUserNotFound") => {
                    "the server does not know the access key"
                }
                Some("RequestTimeTooSkewed") => "this machine's clock is too far off",
                _ => "access denied",
            };
            return format!(
                "{what}{said}: check AWS_ACCESS_KEY_ID ({}) and AWS_SECRET_ACCESS_KEY, and that \
                 they may use the bucket {}",
                options.access_key_id, url.bucket
            );
        }
        _ if code.as_deref() == Some("NoSuchBucket") => {
            return format!(
                "the bucket {} does not exist at {}: create it first (a repository is made \
                 inside an existing bucket)",
                url.bucket, url.endpoint
            );
        }
        _ => {}
    }
    if let Some((kind, root)) = transport_error(e) {
        let what = match kind {
            HttpErrorKind::Connect => "cannot connect to",
            HttpErrorKind::Timeout => "no answer in time from",
            _ => "lost the connection to",
        };
        return format!(
            "{what} the S3 server at {} ({root}), after retrying for up to {:?}",
            url.endpoint, options.retry_timeout
        );
    }
    if let Some(status) = status {
        return format!("the S3 server answered {status}{said}");
    }
    text
}

/// Requests and bytes, per kind of request.
#[derive(Default)]
struct Counters {
    ops: [OpCounter; 4],
}

#[derive(Default)]
struct OpCounter {
    requests: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> BackendStats {
        let op = |i: usize| {
            let c: &OpCounter = &self.ops[i];
            OpStats {
                requests: c.requests.load(Ordering::Relaxed),
                bytes_sent: c.sent.load(Ordering::Relaxed),
                bytes_received: c.received.load(Ordering::Relaxed),
            }
        };
        BackendStats {
            list: op(0),
            get: op(1),
            put: op(2),
            delete: op(3),
        }
    }
}

/// Which counter a request goes to: 0 list, 1 get (GET, HEAD), 2 put (PUT, POST: parts and
/// multipart starts and ends too), 3 delete (an abandoned multipart upload's abort too).
fn op_of(req: &HttpRequest) -> usize {
    match *req.method() {
        http::Method::GET => {
            let query = req.uri().query().unwrap_or("");
            if query
                .split('&')
                .any(|q| q.starts_with("list-type") || q == "uploads")
            {
                0
            } else {
                1
            }
        }
        http::Method::POST if req.uri().query() == Some("delete") => 3,
        http::Method::PUT | http::Method::POST => 2,
        http::Method::DELETE => 3,
        _ => 1,
    }
}

#[derive(Debug)]
struct CountingConnector {
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(CountingService {
            inner: ReqwestConnector::default().connect(options)?,
            counters: self.counters.clone(),
        }))
    }
}

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let op = op_of(&req);
        let sent = req.body().content_length() as u64;
        let response = self.inner.execute(req).await?;
        let counters = self.counters.clone();
        let counter = &counters.ops[op];
        counter.requests.fetch_add(1, Ordering::Relaxed);
        counter.sent.fetch_add(sent, Ordering::Relaxed);
        Ok(response.map(|body| {
            HttpResponseBody::new(body.map_frame(move |frame| {
                if let Some(data) = frame.data_ref() {
                    counters.ops[op]
                        .received
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                frame
            }))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = S3Url::parse("s3:http://127.0.0.1:9000/bucket/some/prefix/").unwrap();
        assert_eq!(u.endpoint, "http://127.0.0.1:9000");
        assert_eq!(u.bucket, "bucket");
        assert_eq!(u.prefix, "some/prefix");
        assert_eq!(u.to_string(), "s3:http://127.0.0.1:9000/bucket/some/prefix");
        assert_eq!(u.host_port(), "127.0.0.1:9000");
        let u = S3Url::parse("s3:s3.eu-west-1.amazonaws.com/b").unwrap();
        assert_eq!(u.endpoint, "https://s3.eu-west-1.amazonaws.com");
        assert_eq!(u.prefix, "");
        assert_eq!(u.host_port(), "s3.eu-west-1.amazonaws.com:443");
        assert_eq!(S3Url::parse("s3:http://h/b").unwrap().host_port(), "h:80");
        for bad in [
            "s3:",
            "s3:http://",
            "s3:http://host",
            "s3:http://host/",
            "s3:ftp://host/b",
            "s3://bucket/prefix",
            "s3:http://host/b/a//c",
            "s3:http://host/b/../c",
            "s3:http://host/b?x=1",
            "/local/dir",
        ] {
            let err = S3Url::parse(bad).unwrap_err();
            assert!(
                err.to_string()
                    .contains("s3:http://HOST:PORT/BUCKET/PREFIX"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn error_bodies() {
        let body = "<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not \
                    exist.</Message></Error>";
        assert_eq!(xml_field(body, "Code").as_deref(), Some("NoSuchBucket"));
        assert_eq!(
            xml_field(body, "Message").as_deref(),
            Some("The specified bucket does not exist.")
        );
        assert_eq!(xml_field("<Code>a&amp;b", "Code"), None);
        assert_eq!(
            xml_field("<Code>&#34;x&#34;</Code>", "Code").as_deref(),
            Some("\"x\"")
        );
    }

    #[test]
    fn missing_credentials_are_named() {
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
            return;
        }
        let err = S3Options::from_env("s3:http://h/b").unwrap_err();
        assert!(err.to_string().contains("AWS_ACCESS_KEY_ID"), "{err}");
    }
}
