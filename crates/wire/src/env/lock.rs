//! The environment's lock file: one process (one open handle) at a time per directory.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use crate::store::StoreError;

/// The name of the lock file inside an environment directory.
pub const LOCK_FILE: &str = "LOCK";

/// An exclusive advisory lock (`flock` / `LockFileEx`) on `DIR/LOCK`, held until dropped.
///
/// The lock belongs to the open file, not the process, so a second [`DirLock::acquire`] on the
/// same directory fails even inside the process that holds the first.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock without waiting; `Refused` if another handle holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, StoreError> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| {
                StoreError::Io(io::Error::new(
                    e.kind(),
                    format!("cannot open lock file {}: {e}", path.display()),
                ))
            })?;
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(fs4::TryLockError::WouldBlock) => Err(StoreError::Refused(format!(
                "environment {} is in use by another process",
                dir.display()
            ))),
            Err(fs4::TryLockError::Error(e)) => Err(StoreError::Io(io::Error::new(
                e.kind(),
                format!("cannot lock {}: {e}", path.display()),
            ))),
        }
    }
}
