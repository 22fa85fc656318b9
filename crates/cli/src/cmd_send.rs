//! `dedupwire send SRC HOST:PORT:NAME`: makes `ROOT/NAME` on a `dedupwire serve` an exact copy
//! of the directory SRC, sending only the contents the receiver has nowhere, deduplicated
//! against its chunk environment (so an interrupted send resumes cheaply).

use std::io::{IsTerminal, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use dedupwire_analyze::report::human_bytes;
use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_sync::{manifest, send, BoundedStore, SendCache, SendOptions, SendReport};
use dedupwire_wire::{ChannelConfig, DedupStream, Mode, Role};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::cmd_serve::PEER_TIMEOUT;
use crate::transport::{self, KeyArgs};

/// Chunk bytes the sender keeps as delta bases (and indexes, about 0.35 bytes per byte): at
/// 256 MiB the two made half of a 1.4 GB peak; at 64 MiB the six Django 4.2.x releases as
/// one tree cost 19.0 MB on the wire instead of 16.5.
const SENDER_STORE_BYTES: usize = 64 << 20;
/// The channel's chunking levels for trees (CDC averages, coarsest first): a third, 2 KiB
/// level finds what a changed file kept of its old version, which the receiver holds.
const SEND_LEVELS: [usize; 3] = [256 << 10, 16 << 10, 2 << 10];

/// Options of `dedupwire send`.
#[derive(clap::Args)]
pub struct Args {
    /// The directory to send (symlinks in it are sent as links, never followed).
    src: PathBuf,
    /// Where: HOST:PORT of a `dedupwire serve`, and the NAME of the tree under its root.
    #[arg(value_name = "HOST:PORT:NAME")]
    dest: String,
    /// Report what would change (and how many bytes of contents would travel); change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Write statistics as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar and no summary.
    #[arg(long, short)]
    quiet: bool,
    /// Where to keep the files sent, so that a changed file later travels as a delta against
    /// the version the receiver holds [default: $XDG_CACHE_HOME/dedupwire/send, else
    /// ~/.cache/dedupwire/send]. It holds up to one copy (zstd-compressed) of the files of
    /// each destination's current tree, up to 128 MiB each, within `--cache-size`.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// The most the cache may hold (zstd-compressed files, all destinations); past it the
    /// least recently used files leave, and a send stops adding files.
    #[arg(long, value_name = "SIZE", default_value = "4GiB")]
    cache_size: String,
    /// Use no cache (overrides `--cache-dir`): changed files travel as the chunks the
    /// receiver lacks, without deltas.
    #[arg(long)]
    no_cache: bool,
    #[command(flatten)]
    key: KeyArgs,
}

fn bar(quiet: bool, template: &str) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0).with_style(ProgressStyle::with_template(template).expect("valid"))
    }
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let key = args.key.key()?;
    let (addr, name) = split_dest(&args.dest)?;
    dedupwire_sync::apply::check_tree_name(name.as_bytes())?;
    // Before anything changes on the receiver: a path that cannot take the statistics fails
    // now, not after the tree was replaced.
    if let Some(path) = args.json.as_deref().filter(|p| p.as_os_str() != "-") {
        crate::out_file::check_writable(path)?;
    }

    // Listed, not read: each file is read once, when the receiver asks for its hash (it holds
    // a file of that size) or when it is sent.
    let mut scan =
        manifest::list(&args.src).with_context(|| format!("listing {}", args.src.display()))?;
    for p in &scan.skipped {
        eprintln!(
            "dedupwire send: warning: skipping {} (not a file, directory or symlink)",
            p.display()
        );
    }

    let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    let conn = transport::client(stream, key.as_ref())?;
    // Dedup mode, not adaptive: the receiver must keep the chunks of everything that arrives
    // (a plain segment's chunks are not always kept), or a cut-off send would start over.
    let mut config = ChannelConfig::with_levels(&SEND_LEVELS.map(ChunkerSpec::cdc))?;
    config.mode = Mode::Dedup;
    let store = Arc::new(BoundedStore::new(SENDER_STORE_BYTES));
    let mut channel =
        DedupStream::new(conn, store, config, Role::Connect).context("channel handshake failed")?;
    let sending = bar(
        args.quiet,
        "{spinner} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_bar}",
    );
    let cache_dir = if args.no_cache {
        None
    } else {
        args.cache_dir
            .clone()
            .or_else(dedupwire_sync::cache::default_dir)
    };
    let cache_size = dedupwire_analyze::parse_size(&args.cache_size)
        .with_context(|| format!("--cache-size {:?}: use a size like 4GiB", args.cache_size))?
        as u64;
    let cache = match cache_dir
        .as_deref()
        .map(|d| SendCache::open(d, &args.dest, cache_size))
    {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            eprintln!("dedupwire send: warning: not using the cache: {e}");
            None
        }
        None => None,
    };
    let opts = SendOptions {
        dry_run: args.dry_run,
        ..SendOptions::default()
    };
    let marker = cache_dir
        .as_deref()
        .filter(|_| !args.dry_run)
        .map(|d| unfinished_marker(d, &args.src, &args.dest));
    let resumed = marker.as_deref().is_some_and(|m| m.exists());
    if resumed && !args.quiet {
        eprintln!(
            "dedupwire send: the last send of {} to {} was cut off: resuming (what already \
             arrived is not sent again)",
            args.src.display(),
            args.dest
        );
    }
    if let Some(m) = &marker {
        // Best effort: without it a cut-off send is only not announced as such next time.
        let _ = m.parent().map(std::fs::create_dir_all);
        let _ = std::fs::write(m, b"");
    }
    let report = send(
        &mut channel,
        &args.src,
        name.as_bytes(),
        &mut scan,
        &opts,
        cache.as_ref(),
        &mut |done, total| {
            sending.set_length(total);
            sending.set_position(done);
        },
    )
    .with_context(|| format!("sending {} to {}", args.src.display(), args.dest))?;
    sending.finish_and_clear();
    if let Some(m) = &marker {
        let _ = std::fs::remove_file(m);
    }
    let _ = channel.close();
    let mut cache_warning = report.cache_warning.clone();
    if let (Some(c), false) = (cache, args.dry_run) {
        if let Err(e) = c
            .fill(&args.src, &scan.manifest)
            .and_then(|_| c.finish(&scan.manifest))
        {
            cache_warning.get_or_insert_with(|| e.to_string());
        }
    }
    if let Some(w) = &cache_warning {
        eprintln!("dedupwire send: warning: the cache was not updated ({w}); the next send may move more bytes");
    }

    let d = &report.diff;
    let c = &report.channel;
    let elapsed = started.elapsed().as_secs_f64();
    if args.dry_run && !args.quiet {
        // On stdout, unless the JSON goes there.
        let mut out: Box<dyn Write> = if args.json.as_deref() == Some(std::path::Path::new("-")) {
            Box::new(std::io::stderr().lock())
        } else {
            Box::new(std::io::stdout().lock())
        };
        for (change, path) in &d.changes {
            writeln!(out, "{} {}", change.symbol(), printable_path(path))?;
        }
    }
    if !args.quiet {
        let tree_bytes = scan.manifest.entries.iter().map(|e| e.size()).sum();
        eprint!(
            "{}",
            summary(name, args.dry_run, tree_bytes, &report, elapsed, resumed)
        );
    }
    if let Some(path) = &args.json {
        let j = json!({
            "name": name,
            "dry_run": args.dry_run,
            "resumed": resumed,
            "bytes_read": report.bytes_hashed + report.bytes_read,
            "bytes_scanned": report.bytes_hashed,
            "files_sent": report.files_sent,
            "files_delta": report.files_delta,
            "bytes_delta_files": report.bytes_delta_files,
            "delta_bytes": report.delta_bytes,
            "bytes_needed": report.bytes_needed,
            "socket_bytes_sent": c.socket_bytes_sent,
            "socket_bytes_received": c.socket_bytes_received,
            "files_new": d.files_new,
            "files_changed": d.files_changed,
            "files_unchanged": d.files_unchanged,
            "files_deleted": d.files_deleted,
            "dirs_new": d.dirs_new,
            "dirs_deleted": d.dirs_deleted,
            "skipped": scan.skipped.len(),
            "chunks": {
                "hit": c.chunks_hit,
                "bytes_hit": c.bytes_hit,
                "delta": c.chunks_delta,
                "bytes_delta": c.bytes_delta,
                "literal": c.chunks_literal,
                "bytes_literal": c.bytes_literal,
                "segments_plain": c.segments_plain,
                "bytes_plain": c.bytes_plain,
                "round_trips": c.round_trips,
            },
            "elapsed_s": elapsed,
        });
        let text = serde_json::to_string_pretty(&j)? + "\n";
        if path.as_os_str() == "-" {
            std::io::stdout().lock().write_all(text.as_bytes())?;
        } else {
            crate::out_file::write_whole(path, text.as_bytes())?;
        }
    }
    Ok(())
}

/// Where a send of `src` to `dest` marks itself under way, in the cache directory.
fn unfinished_marker(cache_dir: &std::path::Path, src: &std::path::Path, dest: &str) -> PathBuf {
    let src = std::fs::canonicalize(src).unwrap_or_else(|_| src.to_path_buf());
    let mut h = blake3::Hasher::new();
    h.update(std::os::unix::ffi::OsStrExt::as_bytes(src.as_os_str()));
    h.update(&[0]);
    h.update(dest.as_bytes());
    cache_dir
        .join("unfinished")
        .join(&h.finalize().to_hex()[..32])
}

/// Splits `HOST:PORT:NAME` (HOST may be `[IPv6]`) into the address and the tree name, which
/// may itself hold colons.
fn split_dest(dest: &str) -> Result<(&str, &str)> {
    let usage = || anyhow::anyhow!("{dest:?}: the destination is HOST:PORT:NAME");
    let host_end = if dest.starts_with('[') {
        dest.find(']').ok_or_else(usage)? + 1
    } else {
        dest.find(':').ok_or_else(usage)?
    };
    let rest = dest[host_end..].strip_prefix(':').ok_or_else(usage)?;
    let (port, name) = rest.split_once(':').ok_or_else(usage)?;
    if host_end == 0 || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(usage());
    }
    Ok((&dest[..host_end + 1 + port.len()], name))
}

/// A path as one line a terminal shows safely: printable UTF-8 as it is; control characters,
/// backslashes and bytes that are not UTF-8 escaped (`\n`, `\\`, `\xff`).
fn printable_path(path: &[u8]) -> String {
    let mut out = String::with_capacity(path.len());
    for chunk in path.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The summary a person reads after a send: the tree and its changes, the contents that
/// travelled and the bytes on the wire in binary units, the ratio of contents to bytes sent,
/// and rsync's "speedup" (tree size over bytes on the wire both ways).
fn summary(
    name: &str,
    dry_run: bool,
    tree_bytes: u64,
    report: &SendReport,
    elapsed: f64,
    resumed: bool,
) -> String {
    let d = &report.diff;
    let c = &report.channel;
    let files = d.files_new + d.files_changed + d.files_unchanged;
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut s = format!(
        "{}{name}: {}, {}: {} new, {} changed, {} unchanged, {} deleted\n",
        if dry_run {
            "dry run, nothing changed: "
        } else {
            ""
        },
        plural(files, "file", "files"),
        human_bytes(tree_bytes),
        d.files_new,
        d.files_changed,
        d.files_unchanged,
        d.files_deleted,
    );
    let verb = if dry_run { "would travel" } else { "travelled" };
    if report.files_sent == 0 {
        s += &format!("  contents  none {verb}: the receiver holds them all\n");
    } else {
        s += &format!(
            "  contents  {}, {} {verb}",
            plural(report.files_sent, "file", "files"),
            human_bytes(report.bytes_needed),
        );
        if report.files_delta > 0 {
            s += &format!(
                " ({} as {}: {} as {})",
                report.files_delta,
                if report.files_delta == 1 {
                    "a delta"
                } else {
                    "deltas"
                },
                human_bytes(report.bytes_delta_files),
                human_bytes(report.delta_bytes),
            );
        }
        if c.bytes_hit > 0 && !dry_run {
            s += &format!(
                ", {} of it already on the receiver{}",
                human_bytes(c.bytes_hit),
                if resumed {
                    " (from the send that was cut off, and earlier ones)"
                } else {
                    ""
                }
            );
        }
        s += "\n";
    }
    let (out, back) = (c.socket_bytes_sent, c.socket_bytes_received);
    s += &format!(
        "  wire      {} out, {} in",
        human_bytes(out),
        human_bytes(back)
    );
    if dry_run {
        s += " (the manifest and the plan)";
    } else {
        let mut ratios = Vec::new();
        if report.bytes_needed > 0 && out > 0 {
            ratios.push(format!(
                "ratio {:.2} (contents / out)",
                report.bytes_needed as f64 / out as f64
            ));
        }
        if out + back > 0 {
            ratios.push(format!(
                "speedup {:.2} (tree / out and in, as rsync)",
                tree_bytes as f64 / (out + back) as f64
            ));
        }
        if !ratios.is_empty() {
            s += ": ";
            s += &ratios.join(", ");
        }
    }
    s += &format!("\n  time      {elapsed:.2} s\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> SendReport {
        let mut r = SendReport::default();
        r.diff.files_new = 4205;
        r.files_sent = 4205;
        r.bytes_needed = 112_412_403;
        r.channel.socket_bytes_sent = 45_699_349;
        r.channel.socket_bytes_received = 20_480;
        r
    }

    #[test]
    fn destinations_split_at_the_port_and_names_may_hold_colons() {
        assert_eq!(split_dest("h:7300:t").unwrap(), ("h:7300", "t"));
        assert_eq!(split_dest("h:7300:a:b").unwrap(), ("h:7300", "a:b"));
        assert_eq!(split_dest("[::1]:7300:t:x").unwrap(), ("[::1]:7300", "t:x"));
        for bad in ["h:7300", "h", ":7300:t", "h:port:t", "[::1]:t", "h::t"] {
            assert!(split_dest(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn printed_paths_are_one_safe_line() {
        assert_eq!(
            printable_path(b"plain/\xc3\xa9t\xc3\xa9"),
            "plain/\u{e9}t\u{e9}"
        );
        assert_eq!(
            printable_path(b"a\nb\\c\xffd\x1b"),
            "a\\nb\\\\c\\xffd\\u{1b}"
        );
    }

    #[test]
    fn the_summary_speaks_in_binary_units_and_ratios() {
        let s = summary("site", false, 112_412_403, &report(), 3.0, false);
        assert_eq!(
            s,
            "site: 4205 files, 107.2 MiB: 4205 new, 0 changed, 0 unchanged, 0 deleted\n\
             \x20 contents  4205 files, 107.2 MiB travelled\n\
             \x20 wire      43.6 MiB out, 20.0 KiB in: ratio 2.46 (contents / out), \
             speedup 2.46 (tree / out and in, as rsync)\n\
             \x20 time      3.00 s\n"
        );
    }

    #[test]
    fn a_dry_run_and_an_unchanged_tree_give_no_ratio_they_cannot_have() {
        let mut r = report();
        let dry = summary("site", true, 1 << 20, &r, 0.1, false);
        assert!(dry.starts_with("dry run, nothing changed: site: "), "{dry}");
        assert!(dry.contains("would travel"), "{dry}");
        assert!(!dry.contains("ratio"), "{dry}");
        r.diff.files_new = 0;
        r.diff.files_unchanged = 1;
        r.files_sent = 0;
        r.bytes_needed = 0;
        r.channel.socket_bytes_sent = 1_000_000;
        r.channel.socket_bytes_received = 28_000;
        let same = summary("site", false, 1 << 20, &r, 0.1, false);
        assert!(same.contains("site: 1 file, 1.0 MiB"), "{same}");
        assert!(same.contains("none travelled"), "{same}");
        assert!(!same.contains("ratio"), "{same}");
        assert!(same.contains(": speedup 1.02 (tree"), "{same}");
    }
}
