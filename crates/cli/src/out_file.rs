//! Output files (reports, statistics) written whole or not at all.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Writes `bytes` to `path` through a temporary file in the same directory that is renamed
/// over it once complete: a full disk or a crash leaves the previous file (or none), never a
/// truncated one a later reader would take for a report. Created with the permissions
/// `std::fs::write` gives (`0o666` less the umask). A symbolic link is written through, to
/// the file it names; a device or a pipe (`/dev/stdout`) is written to directly.
pub fn write_whole(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let context = || format!("writing {}", path.display());
    let Some((target, dir)) = target_of(path).with_context(context)? else {
        return std::fs::write(path, bytes).with_context(context);
    };
    let mut tmp = temp_in(&dir).with_context(context)?;
    // Through the file itself: `tempfile`'s own writes name the temporary path in their errors.
    tmp.as_file_mut().write_all(bytes).with_context(context)?;
    tmp.as_file().sync_data().with_context(context)?;
    tmp.persist(&target)
        .map_err(|e| e.error)
        .with_context(context)?;
    Ok(())
}

/// Checks, before any long work, that [`write_whole`] could write `path`: its directory
/// exists and takes a new file. A run that would fail only at its end (a mistyped directory)
/// then fails at once, having cost nothing.
pub fn check_writable(path: &Path) -> anyhow::Result<()> {
    let context = || format!("writing {}", path.display());
    if let Some((_, dir)) = target_of(path).with_context(context)? {
        drop(temp_in(&dir).with_context(context)?);
    }
    Ok(())
}

/// The file `path` names (through a symbolic link) and its directory, or `None` for a device
/// or a pipe, which are written to directly.
fn target_of(path: &Path) -> std::io::Result<Option<(PathBuf, PathBuf)>> {
    let target = match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => return Ok(None),
        Ok(_) => std::fs::canonicalize(path)?,
        Err(_) => path.to_path_buf(),
    };
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(Some((target, dir)))
}

/// A new temporary file in `dir`. Its errors name the cause, not the temporary file's
/// made-up name (which `tempfile` appends, "at path …", and the user never asked for).
fn temp_in(dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(".dedupwire-").suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    builder.tempfile_in(dir).map_err(|e| {
        let message = e.to_string();
        match message.find(" at path ") {
            Some(at) => std::io::Error::new(e.kind(), &message[..at]),
            None => e,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        write_whole(&path, b"first").unwrap();
        write_whole(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn writes_through_a_link_and_straight_into_a_pipe() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        let (file, link) = (dir.path().join("latest.json"), dir.path().join("r.json"));
        std::fs::write(&file, b"old").unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        write_whole(&link, b"new").unwrap();
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        // As /dev/stdout is when piped: renaming over it would replace it.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        write_whole(&fifo, b"streamed").unwrap();
        // Checked first: a renamed-over pipe would leave the reader waiting forever.
        assert!(fifo.metadata().unwrap().file_type().is_fifo(), "replaced");
        assert_eq!(reader.join().unwrap(), b"streamed");
    }

    #[test]
    fn a_missing_directory_is_found_before_any_work_and_named_plainly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no/such/dir/r.json");
        for err in [check_writable(&path), write_whole(&path, b"x")] {
            let message = format!("{:#}", err.unwrap_err());
            assert!(message.starts_with("writing "), "{message}");
            assert!(message.contains("No such file or directory"), "{message}");
            assert!(
                !message.contains(".dedupwire-"),
                "names the temporary file: {message}"
            );
        }
        check_writable(&dir.path().join("r.json")).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "a file is left"
        );
    }

    #[test]
    fn a_failed_write_keeps_what_was_there() {
        let dir = tempfile::tempdir().unwrap();
        // A directory in the way: the rename fails after the bytes were written.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"kept").unwrap();
        let err = write_whole(&path, b"new").unwrap_err();
        let message = format!("{err:#}");
        assert!(message.starts_with("writing "), "{message}");
        assert!(
            !message.contains(".dedupwire-"),
            "names the temporary file: {message}"
        );
        assert_eq!(std::fs::read(path.join("inside")).unwrap(), b"kept");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "a temporary file is left"
        );
    }
}
