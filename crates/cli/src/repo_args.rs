//! What every repository command takes: where the repository is (`--repo`, `DEDUPWIRE_REPO`:
//! a directory or `s3:http://HOST:PORT/BUCKET/PREFIX`) and its password (`DEDUPWIRE_PASSWORD`,
//! `--password-file`, else asked on the terminal).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dedupwire_repo::{
    create_location, open_location, Backend, BackendError, BackendStats, KdfParams, ObjectKind,
    Repository,
};

/// `--repo` and the password.
#[derive(clap::Args, Clone)]
pub struct RepoArgs {
    /// The repository: a directory, or s3:http://HOST:PORT/BUCKET/PREFIX (https:// too;
    /// credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION)
    /// [env: DEDUPWIRE_REPO].
    #[arg(long, short = 'r', env = "DEDUPWIRE_REPO", value_name = "DIR|URL")]
    pub repo: PathBuf,
    /// Read the password from the first line of FILE (else DEDUPWIRE_PASSWORD, else it is
    /// asked on the terminal).
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// On exit, print the requests made to an S3 repository and the bytes sent and received,
    /// per kind of request (list, get, put, delete), on stderr.
    #[arg(long)]
    pub request_stats: bool,
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
        let backend = self.backend(open_location(&self.repo), "opening the repository")?;
        let password = self.password(false)?;
        Repository::open(backend, &password)
            .with_context(|| format!("opening the repository {}", self.repo.display()))
    }

    /// The backend of a new repository at `--repo` (which must hold none).
    pub fn create(&self) -> Result<Box<dyn Backend>> {
        self.backend(create_location(&self.repo), "creating a repository at")
    }

    /// The backend, with its requests reported on exit when asked; an error names the
    /// location (`doing`, then the location, unless the error names it).
    fn backend(
        &self,
        backend: Result<Box<dyn Backend>, BackendError>,
        doing: &str,
    ) -> Result<Box<dyn Backend>> {
        let backend = match backend {
            Ok(b) => b,
            Err(e @ BackendError::Remote { .. }) => return Err(e.into()),
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(format!("{doing} {}", self.repo.display()))
                )
            }
        };
        Ok(if self.request_stats {
            Box::new(Reported {
                inner: backend,
                location: self.repo.display().to_string(),
            })
        } else {
            backend
        })
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

/// A backend whose request counts are printed when it is dropped (`--request-stats`).
struct Reported {
    inner: Box<dyn Backend>,
    location: String,
}

impl Drop for Reported {
    fn drop(&mut self) {
        match self.inner.stats() {
            Some(s) => eprintln!("requests to {}: {s}", self.location),
            None => eprintln!("requests to {}: none (a local repository)", self.location),
        }
    }
}

impl Backend for Reported {
    fn list(&self, kind: ObjectKind) -> Result<Vec<(String, u64)>, BackendError> {
        self.inner.list(kind)
    }
    fn get(&self, kind: ObjectKind, name: &str) -> Result<Vec<u8>, BackendError> {
        self.inner.get(kind, name)
    }
    fn get_range(
        &self,
        kind: ObjectKind,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, BackendError> {
        self.inner.get_range(kind, name, offset, len)
    }
    fn put_new(&self, kind: ObjectKind, name: &str, bytes: &[u8]) -> Result<bool, BackendError> {
        self.inner.put_new(kind, name, bytes)
    }
    fn delete(&self, kind: ObjectKind, name: &str) -> Result<(), BackendError> {
        self.inner.delete(kind, name)
    }
    fn stats(&self) -> Option<BackendStats> {
        self.inner.stats()
    }
}
