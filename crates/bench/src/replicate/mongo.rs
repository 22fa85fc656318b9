//! The MongoDB rows of the replicate benchmark: the same document stream written to a FerretDB
//! server (MongoDB protocol, `app.docs`, one command per write, each JSON line a document with
//! its `_id`), then replicated by dedupwire from its oplog to a second FerretDB server over a
//! 127.0.0.1 socket, bytes counted both directions, replica compared document by document.
//!
//! The comparison is the oplog itself: the BSON size of the stream's oplog entries, which is
//! what a MongoDB secondary fetches (before OP_MSG framing and its optional wire compression).
//! The load runs first and dedupwire drains the backlog, so the sender's delta sources, read
//! from the source's *current* documents, are sometimes newer than the replica's (those
//! entries are re-sent raw, counted).

use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use dedupwire_replicate::live::{Receiver, Sender, SenderConfig};
use dedupwire_replicate::mongo::server::{find_binary, FerretServer};
use dedupwire_replicate::mongo::{MongoDocStore, MongoSink, MongoSource, MongoSourceConfig};
use dedupwire_replicate::Op;
use mongodb::bson::{doc, Bson, Document};

use super::{Counted, Counters, Write1};

const DB: &str = "app";
const COLL: &str = "docs";

fn document(w: &Write1) -> Result<Document> {
    let json: serde_json::Value = serde_json::from_str(&w.line)?;
    match Bson::try_from(json)? {
        Bson::Document(mut d) => {
            d.insert("_id", w.id.clone());
            Ok(d)
        }
        _ => bail!("line of {} is not an object", w.id),
    }
}

/// Writes the stream to `app.docs`; returns the wall time.
fn load(server: &FerretServer, writes: &[Write1]) -> Result<Duration> {
    let client = server.client().map_err(|e| anyhow!(e))?;
    let coll = client.database(DB).collection::<Document>(COLL);
    let t0 = Instant::now();
    for w in writes {
        let id = doc! {"_id": &w.id};
        match w.op {
            Op::Delete => {
                coll.delete_one(id).run()?;
            }
            Op::Insert | Op::Update => {
                coll.replace_one(id, document(w)?).upsert(true).run()?;
            }
        }
    }
    Ok(t0.elapsed())
}

fn all_docs(server: &FerretServer) -> Result<Vec<Vec<u8>>> {
    let client = server.client().map_err(|e| anyhow!(e))?;
    let mut docs = client
        .database(DB)
        .collection::<Document>(COLL)
        .find(doc! {})
        .run()?
        .map(|d| Ok(mongodb::bson::to_vec(&d?)?))
        .collect::<Result<Vec<_>>>()?;
    docs.sort();
    Ok(docs)
}

fn oplog_bytes(server: &FerretServer) -> Result<(u64, u64)> {
    let client = server.client().map_err(|e| anyhow!(e))?;
    let (mut bytes, mut entries) = (0, 0);
    for d in client
        .database("local")
        .collection::<Document>("oplog.rs")
        .find(doc! {"ns": format!("{DB}.{COLL}")})
        .run()?
    {
        bytes += mongodb::bson::to_vec(&d?)?.len() as u64;
        entries += 1;
    }
    Ok((bytes, entries))
}

/// Runs the MongoDB rows for one workload; prints them and returns them as JSON.
pub(super) fn run(name: &str, writes: &[Write1], timeout: Duration) -> Result<serde_json::Value> {
    let binary = find_binary(true).map_err(|e| anyhow!(e))?;
    let src = FerretServer::start(&binary, timeout).map_err(|e| anyhow!(e))?;
    let dst = FerretServer::start(&binary, timeout).map_err(|e| anyhow!(e))?;
    let load = load(&src, writes)?;
    let (oplog, entries) = oplog_bytes(&src)?;

    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let dst_url = dst.url("");
    let receiver = thread::spawn(move || -> Result<_> {
        let (stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        let mut r = Receiver::default();
        r.run(stream, |stream| MongoSink::connect(&dst_url, stream))
            .map_err(|e| anyhow!("receiver: {e}"))?;
        Ok(r.summary().clone())
    });
    let mut source = MongoSource::connect(&src.url(DB), MongoSourceConfig::default())?;
    let mut store = MongoDocStore::connect(&src.url(DB))?;
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    let counters = Counters::default();
    let mut s = Sender::new(SenderConfig {
        stream: "bench".into(),
        until_drained: true,
        idle_sleep: Duration::from_millis(20),
        ..SenderConfig::default()
    });
    let t0 = Instant::now();
    s.run(
        Counted {
            inner: stream,
            counters: counters.clone(),
        },
        &mut source,
        &mut store,
    )
    .map_err(|e| anyhow!("sender: {e}"))?;
    let recv = receiver
        .join()
        .map_err(|_| anyhow!("receiver thread panicked"))??;
    let drain = t0.elapsed();
    let wire = counters.total();
    let send = s.summary().clone();
    let (a, b) = (all_docs(&src)?, all_docs(&dst)?);
    if a != b {
        bail!(
            "the FerretDB replica differs from the source ({} vs {} documents)",
            b.len(),
            a.len()
        );
    }
    println!(
        "\n## {name} on the MongoDB protocol (FerretDB v1.24, SQLite) — {entries} oplog \
         entries, loaded in {:.1} s",
        load.as_secs_f64()
    );
    println!("{:<44} {:>12} {:>9}", "method", "bytes", "vs oplog");
    for (method, bytes) in [
        ("MongoDB oplog entries (BSON)", oplog),
        ("documents + ids (raw changes)", send.raw_bytes),
        ("dedupwire live (sDedup, zstd-3)", wire),
    ] {
        println!(
            "{method:<44} {bytes:>12} {:>8.2}x",
            oplog as f64 / bytes.max(1) as f64
        );
    }
    println!(
        "dedupwire: {} changes in {} batches, {} deltas / {} literals, {} entries re-sent raw; \
         drained in {:.1} s; replica verified document by document ({} documents)",
        send.changes,
        send.batches,
        send.encode.deltas,
        send.encode.literals,
        send.raw_entries,
        drain.as_secs_f64(),
        a.len()
    );
    Ok(serde_json::json!({
        "workload": name,
        "server": "FerretDB v1.24.0 (sqlite)",
        "oplog_entries": entries,
        "oplog_bytes": oplog,
        "raw_change_bytes": send.raw_bytes,
        "dedupwire_bytes": wire,
        "fewer_bytes_than_oplog": oplog as f64 / wire.max(1) as f64,
        "load_s": load.as_secs_f64(),
        "drain_s": drain.as_secs_f64(),
        "documents_verified": a.len(),
        "send": send,
        "receive": recv,
    }))
}
