//! chunking benchmark (pending).

/// Options of the chunking benchmark.
#[derive(clap::Args)]
pub struct Args {}

/// Runs the chunking benchmark and prints its table.
pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet built")
}
