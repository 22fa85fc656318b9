//! `dedupwire backup PATH...`: a new snapshot of PATHs in a repository, storing only what it
//! lacks, similar chunks as deltas against whole ones.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use dedupwire_analyze::report::human_bytes;
use dedupwire_repo::backup::{backup, BackupOptions};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::repo_args::RepoArgs;

/// Options of `dedupwire backup`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    repo: RepoArgs,
    /// Files and directories to back up.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// A tag for the snapshot (repeat for several).
    #[arg(long)]
    tag: Vec<String>,
    /// Leave out paths matching GLOB (matched against the whole path and the name; repeat).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Read every file, even those whose size, mtime, inode and ctime match the parent
    /// snapshot.
    #[arg(long)]
    force_read: bool,
    /// Where to keep the files cache (each file's inode and ctime, to skip unchanged files
    /// next time) [default: $XDG_CACHE_HOME/dedupwire/backup, else ~/.cache/dedupwire/backup].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Keep no files cache (the next backup reads every file).
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// The snapshot to compare with [default: the latest of this host and these paths].
    #[arg(long, value_name = "SNAPSHOT")]
    parent: Option<String>,
    /// Print the summary as JSON on stdout (fields in docs/backup.md).
    #[arg(long)]
    json: bool,
    /// No progress bar and no summary.
    #[arg(long, short)]
    quiet: bool,
}

/// Bytes of the regular files under `paths` (symlinks not followed; unreadable parts skipped).
fn total_bytes(paths: &[PathBuf]) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = paths.to_vec();
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if md.is_file() {
            total += md.len();
        } else if md.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let mut repo = args.repo.open()?;
    let bar = if args.quiet || args.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(0).with_style(
            ProgressStyle::with_template(
                "{spinner} {msg} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_bar}",
            )
            .expect("valid template"),
        );
        // The total comes from a walk beside the backup (metadata only); until it ends the
        // bar has no end and no ETA.
        let (paths, totals) = (args.paths.clone(), bar.clone());
        std::thread::spawn(move || totals.set_length(total_bytes(&paths)));
        bar
    };
    let opts = BackupOptions {
        paths: args.paths.clone(),
        tags: args.tag.clone(),
        excludes: args.exclude.clone(),
        force_read: args.force_read,
        parent: args.parent.clone(),
        host: None,
        files_cache: if args.no_cache {
            None
        } else {
            args.cache_dir
                .clone()
                .or_else(dedupwire_repo::files_cache::default_dir)
                .map(|d| d.join(&repo.config().id))
        },
    };
    let result = backup(&mut repo, &opts, &mut |p| {
        bar.set_message(format!("{} files", p.files));
        bar.set_position(p.bytes);
    })
    .context("backup failed; what it stored is kept and the next backup reuses it")?;
    bar.finish_and_clear();
    for w in &result.warnings {
        eprintln!("dedupwire backup: warning: {w}");
    }
    if let Some(w) = &result.cache_warning {
        eprintln!("dedupwire backup: note: {w}");
    }
    let s = &result.snapshot.summary;
    let elapsed = started.elapsed().as_secs_f64();
    if args.json {
        let j = json!({
            "snapshot_id": result.id,
            "parent": result.snapshot.parent,
            "files_new": s.files_new,
            "files_changed": s.files_changed,
            "files_unchanged": s.files_unchanged,
            "dirs": s.dirs,
            "bytes_total": s.bytes_total,
            "bytes_read": s.bytes_read,
            "chunks_duplicate": s.chunks_duplicate,
            "bytes_duplicate": s.bytes_duplicate,
            "chunks_delta": s.chunks_delta,
            "bytes_delta_chunks": s.bytes_delta_chunks,
            "bytes_delta": s.bytes_delta,
            "chunks_whole": s.chunks_whole,
            "bytes_whole": s.bytes_whole,
            "bytes_added": s.bytes_added,
            "errors": s.errors,
            "elapsed_s": elapsed,
        });
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &j)?;
        writeln!(out)?;
    } else if !args.quiet {
        let files = s.files_new + s.files_changed + s.files_unchanged;
        eprintln!(
            "snapshot {} saved: {files} files, {} dirs, {}: {} new, {} changed, {} unchanged{}",
            &result.id[..8],
            s.dirs,
            human_bytes(s.bytes_total),
            s.files_new,
            s.files_changed,
            s.files_unchanged,
            if s.errors > 0 {
                format!(", {} not readable (above)", s.errors)
            } else {
                String::new()
            }
        );
        eprintln!(
            "  read      {} ({} chunks already stored, {})",
            human_bytes(s.bytes_read),
            s.chunks_duplicate,
            human_bytes(s.bytes_duplicate)
        );
        eprintln!(
            "  stored    {} chunks whole ({}), {} as deltas ({} in {})",
            s.chunks_whole,
            human_bytes(s.bytes_whole),
            s.chunks_delta,
            human_bytes(s.bytes_delta_chunks),
            human_bytes(s.bytes_delta)
        );
        eprintln!(
            "  added     {} to the repository (compressed, encrypted)",
            human_bytes(s.bytes_added)
        );
        eprintln!("  time      {elapsed:.2} s");
    }
    if s.errors > 0 {
        anyhow::bail!(
            "{} paths could not be read; the snapshot holds the rest",
            s.errors
        );
    }
    Ok(())
}
