//! What every repository command takes: where the repository is (`--repo`, `DEDUPWIRE_REPO`)
//! and its password (`DEDUPWIRE_PASSWORD`, `--password-file`, else asked on the terminal).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dedupwire_repo::{KdfParams, LocalBackend, Repository};

/// `--repo` and the password.
#[derive(clap::Args, Clone)]
pub struct RepoArgs {
    /// The repository: a directory [env: DEDUPWIRE_REPO].
    #[arg(long, short = 'r', env = "DEDUPWIRE_REPO", value_name = "DIR")]
    pub repo: PathBuf,
    /// Read the password from the first line of FILE (else DEDUPWIRE_PASSWORD, else it is
    /// asked on the terminal).
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
}

impl RepoArgs {
    /// The password, from the file, the environment or the terminal (`confirm`: asked twice).
    pub fn password(&self, confirm: bool) -> Result<Vec<u8>> {
        if let Some(f) = &self.password_file {
            let text = std::fs::read(f)
                .with_context(|| format!("reading the password file {}", f.display()))?;
            let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                bail!("the password file {} is empty", f.display());
            }
            return Ok(line.to_vec());
        }
        if let Some(p) = std::env::var_os("DEDUPWIRE_PASSWORD") {
            if p.is_empty() {
                bail!("DEDUPWIRE_PASSWORD is set but empty");
            }
            return Ok(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec());
        }
        if !std::io::stdin().is_terminal() {
            bail!(
                "no password: set DEDUPWIRE_PASSWORD or pass --password-file FILE (no terminal \
                 to ask on)"
            );
        }
        let first = rpassword::prompt_password("repository password: ")?;
        if confirm {
            let again = rpassword::prompt_password("the same password again: ")?;
            if again != first {
                bail!("the two passwords differ");
            }
        }
        if first.is_empty() {
            bail!("an empty password");
        }
        Ok(first.into_bytes())
    }

    /// A new password, asked twice on the terminal.
    pub fn ask_new(&self) -> Result<Vec<u8>> {
        if !std::io::stdin().is_terminal() {
            bail!(
                "no new password: set DEDUPWIRE_NEW_PASSWORD or pass --new-password-file FILE \
                 (no terminal to ask on)"
            );
        }
        let first = rpassword::prompt_password("new password: ")?;
        let again = rpassword::prompt_password("the new password again: ")?;
        if first != again {
            bail!("the two passwords differ");
        }
        if first.is_empty() {
            bail!("an empty password");
        }
        Ok(first.into_bytes())
    }

    /// Opens the repository.
    pub fn open(&self) -> Result<Repository> {
        let backend = LocalBackend::open(&self.repo)
            .with_context(|| format!("opening the repository {}", self.repo.display()))?;
        let password = self.password(false)?;
        Repository::open(Box::new(backend), &password)
            .with_context(|| format!("opening the repository {}", self.repo.display()))
    }

    /// The KDF cost of new key files: the default, or the test cost when
    /// `DEDUPWIRE_TEST_KDF=1` (only for test suites: it makes passwords cheap to guess).
    pub fn kdf() -> KdfParams {
        if std::env::var_os("DEDUPWIRE_TEST_KDF").is_some_and(|v| v == "1") {
            KdfParams::TEST
        } else {
            KdfParams::DEFAULT
        }
    }
}
