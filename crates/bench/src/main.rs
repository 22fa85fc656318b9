//! `dedupwire-bench`: dedupwire and its peers side by side in one run, printing ratios.
//!
//! Run everything with `bench/run.sh`; each subcommand is one benchmark family.

use clap::{Parser, Subcommand};

mod channel;
mod channel_peer;
mod chunking;
mod delta;
mod env;
mod reduction;
mod replicate;
mod secure;
mod wan;

#[derive(Parser)]
#[command(about = "dedupwire benchmarks: ours vs peers in the same run")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Consecutive releases over loopback TCP: dedup channel vs plain zstd-3, socket bytes and MB/s.
    Channel(channel::Args),
    /// The channel's receiving end as its own process, with a persistent environment (links.sh).
    ChannelRecv(channel_peer::RecvArgs),
    /// The channel's sending end as its own process: each input one message (links.sh).
    ChannelSend(channel_peer::SendArgs),
    /// Chunking and hashing throughput (ours vs the fastcdc crate vs memory bandwidth).
    Chunking(chunking::Args),
    /// Delta encode/decode speed and size (ours vs zstd-ref vs xdelta3 -9 vs zstd --patch-from).
    Delta(delta::Args),
    /// The channel's persistent chunk store: put, reopen, get and lookup speed, index RAM.
    Env(env::Args),
    /// Reduction on document streams and package releases (zstd, exact CDC, similarity+delta, oracle).
    Reduction(reduction::Args),
    /// Live PostgreSQL replication: dedupwire vs PostgreSQL logical replication, bytes on the wire.
    Replicate(replicate::Args),
    /// The encrypted transport's throughput beside plain frames (loopback TCP, in-memory pipe).
    Secure(secure::Args),
    /// A WAN delay between two interfaces, for tc-shaped links without netem (links.sh).
    WanDelay(wan::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Channel(a) => channel::run(&a),
        Cmd::ChannelRecv(a) => channel_peer::recv(&a),
        Cmd::ChannelSend(a) => channel_peer::send(&a),
        Cmd::Chunking(a) => chunking::run(&a),
        Cmd::Delta(a) => delta::run(&a),
        Cmd::Env(a) => env::run(&a),
        Cmd::Reduction(a) => reduction::run(&a),
        Cmd::Replicate(a) => replicate::run(&a),
        Cmd::Secure(a) => secure::run(&a),
        Cmd::WanDelay(a) => wan::run(&a),
    }
}
