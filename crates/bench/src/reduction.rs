//! reduction benchmark (pending).

/// Options of the reduction benchmark.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the reduction benchmark and prints its table.
pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet built")
}
