//! The `dedupwire` command line: one module per subcommand, all logic in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd_analyze;
mod cmd_backup;
mod cmd_key;
mod cmd_replicate;
mod cmd_repo;
mod cmd_restore;
mod cmd_send;
mod cmd_serve;
mod out_file;
mod repo_args;
mod transport;

#[derive(Parser)]
#[command(
    name = "dedupwire",
    version,
    about = "Move and keep data without sending or storing the same bytes twice"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure how much each dedup method would save on your data, and what it costs.
    Analyze(cmd_analyze::Args),
    /// Ship a database's change stream with similarity dedup (sDedup).
    Replicate(cmd_replicate::Args),
    /// Make a directory on a `dedupwire serve` an exact copy of a local tree, sending only
    /// what it lacks.
    Send(cmd_send::Args),
    /// Receive trees from `dedupwire send` into a directory, each swapped in atomically.
    Serve(cmd_serve::Args),
    /// Make the shared key that authenticates and encrypts connections (`--key-file`).
    Key(cmd_key::Args),
    /// Back up files and directories into a repository: a new snapshot, storing only what
    /// the repository lacks, similar chunks as deltas.
    Backup(cmd_backup::Args),
    /// Restore a snapshot from a repository into a directory.
    Restore(cmd_restore::Args),
    /// Make and inspect backup repositories: init, snapshots, ls, check, stats.
    Repo(cmd_repo::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Analyze(a) => cmd_analyze::run(a),
        Cmd::Replicate(a) => cmd_replicate::run(a),
        Cmd::Key(a) => cmd_key::run(a),
        Cmd::Send(a) => cmd_send::run(a),
        Cmd::Serve(a) => cmd_serve::run(a),
        Cmd::Backup(a) => cmd_backup::run(a),
        Cmd::Restore(a) => cmd_restore::run(a),
        Cmd::Repo(a) => cmd_repo::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dedupwire: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
