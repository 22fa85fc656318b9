//! `dedupwire repo init|snapshots|ls|diff|check|stats|forget|prune|key`: making, inspecting and
//! thinning a backup repository, and managing its passwords.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dedupwire_analyze::report::human_bytes;
use dedupwire_repo::check::check;
use dedupwire_repo::prune::{self, KeepPolicy};
use dedupwire_repo::time::rfc3339;
use dedupwire_repo::tree::{bytes_of, NodeKind};
use dedupwire_repo::{BlobKind, Config, Repository};
use serde_json::json;

use crate::repo_args::RepoArgs;

/// Options of `dedupwire repo`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Make a new, empty repository (the password is asked twice, or taken from
    /// DEDUPWIRE_PASSWORD / --password-file).
    Init {
        #[command(flatten)]
        repo: RepoArgs,
        /// Average chunk size of files, a power of two from 1KiB to 1MiB (chunks are a quarter
        /// to eight times it); fixed for the repository's life.
        #[arg(long, value_name = "SIZE", default_value = "8KiB")]
        chunk_size: String,
        /// Target size of packs, 4MiB to 64MiB.
        #[arg(long, value_name = "SIZE", default_value = "16MiB")]
        pack_size: String,
        /// Print the new repository's id as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the snapshots, oldest first.
    Snapshots {
        #[command(flatten)]
        repo: RepoArgs,
        /// A JSON array: id, time, host, user, paths, tags, tree, parent, summary.
        #[arg(long)]
        json: bool,
    },
    /// List what a snapshot holds (below PATH, as backed up).
    Ls {
        #[command(flatten)]
        repo: RepoArgs,
        /// An id, a unique prefix of one, or `latest`.
        snapshot: String,
        /// Only below this path.
        path: Option<PathBuf>,
        /// One JSON object per line: path, type, size, mode, mtime_ns.
        #[arg(long)]
        json: bool,
    },
    /// Check that every snapshot can be restored: the index against the packs, every tree
    /// and blob the snapshots name; with --read-data, every byte.
    Check {
        #[command(flatten)]
        repo: RepoArgs,
        /// Read and verify every pack whole.
        #[arg(long)]
        read_data: bool,
        /// Read and verify this share of the packs (e.g. 10%).
        #[arg(long, value_name = "N%")]
        read_data_subset: Option<String>,
        /// The result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Forget snapshots by a keep policy (per host and paths); their data goes at the next
    /// prune (or with --prune).
    Forget {
        #[command(flatten)]
        repo: RepoArgs,
        /// Keep the newest N snapshots.
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_last: usize,
        /// Keep the newest snapshot of each of the last N days that have one.
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_daily: usize,
        /// Keep the newest snapshot of each of the last N weeks that have one.
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_weekly: usize,
        /// Keep the newest snapshot of each of the last N months that have one.
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_monthly: usize,
        /// Say what would be forgotten; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Prune afterwards.
        #[arg(long)]
        prune: bool,
        /// With --prune: delete a pack marked for deletion only once marked this long ago
        /// (e.g. 30m, 1h, 2d; 0s: in this run, when no running backup may use it).
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
        keep_delete: std::time::Duration,
        /// The result as JSON: {keep: [ids], forget: [ids], prune: {...} or null}.
        #[arg(long)]
        json: bool,
    },
    /// Delete what no snapshot needs: unused packs, and packs mostly unused rewritten.
    Prune {
        #[command(flatten)]
        repo: RepoArgs,
        /// Say what would be deleted; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Rewrite packs whose live share is below this (0 never, 1 every partly used pack).
        #[arg(long, value_name = "SHARE", default_value_t = 0.5)]
        repack_below: f64,
        /// Delete a pack marked for deletion only once marked this long ago (e.g. 30m, 1h,
        /// 2d; 0s: in this run, when no running backup may use it).
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
        keep_delete: std::time::Duration,
        /// The result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// What changed between two snapshots: + added, - removed, M contents, U mode or mtime.
    Diff {
        #[command(flatten)]
        repo: RepoArgs,
        /// The older snapshot (id, prefix, or `latest`).
        a: String,
        /// The newer snapshot.
        b: String,
        /// One JSON object per line: {change, path}.
        #[arg(long)]
        json: bool,
    },
    /// The repository's keys: each wraps the master key with a password.
    Key {
        #[command(subcommand)]
        cmd: KeyCmd,
    },
    /// Sizes: what the snapshots hold against what the repository stores.
    Stats {
        #[command(flatten)]
        repo: RepoArgs,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Subcommand)]
enum KeyCmd {
    /// List the keys (the one this password opens is marked `*`).
    List {
        #[command(flatten)]
        repo: RepoArgs,
        /// As JSON: [{id, current, created, host, user}].
        #[arg(long)]
        json: bool,
    },
    /// Add a key: a new password for the same repository.
    Add {
        #[command(flatten)]
        repo: RepoArgs,
        #[command(flatten)]
        new: NewPassword,
    },
    /// Remove a key (another than the one this password opens).
    Remove {
        #[command(flatten)]
        repo: RepoArgs,
        /// The key's id (or a unique prefix).
        id: String,
    },
    /// Change this password: add a key with the new one, then remove the current key.
    Passwd {
        #[command(flatten)]
        repo: RepoArgs,
        #[command(flatten)]
        new: NewPassword,
    },
}

/// Where a new password comes from.
#[derive(clap::Args)]
struct NewPassword {
    /// Read the new password from the first line of FILE (else DEDUPWIRE_NEW_PASSWORD, else it
    /// is asked twice on the terminal).
    #[arg(long, value_name = "FILE")]
    new_password_file: Option<PathBuf>,
}

impl NewPassword {
    fn get(&self, repo: &RepoArgs) -> Result<Vec<u8>> {
        let args = RepoArgs {
            repo: repo.repo.clone(),
            password_file: self.new_password_file.clone(),
            request_stats: false,
        };
        match (
            &self.new_password_file,
            std::env::var_os("DEDUPWIRE_NEW_PASSWORD"),
        ) {
            (None, Some(p)) if !p.is_empty() => {
                Ok(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec())
            }
            (None, _) => args.ask_new(),
            (Some(_), _) => args.password(false),
        }
    }
}

fn find_key(repo: &Repository, prefix: &str) -> Result<String> {
    let keys = repo.keys()?;
    let found: Vec<&String> = keys
        .iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with(prefix))
        .collect();
    match found.as_slice() {
        [one] => Ok((*one).clone()),
        [] => bail!("no key {prefix:?} (see `dedupwire repo key list`)"),
        _ => bail!("{prefix:?} names {} keys: give more of the id", found.len()),
    }
}

fn key(cmd: KeyCmd) -> Result<()> {
    match cmd {
        KeyCmd::List { repo, json } => {
            let repo = repo.open()?;
            let keys = repo.keys()?;
            if json {
                let list: Vec<_> = keys
                    .iter()
                    .map(|(id, k)| {
                        json!({"id": id, "current": id == repo.key_name(), "created": k.created,
                               "host": k.host, "user": k.user})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(" {:<32}  {:<20}  {:<12}  user", "id", "created", "host");
                for (id, k) in &keys {
                    let mark = if id == repo.key_name() { '*' } else { ' ' };
                    println!(
                        "{mark}{id:<32}  {:<20}  {:<12}  {}",
                        k.created, k.host, k.user
                    );
                }
            }
        }
        KeyCmd::Add { repo: args, new } => {
            let repo = args.open()?;
            let password = new.get(&args)?;
            let id = repo.add_key(&password, RepoArgs::kdf())?;
            eprintln!("added key {id}");
        }
        KeyCmd::Remove { repo, id } => {
            let repo = repo.open()?;
            let id = find_key(&repo, &id)?;
            repo.remove_key(&id)?;
            eprintln!("removed key {id}");
        }
        KeyCmd::Passwd { repo: args, new } => {
            let repo = args.open()?;
            let password = new.get(&args)?;
            let id = repo.add_key(&password, RepoArgs::kdf())?;
            repo.backend()
                .delete(dedupwire_repo::ObjectKind::Key, repo.key_name())?;
            eprintln!("password changed: key {id} replaces {}", repo.key_name());
        }
    }
    Ok(())
}

fn diff(repo: &Repository, a: &str, b: &str, json: bool) -> Result<()> {
    let (ida, sa) = repo.find_snapshot(a)?;
    let (idb, sb) = repo.find_snapshot(b)?;
    let changes = dedupwire_repo::diff::diff(repo, &sa.tree, &sb.tree)?;
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    for (change, path) in &changes {
        if json {
            let kind = match change {
                dedupwire_repo::diff::Change::Added => "added",
                dedupwire_repo::diff::Change::Removed => "removed",
                dedupwire_repo::diff::Change::Modified => "modified",
                dedupwire_repo::diff::Change::Metadata => "metadata",
            };
            writeln!(out, "{}", json!({"change": kind, "path": path}))?;
        } else {
            writeln!(out, "{} {}", change.symbol(), path.display())?;
        }
    }
    if !json {
        let count = |c| changes.iter().filter(|(x, _)| *x == c).count();
        use dedupwire_repo::diff::Change;
        eprintln!(
            "{} -> {}: {} added, {} removed, {} modified, {} metadata only",
            &ida[..8],
            &idb[..8],
            count(Change::Added),
            count(Change::Removed),
            count(Change::Modified),
            count(Change::Metadata)
        );
    }
    Ok(())
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::Init {
            repo,
            chunk_size,
            pack_size,
            json,
        } => init(&repo, &chunk_size, &pack_size, json),
        Cmd::Snapshots { repo, json } => snapshots(&repo.open()?, json),
        Cmd::Ls {
            repo,
            snapshot,
            path,
            json,
        } => ls(&repo.open()?, &snapshot, path.as_deref(), json),
        Cmd::Check {
            repo,
            read_data,
            read_data_subset,
            json,
        } => {
            let share = match (read_data, read_data_subset) {
                (true, _) => 1.0,
                (false, Some(s)) => {
                    let n: f64 = s
                        .trim_end_matches('%')
                        .parse()
                        .ok()
                        .filter(|n| (0.0..=100.0).contains(n))
                        .with_context(|| {
                            format!("--read-data-subset {s:?}: use a share like 10%")
                        })?;
                    n / 100.0
                }
                (false, None) => 0.0,
            };
            run_check(&repo.open()?, share, json)
        }
        Cmd::Stats { repo, json } => stats(&repo.open()?, json),
        Cmd::Diff { repo, a, b, json } => diff(&repo.open()?, &a, &b, json),
        Cmd::Key { cmd } => key(cmd),
        Cmd::Forget {
            repo,
            keep_last,
            keep_daily,
            keep_weekly,
            keep_monthly,
            dry_run,
            prune,
            keep_delete,
            json,
        } => {
            let policy = KeepPolicy {
                last: keep_last,
                daily: keep_daily,
                weekly: keep_weekly,
                monthly: keep_monthly,
            };
            let then_prune = prune.then_some(keep_delete);
            forget(&mut repo.open()?, &policy, dry_run, then_prune, json)
        }
        Cmd::Prune {
            repo,
            dry_run,
            repack_below,
            keep_delete,
            json,
        } => {
            if !(0.0..=1.0).contains(&repack_below) {
                bail!("--repack-below {repack_below}: a share between 0 and 1");
            }
            let opts = prune::PruneOptions {
                repack_below,
                keep_delete,
                dry_run,
            };
            let r = prune::prune_with(&mut repo.open()?, &opts)?;
            print_prune(&r, dry_run, json);
            Ok(())
        }
    }
}

fn prune_json(r: &prune::PruneReport) -> serde_json::Value {
    json!({
        "blobs_live": r.blobs_live,
        "blobs_unused": r.blobs_unused,
        "packs_deleted": r.packs_deleted,
        "packs_repacked": r.packs_repacked,
        "packs_unindexed": r.packs_unindexed,
        "packs_marked": r.packs_marked,
        "packs_recovered": r.packs_recovered,
        "packs_pending": r.packs_pending,
        "bytes_freed": r.bytes_freed,
        "bytes_written": r.bytes_written,
    })
}

fn print_prune(r: &prune::PruneReport, dry_run: bool, json: bool) {
    if json {
        println!("{}", prune_json(r));
        return;
    }
    let would = if dry_run { "would free" } else { "freed" };
    eprintln!(
        "prune: {} blobs live, {} unused; {} packs deleted, {} repacked ({} written), {} in \
         no index; {} marked for deletion, {} unmarked (used again), {} waiting; {would} {}",
        r.blobs_live,
        r.blobs_unused,
        r.packs_deleted,
        r.packs_repacked,
        human_bytes(r.bytes_written),
        r.packs_unindexed,
        r.packs_marked,
        r.packs_recovered,
        r.packs_pending,
        human_bytes(r.bytes_freed)
    );
}

fn forget(
    repo: &mut Repository,
    policy: &KeepPolicy,
    dry_run: bool,
    then_prune: Option<std::time::Duration>,
    json: bool,
) -> Result<()> {
    if policy.is_empty() {
        bail!(
            "no keep policy: give --keep-last, --keep-daily, --keep-weekly or --keep-monthly \
             (forgetting every snapshot is not something to do by omission)"
        );
    }
    let all = repo.snapshots()?;
    let (keep, gone) = prune::plan_forget(&all, policy);
    if !dry_run {
        prune::forget(repo, &gone)?;
    }
    let pruned = match then_prune {
        Some(keep_delete) if !dry_run => Some(prune::prune_with(
            repo,
            &prune::PruneOptions {
                keep_delete,
                ..prune::PruneOptions::default()
            },
        )?),
        _ => None,
    };
    if json {
        println!(
            "{}",
            json!({"keep": keep, "forget": gone, "dry_run": dry_run,
                   "prune": pruned.as_ref().map(prune_json)})
        );
        return Ok(());
    }
    let verb = if dry_run { "would forget" } else { "forgot" };
    for id in &gone {
        eprintln!("  {verb} {}", &id[..8]);
    }
    eprintln!(
        "{verb} {} snapshots, kept {}{}",
        gone.len(),
        keep.len(),
        if then_prune.is_none() && !dry_run && !gone.is_empty() {
            "; their data goes at the next `dedupwire repo prune`"
        } else {
            ""
        }
    );
    if let Some(r) = &pruned {
        print_prune(r, false, false);
    }
    Ok(())
}

/// A duration: a number and a unit, `s`, `m`, `h` or `d` (`90s`, `30m`, `1h`, `2d`).
fn parse_duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{text:?}: a number then s, m, h or d (e.g. 1h)"))?;
    let per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is s, m, h or d (e.g. 1h)")),
    };
    n.checked_mul(per)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{text:?}: too long"))
}

fn init(args: &RepoArgs, chunk_size: &str, pack_size: &str, json: bool) -> Result<()> {
    let size = |what: &str, text: &str, range: std::ops::RangeInclusive<u64>| {
        dedupwire_analyze::parse_size(text)
            .map(|n| n as u64)
            .filter(|n| range.contains(n))
            .with_context(|| {
                format!(
                    "--{what} {text:?}: give a size from {} to {}, like 8KiB",
                    human_bytes(*range.start()),
                    human_bytes(*range.end())
                )
            })
    };
    let avg = size("chunk-size", chunk_size, 1 << 10..=1 << 20)?;
    anyhow::ensure!(
        avg.is_power_of_two(),
        "--chunk-size {chunk_size:?}: give a power of two (4KiB, 8KiB, 16KiB, …)"
    );
    let mut config = Config::default();
    config.chunker.avg = avg as usize;
    config.chunker.min = (avg / 4) as usize;
    config.chunker.max = (avg * 8) as usize;
    config.pack_size = size("pack-size", pack_size, 4 << 20..=64 << 20)? as usize;
    let backend = args.create()?;
    let password = args.password(true)?;
    let repo = Repository::init(backend, &password, RepoArgs::kdf(), config)?;
    if json {
        println!("{}", json!({ "id": repo.config().id, "repo": args.repo }));
    } else {
        eprintln!(
            "created repository {} at {}\n  keep the password: without it nothing in the \
             repository can be read",
            &repo.config().id[..8],
            args.repo.display()
        );
    }
    Ok(())
}

fn snapshots(repo: &Repository, json: bool) -> Result<()> {
    let all = repo.snapshots()?;
    if json {
        let list: Vec<_> = all
            .iter()
            .map(|(id, s)| {
                json!({
                    "id": id,
                    "short_id": &id[..8],
                    "time": rfc3339(s.time_ns.div_euclid(1_000_000_000)),
                    "host": s.host,
                    "user": s.user,
                    "paths": s.paths,
                    "tags": s.tags,
                    "tree": s.tree,
                    "parent": s.parent,
                    "summary": s.summary,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<8}  {:<20}  {:<12}  {:<12}  paths",
        "id", "time", "host", "tags"
    );
    for (id, s) in &all {
        println!(
            "{:<8}  {:<20}  {:<12}  {:<12}  {}",
            &id[..8],
            rfc3339(s.time_ns.div_euclid(1_000_000_000)),
            s.host,
            s.tags.join(","),
            s.paths.join(" ")
        );
    }
    println!("{} snapshots", all.len());
    Ok(())
}

fn ls(repo: &Repository, spec: &str, below: Option<&std::path::Path>, json: bool) -> Result<()> {
    let (_, snapshot) = repo.find_snapshot(spec)?;
    let mut stack = vec![(PathBuf::new(), snapshot.tree)];
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    while let Some((dir, tree_id)) = stack.pop() {
        let tree = repo.read_tree(&tree_id)?;
        for node in tree.nodes.iter().rev() {
            let name = node.name_bytes().unwrap_or_default();
            let path =
                dir.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name));
            let (kind, size) = match &node.kind {
                NodeKind::File { size, .. } => ("file", *size),
                NodeKind::Dir { subtree } => {
                    stack.push((path.clone(), *subtree));
                    ("dir", 0)
                }
                NodeKind::Symlink { .. } => ("symlink", 0),
            };
            if below.is_some_and(|b| !path.starts_with(b)) {
                continue;
            }
            if json {
                let target = match &node.kind {
                    NodeKind::Symlink { target, target_hex } => bytes_of(target, target_hex)
                        .map(|t| String::from_utf8_lossy(&t).into_owned()),
                    _ => None,
                };
                writeln!(
                    out,
                    "{}",
                    json!({"path": path, "type": kind, "size": size, "mode": node.mode,
                           "mtime_ns": node.mtime_ns, "target": target})
                )?;
            } else {
                writeln!(
                    out,
                    "{} {:o} {:>10} {}",
                    &kind[..1],
                    node.mode,
                    size,
                    path.display()
                )?;
            }
        }
    }
    Ok(())
}

fn run_check(repo: &Repository, share: f64, json: bool) -> Result<()> {
    let r = check(repo, share)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "snapshots": r.snapshots,
                "packs": r.packs,
                "packs_read": r.packs_read,
                "blobs": r.blobs,
                "unindexed_packs": r.unindexed_packs,
                "errors": r.errors,
            }))?
        );
    } else {
        for e in &r.errors {
            eprintln!("dedupwire repo check: {e}");
        }
        eprintln!(
            "checked {} snapshots, {} packs ({} read whole), {} blobs: {}",
            r.snapshots,
            r.packs,
            r.packs_read,
            r.blobs,
            if r.errors.is_empty() {
                "no errors".to_string()
            } else {
                format!("{} errors", r.errors.len())
            }
        );
        if r.unindexed_packs > 0 {
            eprintln!(
                "  {} packs are in no index (left by an interrupted backup; harmless)",
                r.unindexed_packs
            );
        }
    }
    if !r.errors.is_empty() {
        bail!("the repository has {} errors", r.errors.len());
    }
    Ok(())
}

fn stats(repo: &Repository, json: bool) -> Result<()> {
    let snaps = repo.snapshots()?;
    let raw: u64 = snaps.iter().map(|(_, s)| s.summary.bytes_total).sum();
    let stored: u64 = repo.index().packs().map(|(_, size)| size).sum();
    let (mut data, mut delta, mut tree, mut tree_delta) = (0u64, 0u64, 0u64, 0u64);
    for (_, loc) in repo.index().blobs() {
        match loc.kind {
            BlobKind::Data => data += 1,
            BlobKind::Delta => delta += 1,
            BlobKind::Tree => tree += 1,
            BlobKind::TreeDelta => tree_delta += 1,
        }
    }
    let index_bytes = repo.index().memory_bytes() as u64;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "snapshots": snaps.len(),
                "bytes_in_snapshots": raw,
                "bytes_stored": stored,
                "packs": repo.index().packs().count(),
                "blobs_whole": data,
                "blobs_delta": delta,
                "blobs_tree": tree + tree_delta,
                "blobs_tree_delta": tree_delta,
                "index_memory_bytes": index_bytes,
            }))?
        );
        return Ok(());
    }
    println!(
        "{} snapshots holding {}, stored in {}{}",
        snaps.len(),
        human_bytes(raw),
        human_bytes(stored),
        if stored > 0 {
            format!(" ({:.1}x)", raw as f64 / stored as f64)
        } else {
            String::new()
        }
    );
    println!(
        "  blobs     {data} whole chunks, {delta} deltas, {} trees ({tree_delta} as deltas)",
        tree + tree_delta
    );
    println!("  index     {} in memory", human_bytes(index_bytes));
    Ok(())
}
