//! Delta benchmark: our sampled codec vs zstd reference-prefix (levels 3 and 19) vs the
//! `xdelta3 -9` and `zstd --patch-from -19` tools, on three pair sets built from
//! `bench/fetch-data.sh` output:
//!
//! - `docs:<stream>`: for each update in `docs/<stream>.jsonl`, (previous body of the same
//!   `_id`, new body), the first `--pairs` of each stream;
//! - `pkgs`: files at the same relative path in consecutive `pkgs/django-*` trees whose
//!   contents differ;
//! - `tar`: an uncompressed tar of the first tree vs one of the second;
//! - `binary`: pyarrow's `libarrow.so` from the 14.0.1 and 14.0.2 wheels (61 MB, a rebuilt
//!   shared library), when `LINKS=1 bench/fetch-data.sh` has fetched them.
//!
//! Speeds are single-threaded, the median of `--runs` runs, in MB (10^6 bytes) of target per
//! second. External tools are spawned once per pair, so their speed is only printed for the
//! big pairs. Every decode of ours (and of the tools' on the big pairs) is checked against the
//! target. `batch z3` is the sum of a set's deltas compressed together with zstd -3 in 4 MiB
//! batches, as the pipeline ships them (for the `none` row: the targets themselves).

use std::cmp::Ordering;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use dedupwire_engine::delta::{DeltaCodec, Sampled, ZstdRef, WINDOWS};
use serde_json::json;

/// Options of the delta benchmark.
#[derive(clap::Args)]
pub struct Args {
    /// Benchmark data (made by `bench/fetch-data.sh`).
    #[arg(long, default_value = "target/bench-data")]
    data: PathBuf,
    /// Pairs taken from each document stream.
    #[arg(long, default_value_t = 3000)]
    pairs: usize,
    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Skip the external tools (xdelta3, zstd --patch-from).
    #[arg(long)]
    no_external: bool,
    /// Skip the big pairs (tar, binary).
    #[arg(long)]
    no_tar: bool,
    /// Also sweep our codec's window and stride on the document and package sets.
    #[arg(long)]
    sweep: bool,
    /// Writes the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Pair {
    source: Vec<u8>,
    target: Vec<u8>,
}

struct PairSet {
    name: String,
    pairs: Vec<Pair>,
    /// External tools' speed is meaningful (one big pair).
    big: bool,
}

impl PairSet {
    fn target_bytes(&self) -> u64 {
        self.pairs.iter().map(|p| p.target.len() as u64).sum()
    }
}

/// The compression-only baseline row: the targets themselves, batch-compressed.
const NONE: &str = "none (targets)";

#[derive(Default, Clone)]
struct Row {
    set: String,
    pairs: usize,
    codec: String,
    target_bytes: u64,
    delta_bytes: u64,
    enc_mbps: Option<f64>,
    dec_mbps: Option<f64>,
    vs_xdelta: Option<f64>,
    batch_z3: Option<u64>,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.target_bytes as f64 / self.delta_bytes.max(1) as f64
    }
}

/// Runs the delta benchmark and prints its table.
pub fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    let data = &args.data;
    ensure!(
        data.join("docs").is_dir() && data.join("pkgs").is_dir(),
        "no benchmark data under {} (run bench/fetch-data.sh)",
        data.display()
    );
    let tmp = TempDir::new()?;
    let mut sets = doc_sets(&data.join("docs"), args.pairs)?;
    let trees = django_trees(&data.join("pkgs"))?;
    sets.push(pkg_set(&trees)?);
    if !args.no_tar {
        sets.push(tar_set(&trees, &tmp.0)?);
        match binary_set(&data.join("links/wheel-pyarrow"))? {
            Some(set) => sets.push(set),
            None => {
                eprintln!("binary: no pyarrow wheels (LINKS=1 bench/fetch-data.sh fetches them)")
            }
        }
    }
    let external = !args.no_external && tools_present()?;

    if args.sweep {
        sweep(&sets, args.runs);
    }

    let ours = Sampled::default();
    let z1 = ZstdRef::new(1);
    let z3 = ZstdRef::new(3);
    let z19 = ZstdRef::new(19);
    let codecs: [(&str, &dyn DeltaCodec); 4] = [
        ("ours (sampled)", &ours),
        ("zstd-ref -1", &z1),
        ("zstd-ref -3", &z3),
        ("zstd-ref -19", &z19),
    ];
    let mut rows = Vec::new();
    for set in &sets {
        eprintln!(
            "{}: {} pairs, {} target bytes",
            set.name,
            set.pairs.len(),
            set.target_bytes()
        );
        let mut set_rows = Vec::new();
        {
            let targets: Vec<&[u8]> = set.pairs.iter().map(|p| &p.target[..]).collect();
            set_rows.push(Row {
                set: set.name.clone(),
                pairs: set.pairs.len(),
                codec: NONE.into(),
                target_bytes: set.target_bytes(),
                delta_bytes: set.target_bytes(),
                batch_z3: Some(batch_z3(&targets)),
                ..Row::default()
            });
        }
        for (name, codec) in codecs {
            set_rows.push(measure(set, name, codec, args.runs)?);
        }
        if external {
            for tool in [Tool::Xdelta3, Tool::ZstdPatch] {
                set_rows.push(measure_tool(set, tool, args.runs, &tmp.0)?);
            }
            let xd = set_rows
                .iter()
                .find(|r| r.codec == Tool::Xdelta3.name())
                .map(|r| r.delta_bytes);
            if let Some(xd) = xd {
                for r in set_rows.iter_mut().filter(|r| r.codec != NONE) {
                    r.vs_xdelta = Some(xd as f64 / r.delta_bytes.max(1) as f64);
                }
            }
        }
        rows.extend(set_rows);
    }
    print_table(&rows);
    if let Some(path) = &args.json {
        let doc: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "set": r.set, "pairs": r.pairs, "codec": r.codec,
                    "target_bytes": r.target_bytes, "delta_bytes": r.delta_bytes,
                    "ratio": r.ratio(), "encode_mb_s": r.enc_mbps, "decode_mb_s": r.dec_mbps,
                    "vs_xdelta3": r.vs_xdelta, "batch_zstd3_bytes": r.batch_z3,
                })
            })
            .collect();
        fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    let opt = |v: Option<f64>, prec: usize| match v {
        Some(v) => format!("{v:.prec$}"),
        None => "-".into(),
    };
    println!(
        "{:<16} {:>6} {:<16} {:>12} {:>11} {:>8} {:>9} {:>9} {:>8} {:>10} {:>8}",
        "set",
        "pairs",
        "codec",
        "target B",
        "delta B",
        "ratio",
        "enc MB/s",
        "dec MB/s",
        "vs xd3",
        "batch z3 B",
        "b ratio"
    );
    for r in rows {
        println!(
            "{:<16} {:>6} {:<16} {:>12} {:>11} {:>8.2} {:>9} {:>9} {:>8} {:>10} {:>8}",
            r.set,
            r.pairs,
            r.codec,
            r.target_bytes,
            r.delta_bytes,
            r.ratio(),
            opt(r.enc_mbps, 0),
            opt(r.dec_mbps, 0),
            opt(r.vs_xdelta, 2),
            r.batch_z3.map_or("-".into(), |b| b.to_string()),
            opt(
                r.batch_z3.map(|b| r.target_bytes as f64 / b.max(1) as f64),
                2
            ),
        );
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64().max(1e-9)
}

/// Our codecs: encode and decode every pair, `runs` times each; verify every decode.
fn measure(set: &PairSet, name: &str, codec: &dyn DeltaCodec, runs: usize) -> anyhow::Result<Row> {
    let mut deltas: Vec<Vec<u8>> = Vec::with_capacity(set.pairs.len());
    let mut enc = Vec::new();
    let mut buf = Vec::new();
    for run in 0..runs {
        let t = Instant::now();
        for p in &set.pairs {
            buf.clear();
            codec.encode(&p.source, &p.target, &mut buf);
            if run == 0 {
                deltas.push(buf.clone());
            }
        }
        enc.push(t.elapsed());
    }
    // Verify, then time decoding alone.
    for (p, d) in set.pairs.iter().zip(&deltas) {
        buf.clear();
        codec
            .decode(&p.source, d, p.target.len(), &mut buf)
            .with_context(|| format!("{name} failed to decode its own delta on {}", set.name))?;
        ensure!(
            buf == p.target,
            "{name} decoded a wrong target on {}",
            set.name
        );
    }
    let mut dec = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        for (p, d) in set.pairs.iter().zip(&deltas) {
            buf.clear();
            codec.decode(&p.source, d, p.target.len(), &mut buf)?;
        }
        dec.push(t.elapsed());
    }
    let target_bytes = set.target_bytes();
    let refs: Vec<&[u8]> = deltas.iter().map(|d| &d[..]).collect();
    Ok(Row {
        set: set.name.clone(),
        pairs: set.pairs.len(),
        codec: name.into(),
        target_bytes,
        delta_bytes: deltas.iter().map(|d| d.len() as u64).sum(),
        enc_mbps: Some(mbps(target_bytes, median(enc))),
        dec_mbps: Some(mbps(target_bytes, median(dec))),
        vs_xdelta: None,
        batch_z3: Some(batch_z3(&refs)),
    })
}

/// Size of `items` concatenated and compressed with zstd -3 in batches of about 4 MiB.
fn batch_z3(items: &[&[u8]]) -> u64 {
    const BATCH: usize = 4 << 20;
    let mut total = 0;
    let mut batch = Vec::with_capacity(BATCH);
    for (i, item) in items.iter().enumerate() {
        batch.extend_from_slice(item);
        if batch.len() >= BATCH || i + 1 == items.len() {
            total += zstd::bulk::compress(&batch, 3).expect("zstd -3").len() as u64;
            batch.clear();
        }
    }
    total
}

/// Windows x strides of our codec on the document and package sets: sizes and encode speed.
fn sweep(sets: &[PairSet], runs: usize) {
    println!(
        "sweep of ours (sampled): window x stride -> delta bytes, batch z3 bytes, encode MB/s"
    );
    println!(
        "{:<16} {:>6} {:>6} {:>11} {:>10} {:>9} {:>10} {:>8}",
        "set", "window", "stride", "delta B", "batch z3 B", "enc MB/s", "insert B", "copies"
    );
    for set in sets {
        for w in WINDOWS {
            for stride in [8, 16, 32, 64] {
                let c = Sampled::with_params(w, stride).expect("valid params");
                let mut deltas = Vec::with_capacity(set.pairs.len());
                let mut times = Vec::new();
                let mut buf = Vec::new();
                for run in 0..runs {
                    let t = Instant::now();
                    for p in &set.pairs {
                        buf.clear();
                        c.encode(&p.source, &p.target, &mut buf);
                        if run == 0 {
                            deltas.push(buf.clone());
                        }
                    }
                    times.push(t.elapsed());
                }
                let refs: Vec<&[u8]> = deltas.iter().map(|d| &d[..]).collect();
                let (mut lits, mut copies) = (0, 0);
                for d in &refs {
                    let (l, c) = sampled_stats(d);
                    lits += l;
                    copies += c;
                }
                println!(
                    "{:<16} {:>6} {:>6} {:>11} {:>10} {:>9.0} {:>10} {:>8}",
                    set.name,
                    w,
                    stride,
                    refs.iter().map(|d| d.len() as u64).sum::<u64>(),
                    batch_z3(&refs),
                    mbps(set.target_bytes(), median(times)),
                    lits,
                    copies
                );
            }
        }
    }
    println!();
}

/// Inserted bytes and copies in one of our deltas (see `delta::sampled` for the format).
fn sampled_stats(d: &[u8]) -> (u64, u64) {
    fn var(d: &[u8], pos: &mut usize) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        while let Some(&b) = d.get(*pos) {
            *pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        v
    }
    let mut pos = 0;
    let mut left = var(d, &mut pos);
    let (mut lits, mut copies) = (0, 0);
    while left > 0 && pos < d.len() {
        let ins = var(d, &mut pos);
        pos += ins as usize;
        lits += ins;
        left = left.saturating_sub(ins);
        if left == 0 {
            break;
        }
        left = left.saturating_sub(var(d, &mut pos));
        var(d, &mut pos);
        copies += 1;
    }
    (lits, copies)
}

#[derive(Clone, Copy, PartialEq)]
enum Tool {
    Xdelta3,
    ZstdPatch,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Xdelta3 => "xdelta3 -9",
            Tool::ZstdPatch => "zstd --patch -19",
        }
    }

    fn encode_cmd(self, dir: &Path) -> Command {
        let mut c = match self {
            // xdelta3 -9 -e -s SRC TGT OUT
            Tool::Xdelta3 => {
                let mut c = Command::new("xdelta3");
                c.args(["-9", "-e", "-s", "s", "t", "d"]);
                c
            }
            // zstd --patch-from=SRC TGT -19
            Tool::ZstdPatch => {
                let mut c = Command::new("zstd");
                c.args(["-q", "--patch-from=s", "t", "-19", "-o", "d"]);
                c
            }
        };
        c.current_dir(dir);
        c
    }

    fn decode_cmd(self, dir: &Path) -> Command {
        let mut c = match self {
            Tool::Xdelta3 => {
                let mut c = Command::new("xdelta3");
                c.args(["-d", "-s", "s", "d", "r"]);
                c
            }
            Tool::ZstdPatch => {
                let mut c = Command::new("zstd");
                c.args(["-q", "-d", "--patch-from=s", "d", "-o", "r"]);
                c
            }
        };
        c.current_dir(dir);
        c
    }
}

fn tools_present() -> anyhow::Result<bool> {
    for tool in ["xdelta3", "zstd"] {
        let ok = Command::new(tool)
            .arg("-V")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            eprintln!(
                "{tool} not found (apt-get install -y xdelta3 zstd): skipping external tools"
            );
            return Ok(false);
        }
    }
    Ok(true)
}

fn run_cmd(mut c: Command) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let out = c.output().with_context(|| format!("spawning {c:?}"))?;
    let d = t.elapsed();
    if !out.status.success() {
        bail!(
            "{c:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(d)
}

/// One pair in `dir` (files `s`, `t`), `runs` times: the delta, encode and decode times.
fn tool_pair(
    tool: Tool,
    dir: &Path,
    p: &Pair,
    runs: usize,
) -> anyhow::Result<(Vec<u8>, Vec<Duration>, Vec<Duration>)> {
    fs::write(dir.join("s"), &p.source)?;
    fs::write(dir.join("t"), &p.target)?;
    let (mut enc, mut dec) = (Vec::new(), Vec::new());
    let mut delta = Vec::new();
    for run in 0..runs {
        let _ = fs::remove_file(dir.join("d"));
        enc.push(run_cmd(tool.encode_cmd(dir))?);
        delta = fs::read(dir.join("d"))?;
        let _ = fs::remove_file(dir.join("r"));
        dec.push(run_cmd(tool.decode_cmd(dir))?);
        if run == 0 {
            ensure!(
                fs::read(dir.join("r"))? == p.target,
                "{} decoded a wrong target",
                tool.name()
            );
        }
    }
    Ok((delta, enc, dec))
}

/// External tools: sizes on every set (two workers), speed only on the big pair.
fn measure_tool(set: &PairSet, tool: Tool, runs: usize, tmp: &Path) -> anyhow::Result<Row> {
    let target_bytes = set.target_bytes();
    let mut row = Row {
        set: set.name.clone(),
        pairs: set.pairs.len(),
        codec: tool.name().into(),
        target_bytes,
        ..Row::default()
    };
    if set.big {
        let dir = tmp.join("big");
        fs::create_dir_all(&dir)?;
        let (delta, enc, dec) = tool_pair(tool, &dir, &set.pairs[0], runs)?;
        row.delta_bytes = delta.len() as u64;
        row.batch_z3 = Some(batch_z3(&[&delta]));
        row.enc_mbps = Some(mbps(target_bytes, median(enc)));
        row.dec_mbps = Some(mbps(target_bytes, median(dec)));
        return Ok(row);
    }
    // Sizes only: spawn cost dominates small pairs, so no speed; two workers.
    let pairs_len = set.pairs.len();
    let deltas = std::thread::scope(|s| -> anyhow::Result<Vec<Vec<u8>>> {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let dir = tmp.join(format!("w{w}"));
                let pairs = &set.pairs;
                s.spawn(move || -> anyhow::Result<Vec<Vec<u8>>> {
                    fs::create_dir_all(&dir)?;
                    let mut v = Vec::new();
                    for p in pairs.iter().skip(w).step_by(2) {
                        fs::write(dir.join("s"), &p.source)?;
                        fs::write(dir.join("t"), &p.target)?;
                        let _ = fs::remove_file(dir.join("d"));
                        run_cmd(tool.encode_cmd(&dir))?;
                        v.push(fs::read(dir.join("d"))?);
                    }
                    Ok(v)
                })
            })
            .collect();
        // Back in pair order (worker w took pairs w, w + 2, ...), for the batch.
        let mut per: Vec<_> = Vec::new();
        for w in workers {
            per.push(w.join().expect("worker panicked")?.into_iter());
        }
        let mut all = Vec::new();
        for k in 0..pairs_len {
            all.extend(per[k % 2].next());
        }
        Ok(all)
    })?;
    row.delta_bytes = deltas.iter().map(|d| d.len() as u64).sum();
    let refs: Vec<&[u8]> = deltas.iter().map(|d| &d[..]).collect();
    row.batch_z3 = Some(batch_z3(&refs));
    Ok(row)
}

/// `docs:<stream>` sets: (previous body, new body) for the first `n` updates of each stream.
fn doc_sets(dir: &Path, n: usize) -> anyhow::Result<Vec<PairSet>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "jsonl"));
    files.sort();
    ensure!(!files.is_empty(), "no *.jsonl under {}", dir.display());
    let mut sets = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let mut last: std::collections::HashMap<String, String> = Default::default();
        let mut pairs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if pairs.len() >= n {
                break;
            }
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{}:{}", f.display(), i + 1))?;
            let id = v["_id"].to_string();
            match v["op"].as_str() {
                Some("delete") => {
                    last.remove(&id);
                }
                Some(op @ ("insert" | "update")) => {
                    let body = match &v["body"] {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    if op == "update" {
                        if let Some(prev) = last.get(&id) {
                            pairs.push(Pair {
                                source: prev.clone().into_bytes(),
                                target: body.clone().into_bytes(),
                            });
                        }
                    }
                    last.insert(id, body);
                }
                _ => {}
            }
        }
        let stem = f.file_stem().unwrap_or_default().to_string_lossy();
        sets.push(PairSet {
            name: format!("docs:{stem}"),
            pairs,
            big: false,
        });
    }
    Ok(sets)
}

/// The `pkgs/django-*` trees, in version order.
fn django_trees(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut trees: Vec<(Vec<u64>, PathBuf)> = Vec::new();
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if let Some(v) = name.strip_prefix("django-") {
            if p.is_dir() {
                let key = v.split('.').map(|x| x.parse().unwrap_or(0)).collect();
                trees.push((key, p));
            }
        }
    }
    trees.sort_by(|a, b| a.0.cmp(&b.0).then(Ordering::Equal));
    ensure!(
        trees.len() >= 2,
        "need two django trees under {}",
        dir.display()
    );
    Ok(trees.into_iter().map(|t| t.1).collect())
}

fn files_under(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(root.join(rel))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let ft = e.file_type()?;
        let r = rel.join(e.file_name());
        if ft.is_dir() {
            files_under(root, &r, out)?;
        } else if ft.is_file() {
            out.push(r);
        }
    }
    Ok(())
}

/// `pkgs`: changed files between consecutive trees.
fn pkg_set(trees: &[PathBuf]) -> anyhow::Result<PairSet> {
    let mut pairs = Vec::new();
    for w in trees.windows(2) {
        let mut files = Vec::new();
        files_under(&w[1], Path::new(""), &mut files)?;
        for rel in files {
            let Ok(source) = fs::read(w[0].join(&rel)) else {
                continue;
            };
            let target = fs::read(w[1].join(&rel))?;
            if source != target {
                pairs.push(Pair { source, target });
            }
        }
    }
    Ok(PairSet {
        name: "pkgs".into(),
        pairs,
        big: false,
    })
}

/// `tar`: the first two trees as uncompressed tars (same member names, sorted).
fn tar_set(trees: &[PathBuf], tmp: &Path) -> anyhow::Result<PairSet> {
    let mut tars = Vec::new();
    for (i, tree) in trees[..2].iter().enumerate() {
        let out = tmp.join(format!("tree{i}.tar"));
        let mut c = Command::new("tar");
        c.arg("-cf")
            .arg(&out)
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "-C",
            ])
            .arg(tree)
            .arg(".");
        run_cmd(c)?;
        tars.push(fs::read(&out)?);
    }
    let target = tars.pop().expect("two tars");
    let source = tars.pop().expect("two tars");
    let name = |p: &PathBuf| {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string()
    };
    eprintln!("tar: {} vs {}", name(&trees[0]), name(&trees[1]));
    Ok(PairSet {
        name: "tar".into(),
        pairs: vec![Pair { source, target }],
        big: true,
    })
}

/// `binary`: `libarrow.so.1400` of the two unpacked pyarrow wheels, if both are there.
fn binary_set(dir: &Path) -> anyhow::Result<Option<PairSet>> {
    let file = |v: &str| dir.join(v).join("pyarrow/libarrow.so.1400");
    let (old, new) = (file("14.0.1"), file("14.0.2"));
    if !old.is_file() || !new.is_file() {
        return Ok(None);
    }
    let read = |p: &Path| fs::read(p).with_context(|| format!("reading {}", p.display()));
    Ok(Some(PairSet {
        name: "binary".into(),
        pairs: vec![Pair {
            source: read(&old)?,
            target: read(&new)?,
        }],
        big: true,
    }))
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(format!("dedupwire-bench-delta-{}", std::process::id()));
        fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
