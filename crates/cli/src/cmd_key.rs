//! `dedupwire key generate|id`: make the shared key of `--key-file`, and compare keys without
//! showing them.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use dedupwire_wire::Key;

/// Options of `dedupwire key`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Make a new random key: print it (64 hexadecimal digits), or write it to FILE.
    ///
    /// Copy the key to both ends of a connection and pass it with `--key-file`.
    Generate {
        /// Write the key to FILE, readable by its owner only (an existing file is left alone).
        file: Option<PathBuf>,
    },
    /// Print a key's public id: equal on both ends when they hold the same key.
    Id {
        /// The key file [default: $DEDUPWIRE_KEY].
        file: Option<PathBuf>,
    },
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::Generate { file } => {
            let key = Key::generate()?;
            match file {
                Some(path) => write_private(&path, &format!("{}\n", key.to_hex()))?,
                None => println!("{}", key.to_hex()),
            }
        }
        Cmd::Id { file } => {
            let key = match file {
                Some(path) => Key::load(&path)?,
                None => {
                    let text = std::env::var(crate::transport::KEY_ENV).with_context(|| {
                        format!("give a key file or set {}", crate::transport::KEY_ENV)
                    })?;
                    Key::from_text(&text, crate::transport::KEY_ENV)?
                }
            };
            println!("{}", key.id());
        }
    }
    Ok(())
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot create key file {}", path.display()))?;
    let written = file
        .write_all(text.as_bytes())
        .and_then(|()| file.sync_all());
    if written.is_err() {
        // This run created the file: a partial key must not be left for a later one to load.
        let _ = std::fs::remove_file(path);
    }
    written.with_context(|| format!("cannot write key file {}", path.display()))
}
