//! Reduction: how small each method makes real data, beside the oracle.
//!
//! Workloads: the shared document revision streams (one JSON write per item) and consecutive
//! releases of a real package's sources (one file per item, releases in order). Methods: zstd
//! per 4 MiB batch; exact CDC dedup at 4 KiB / 1 KiB / 256 B (raw and +zstd); similarity +
//! delta with sketches on whole items and with super-features on 8 KiB chunks (raw and +zstd);
//! and the **oracle**: each item delta-encoded against the known previous version of the same
//! document (or file path), each delta compressed alone, the smaller of that and the item
//! compressed alone. All dedup sizes come from the real pipeline's encoded stream, which is
//! decoded again and checked.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_engine::compress::Compression;
use dedupwire_engine::delta::DeltaSpec;
use dedupwire_engine::pipeline::{decode_all, encode_all, PipelineConfig};

/// Options of the reduction benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Directory of `*.jsonl.zst` document streams.
    #[arg(long, default_value = "../shared/data")]
    docs: PathBuf,
    /// Directory holding consecutive release trees (`bench/fetch-data.sh` makes them).
    #[arg(long, default_value = "target/bench-data/pkgs")]
    pkgs: PathBuf,
    /// Write the results as JSON to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Workload {
    name: String,
    /// A JSON-lines document stream (each item one line), which `replicate` can encode.
    documents: bool,
    /// (key of the document or file path, bytes), oldest first.
    items: Vec<(String, Vec<u8>)>,
}

fn load_docs(path: &Path) -> Result<Workload> {
    let file = std::fs::File::open(path).with_context(|| path.display().to_string())?;
    let reader = std::io::BufReader::new(zstd::Decoder::new(file)?);
    let mut items = Vec::new();
    for line in reader.lines() {
        let line = line?;
        let v: serde_json::Value = serde_json::from_str(&line).context("bad JSON line")?;
        let id = v["_id"].as_str().unwrap_or_default().to_string();
        items.push((id, line.into_bytes()));
    }
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .replace(".jsonl.zst", "");
    Ok(Workload {
        name,
        documents: true,
        items,
    })
}

fn load_releases(dir: &Path) -> Result<Workload> {
    let mut releases: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    releases.sort();
    if releases.len() < 2 {
        bail!(
            "{}: need at least two release trees (run bench/fetch-data.sh)",
            dir.display()
        );
    }
    let mut items = Vec::new();
    for rel in &releases {
        let mut files = Vec::new();
        collect_files(rel, &mut files)?;
        files.sort();
        for f in files {
            let key = f.strip_prefix(rel).unwrap_or(&f).display().to_string();
            items.push((key, std::fs::read(&f)?));
        }
    }
    let first = releases[0]
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    Ok(Workload {
        documents: false,
        name: format!("{first}..+{}", releases.len() - 1),
        items,
    })
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            collect_files(&e.path(), out)?;
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

struct Row {
    method: String,
    bytes: u64,
    encode_mb_s: Option<f64>,
    decode_mb_s: Option<f64>,
}

fn zstd_batches(items: &[(String, Vec<u8>)]) -> u64 {
    let mut out = 0;
    let mut batch = Vec::new();
    for (_, it) in items {
        batch.extend_from_slice(it);
        if batch.len() >= 4 << 20 {
            out += Compression::Zstd(3).compress(&batch).len() as u64;
            batch.clear();
        }
    }
    out + Compression::Zstd(3).compress(&batch).len() as u64
}

fn oracle(items: &[(String, Vec<u8>)]) -> (u64, u64) {
    let codec = DeltaSpec::Sampled.build();
    let mut prev: HashMap<&str, &[u8]> = HashMap::new();
    let (mut raw, mut zst) = (0u64, 0u64);
    let mut delta = Vec::new();
    for (key, it) in items {
        let alone = Compression::Zstd(3).compress(it).len() as u64;
        match prev.get(key.as_str()) {
            Some(p) => {
                delta.clear();
                codec.encode(p, it, &mut delta);
                raw += (delta.len() as u64).min(it.len() as u64);
                zst += (Compression::Zstd(3).compress(&delta).len() as u64).min(alone);
            }
            None => {
                raw += it.len() as u64;
                zst += alone;
            }
        }
        prev.insert(key, it);
    }
    (raw, zst)
}

/// sDedup as `dedupwire replicate encode` runs it: sources are the current versions only.
fn replicate_row(w: &Workload, input: u64) -> Result<Row> {
    use dedupwire_replicate::{jsonl, sdedup::SdedupConfig};
    let mut lines = Vec::with_capacity(input as usize + w.items.len());
    for (_, b) in &w.items {
        lines.extend_from_slice(b);
        lines.push(b'\n');
    }
    let t0 = Instant::now();
    let mut enc = Vec::new();
    jsonl::encode(&lines[..], &mut enc, SdedupConfig::default(), 4 << 20, None)?;
    let e = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut dec = Vec::new();
    jsonl::decode(&enc[..], &mut dec, SdedupConfig::default())?;
    let d = t1.elapsed().as_secs_f64();
    if dec != lines {
        bail!("replicate: decoded lines differ from the input");
    }
    Ok(Row {
        method: "sDedup replicate encode (+zstd)".into(),
        bytes: enc.len() as u64,
        encode_mb_s: Some(input as f64 / 1e6 / e),
        decode_mb_s: Some(input as f64 / 1e6 / d),
    })
}

fn pipeline_rows(
    name: &str,
    config: PipelineConfig,
    items: &[(String, Vec<u8>)],
    input: u64,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (suffix, compression) in [("", Compression::None), ("+zstd", Compression::Zstd(3))] {
        let config = PipelineConfig {
            compression,
            ..config
        };
        let t0 = Instant::now();
        let stream = encode_all(config, items.iter().map(|(_, b)| b.as_slice()), 4 << 20)?;
        let enc = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let back = decode_all(&stream)?;
        let dec = t1.elapsed().as_secs_f64();
        if back.len() != items.len() || back.iter().zip(items).any(|(a, (_, b))| a != b) {
            bail!("{name}{suffix}: decoded items differ from the input");
        }
        rows.push(Row {
            method: format!("{name}{suffix}"),
            bytes: stream.len() as u64,
            encode_mb_s: Some(input as f64 / 1e6 / enc),
            decode_mb_s: Some(input as f64 / 1e6 / dec),
        });
    }
    Ok(rows)
}

fn run_workload(w: &Workload) -> Result<serde_json::Value> {
    let input: u64 = w.items.iter().map(|(_, b)| b.len() as u64).sum();
    let mut rows = vec![Row {
        method: "zstd-3 per 4 MiB batch".into(),
        bytes: zstd_batches(&w.items),
        encode_mb_s: None,
        decode_mb_s: None,
    }];
    for avg in [4096, 1024, 256] {
        let config = PipelineConfig::exact(ChunkerSpec::cdc(avg));
        rows.extend(pipeline_rows(
            &format!("exact cdc-{}", dedupwire_engine::chunk::size_label(avg)),
            config,
            &w.items,
            input,
        )?);
    }
    rows.extend(pipeline_rows(
        "similarity sketch (whole items)",
        PipelineConfig::documents(),
        &w.items,
        input,
    )?);
    rows.extend(pipeline_rows(
        "similarity super-features (8 KiB chunks)",
        PipelineConfig::files(),
        &w.items,
        input,
    )?);
    if w.documents {
        rows.push(replicate_row(w, input)?);
    }
    let (oraw, ozst) = oracle(&w.items);
    rows.push(Row {
        method: "oracle: delta vs previous version".into(),
        bytes: oraw,
        encode_mb_s: None,
        decode_mb_s: None,
    });
    rows.push(Row {
        method: "oracle +zstd per item".into(),
        bytes: ozst,
        encode_mb_s: None,
        decode_mb_s: None,
    });

    println!(
        "\n## {} — {} items, {:.1} MB",
        w.name,
        w.items.len(),
        input as f64 / 1e6
    );
    println!(
        "{:<46} {:>12} {:>9} {:>10} {:>10} {:>10}",
        "method", "bytes", "ratio", "vs oracle", "enc MB/s", "dec MB/s"
    );
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    for r in &rows {
        println!(
            "{:<46} {:>12} {:>8.2}x {:>9.2}x {:>10} {:>10}",
            r.method,
            r.bytes,
            input as f64 / r.bytes.max(1) as f64,
            ozst as f64 / r.bytes.max(1) as f64,
            fmt(r.encode_mb_s),
            fmt(r.decode_mb_s)
        );
    }
    Ok(serde_json::json!({
        "workload": w.name,
        "items": w.items.len(),
        "input_bytes": input,
        "rows": rows.iter().map(|r| serde_json::json!({
            "method": r.method, "bytes": r.bytes, "ratio": input as f64 / r.bytes.max(1) as f64,
            "vs_oracle_zstd": ozst as f64 / r.bytes.max(1) as f64,
            "encode_mb_s": r.encode_mb_s, "decode_mb_s": r.decode_mb_s,
        })).collect::<Vec<_>>(),
    }))
}

/// Runs the reduction benchmark and prints one table per workload.
pub fn run(args: &Args) -> Result<()> {
    let mut workloads = Vec::new();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(&args.docs)
        .with_context(|| format!("{} (the shared document streams)", args.docs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.zst"))
        .collect();
    docs.sort();
    for d in docs {
        workloads.push(load_docs(&d)?);
    }
    workloads.push(load_releases(&args.pkgs)?);
    println!("reduction: bytes after each method; ratio = input/bytes; 'vs oracle' > 1 means smaller than the oracle (+zstd)");
    let mut results = Vec::new();
    for w in &workloads {
        results.push(run_workload(w)?);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
    }
    Ok(())
}
