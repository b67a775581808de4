//! An output file a run or a command writes (`--summary-json`, `--json`, every file in an
//! output folder) is either absent, in a folder that can be written, or a regular file. A
//! symbolic link is refused, never followed; a folder, a FIFO, a device node or a socket is
//! refused too. Commands check their paths before any work, and [`crate::report::write_atomic`]
//! checks again right before it replaces the file.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::config::{out_of_range, ConfigError};
use crate::report::printable;

/// What is wrong with `path` as a file to write or replace, if anything.
pub fn fault(path: &Path) -> Option<String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            let kind = meta.file_type();
            if kind.is_symlink() {
                Some("is a symbolic link: name the file itself (links are not followed)".into())
            } else if kind.is_dir() {
                Some("is a folder: name a file".into())
            } else if !kind.is_file() {
                Some("is not a regular file (a FIFO, a device or a socket): name a file".into())
            } else {
                None
            }
        }
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => Some(format!("cannot write there: {e}")),
    }
}

/// Checks `path` for `flag` before any work: [`fault`], then proves a file can be made in its
/// folder (leaving nothing behind). One line, exit 2.
pub fn check(flag: &'static str, path: &Path) -> Result<(), ConfigError> {
    let fail = |what: String| out_of_range(flag, printable(&path.display().to_string()), &what);
    if let Some(what) = fault(path) {
        return Err(fail(what));
    }
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    writable_folder(folder).map_err(|e| fail(format!("cannot write there: {e}")))
}

/// Makes and removes a file only this process names, proving `folder` takes new files.
pub fn writable_folder(folder: &Path) -> std::io::Result<()> {
    let probe = folder.join(format!(".oomlab-write-check-{}", std::process::id()));
    // create_new (O_EXCL) never follows a link and never opens an existing file.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// Opens a fresh `tmp` for writing: a stale file or link by that name (left by a crash) is
/// removed first, and the new one is created exclusively, so nothing is written through a link.
pub fn create_fresh(tmp: &Path) -> std::io::Result<std::fs::File> {
    match std::fs::symlink_metadata(tmp) {
        Ok(meta) if meta.is_dir() => {
            return Err(std::io::Error::new(
                ErrorKind::AlreadyExists,
                format!("{} is a folder", tmp.display()),
            ))
        }
        Ok(_) => std::fs::remove_file(tmp)?,
        Err(_) => {}
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)
}

/// Makes `path` an empty regular file if nothing is there (a folder's mark of ownership);
/// an existing regular file is left as it is, anything else is an error.
pub fn create_marker(path: &Path) -> std::io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match fault(path) {
            None => Ok(()),
            Some(what) => Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("{}: {what}", path.display()),
            )),
        },
        Err(e) => Err(e),
    }
}
