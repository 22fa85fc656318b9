//! delta benchmark (pending).

/// Options of the delta benchmark.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the delta benchmark and prints its table.
pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet built")
}
