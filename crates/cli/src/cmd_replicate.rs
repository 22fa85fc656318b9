//! `dedupwire replicate encode|decode`: sDedup over JSON-lines change streams.

use std::io::{BufReader, BufWriter};

use anyhow::{Context, Result};
use dedupwire_replicate::jsonl;
use dedupwire_replicate::sdedup::SdedupConfig;

/// Options of `dedupwire replicate`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Encode a JSON-lines change stream (stdin) into an sDedup stream (stdout).
    Encode {
        /// Print bytes in/out, ratio, cache hit ratio, fallbacks and index memory to stderr.
        #[arg(long)]
        stats: bool,
        /// Input bytes per batch (e.g. 4MiB).
        #[arg(long, default_value = "4MiB")]
        batch: String,
    },
    /// Decode an sDedup stream (stdin) back into the exact JSON lines (stdout).
    Decode,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    let config = SdedupConfig::default();
    let stdin = std::io::stdin().lock();
    let stdout = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    match args.cmd {
        Cmd::Encode { stats, batch } => {
            let batch = dedupwire_analyze::parse_size(&batch)
                .with_context(|| format!("--batch {batch:?}: use a size like 4MiB"))?;
            let report = jsonl::encode(
                BufReader::with_capacity(1 << 20, stdin),
                stdout,
                config,
                batch,
            )?;
            if stats {
                eprintln!("{}", serde_json::to_string_pretty(&report)?);
            }
        }
        Cmd::Decode => {
            jsonl::decode(BufReader::with_capacity(1 << 20, stdin), stdout, config)?;
        }
    }
    Ok(())
}
