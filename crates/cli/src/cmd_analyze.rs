//! `dedupwire analyze PATH... [--methods LIST] [--json FILE] [--html FILE] [--link SPEED]`

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dedupwire_analyze::{analyze, parse_link, parse_size, Options};
use dedupwire_engine::compress::Compression;
use indicatif::{ProgressBar, ProgressStyle};

/// Options of `dedupwire analyze`.
#[derive(clap::Args)]
pub struct Args {
    /// Files, directory trees or `.jsonl[.zst]` document streams; each PATH is one image.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Methods to measure: compress, whole, fixed, cdc, similarity, all (eight chunk sizes from
    /// 1 KiB to 128 KiB), all-quick (five sizes over the same range), or single ones such as
    /// zstd-19, lz4, cdc-4KiB, fixed-64KiB, cdc-256B (comma-separated) [default: all up to
    /// 1 GiB of input, all-quick above].
    #[arg(long)]
    methods: Option<String>,
    /// Write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a self-contained HTML report with charts to FILE.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Link speed to recommend a configuration for (e.g. 3Mbit, 100Mbit, 10Gbit).
    #[arg(long, default_value = "100Mbit")]
    link: String,
    /// Compression on top of dedup: zstd, zstd-LEVEL, lz4.
    #[arg(long, default_value = "zstd-3")]
    compression: String,
    /// Compress what each method emits for 1 input batch (4 MiB) in N, the same for every
    /// method, and extrapolate, stating the error; 1 compresses everything [default:
    /// everything up to 512 MiB of input, then about 16 sampled batches].
    #[arg(long, value_name = "N")]
    sample: Option<u64>,
    /// Exact dedup indexes 1 chunk in N, chosen by content, and scales up, stating the error
    /// (for inputs too large to analyze in full; +zstd lines then become upper bounds; whole
    /// files are never sampled, whole documents are) [default: 1, or as few as keep exact
    /// dedup's indexes within --memory even if no chunk repeated].
    #[arg(long, value_name = "N")]
    sample_chunks: Option<u64>,
    /// Memory the analysis may take (e.g. 4GiB): past it, exact dedup samples its chunks
    /// rather than be killed hours in [default: half of this machine's, or of the container's
    /// limit].
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Recent data the similarity method may use as delta sources (e.g. 512MiB, 2GiB).
    #[arg(long, default_value = "1GiB")]
    window: String,
    /// No progress bar and no table on stdout.
    #[arg(long, short)]
    quiet: bool,
}

/// Runs the analysis and writes the requested outputs.
pub fn run(args: Args) -> Result<()> {
    let Some(link) = parse_link(&args.link) else {
        bail!(
            "--link {:?}: use a speed like 3Mbit, 100Mbit or 10Gbit",
            args.link
        );
    };
    let on_top: Compression = args.compression.parse().context("--compression")?;
    let Some(window) = parse_size(&args.window) else {
        bail!("--window {:?}: use a size like 512MiB or 2GiB", args.window);
    };
    if window == 0 {
        bail!("--window must be more than 0: it is the recent data similarity may use as delta sources");
    }
    if args.sample_chunks == Some(0) {
        bail!("--sample-chunks must be at least 1");
    }
    let memory = match args.memory.as_deref().map(|m| (m, parse_size(m))) {
        None => None,
        Some((_, Some(bytes))) if bytes > 0 => Some(bytes as u64),
        Some((m, _)) => bail!("--memory {m:?}: use a size like 4GiB or 512MiB"),
    };
    if args.sample == Some(0) {
        bail!("--sample must be at least 1");
    }
    for path in args.json.iter().chain(&args.html) {
        crate::out_file::check_writable(path)?;
    }
    let opts = Options {
        methods: args.methods.clone(),
        on_top,
        link_bits_per_s: link,
        compress_every: args.sample,
        chunk_sample: args.sample_chunks,
        memory_bytes: memory,
        window_bytes: window as u64,
    };
    let bar = if args.quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0).with_style(
            ProgressStyle::with_template(
                "{spinner} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_bar}",
            )
            .expect("valid template"),
        )
    };
    let report = analyze(&args.paths, &opts, &|done, total| {
        bar.set_length(total.max(done));
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    const SHOWN: usize = 20;
    for w in report.warnings.iter().take(SHOWN) {
        eprintln!("dedupwire: warning: {w}");
    }
    if report.warnings.len() > SHOWN {
        eprintln!(
            "dedupwire: warning: {} more warnings{}",
            report.warnings.len() - SHOWN,
            if args.json.is_some() {
                " (all are listed in the JSON report)"
            } else {
                ""
            }
        );
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        crate::out_file::write_whole(path, json.as_bytes())?;
    }
    if let Some(path) = &args.html {
        crate::out_file::write_whole(path, dedupwire_analyze::html::render(&report).as_bytes())?;
    }
    if !args.quiet {
        print!("{}", report.to_text());
    }
    Ok(())
}
