//! `dedupwire restore SNAPSHOT --target DIR`: a snapshot back into a directory, bit-exact.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dedupwire_analyze::report::human_bytes;
use dedupwire_repo::restore::restore;
use serde_json::json;

use crate::repo_args::RepoArgs;

/// Options of `dedupwire restore`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    repo: RepoArgs,
    /// The snapshot: an id, a unique prefix of one, or `latest`.
    snapshot: String,
    /// Where to restore (each backed-up path `/a/b` becomes `DIR/a/b`).
    #[arg(long, value_name = "DIR")]
    target: PathBuf,
    /// Restore only this path as backed up (and what is below it; repeat).
    #[arg(long, value_name = "PATH")]
    include: Vec<PathBuf>,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No summary.
    #[arg(long, short)]
    quiet: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let repo = args.repo.open()?;
    let (id, snapshot) = repo.find_snapshot(&args.snapshot)?;
    let report = restore(
        &repo,
        &snapshot.tree,
        &args.target,
        &args.include,
        &mut |_| {},
    )
    .with_context(|| {
        format!(
            "restoring snapshot {} to {}",
            &id[..8],
            args.target.display()
        )
    })?;
    for e in &report.errors {
        eprintln!("dedupwire restore: error: {e}");
    }
    let elapsed = started.elapsed().as_secs_f64();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "snapshot_id": id,
                "files": report.files,
                "dirs": report.dirs,
                "symlinks": report.symlinks,
                "bytes": report.bytes,
                "errors": report.errors,
                "owners_restored": !report.owners_skipped,
                "elapsed_s": elapsed,
            }))?
        );
    } else if !args.quiet {
        eprintln!(
            "restored snapshot {} to {}: {} files ({}), {} dirs, {} symlinks in {elapsed:.2} s",
            &id[..8],
            args.target.display(),
            report.files,
            human_bytes(report.bytes),
            report.dirs,
            report.symlinks
        );
        if report.owners_skipped {
            eprintln!("  owners not restored (not running as root): the files are yours");
        }
    }
    if !report.errors.is_empty() {
        bail!(
            "{} paths could not be restored (named above); the rest is restored",
            report.errors.len()
        );
    }
    Ok(())
}
