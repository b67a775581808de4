//! A checkpoint on disk: one folder whose files are written together or not at all, and
//! verified before anything in them is believed.
//!
//! The set is written into `<dir>.partial` (a stale one from a crash is removed first), every
//! file and the folder are fsynced, and the folder is swapped with `<dir>` by one
//! `renameat2(RENAME_EXCHANGE)`: `<dir>` holds the old complete set until that instant and
//! the new complete set after it. Where the exchange is not available, `<dir>` is renamed to
//! `<dir>.old` first and the loader falls back to it while `<dir>` is missing.
//!
//! `manifest.json` lists every file with its size and SHA-256; loading checks them first, so a
//! flipped byte, a truncated file or an edited `state.json` is one line naming the file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::report::suffixed;

/// The manifest's name inside a set.
pub const MANIFEST: &str = "manifest.json";

/// What is wrong with a checkpoint: the binary reports it on one line, exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// No checkpoint set at the path.
    #[error("--resume {0}: no checkpoint there (no {MANIFEST})")]
    Missing(PathBuf),
    /// A file of the set is not what the manifest says.
    #[error("checkpoint file {path}: {what}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Its fault.
        what: String,
    },
    /// The checkpoint belongs to a run the config does not continue.
    #[error("--resume {dir}: {message}")]
    Mismatch {
        /// The checkpoint folder.
        dir: PathBuf,
        /// What differs and what may differ.
        message: String,
    },
}

/// One file of a set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    bytes: u64,
    sha256: String,
}

/// `manifest.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Manifest {
    files: BTreeMap<String, Entry>,
}

/// Where a new set of `dir` is written before it is swapped in.
pub fn partial(dir: &Path) -> PathBuf {
    suffixed(dir, ".partial")
}

/// A fresh, empty `<dir>.partial` to write the files of a new set into.
pub fn begin(dir: &Path) -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    let tmp = partial(dir);
    if tmp.exists() {
        // Left by a crash mid-write: never part of a complete set.
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    Ok(tmp)
}

/// Seals the files written into `tmp` (from [`begin`]) with a manifest, syncs them and swaps
/// the set in as `dir`. On an error nothing of `dir` has changed.
pub fn commit(tmp: &Path, dir: &Path, files: &[&str]) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut manifest = Manifest::default();
    for name in files {
        let path = tmp.join(name);
        let (bytes, sha256) = digest(&path)?;
        File::open(&path)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", path.display()))?;
        manifest
            .files
            .insert(name.to_string(), Entry { bytes, sha256 });
    }
    let path = tmp.join(MANIFEST);
    std::fs::write(&path, serde_json::to_string_pretty(&manifest)? + "\n")
        .and_then(|()| File::open(&path)?.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    sync_dir(tmp)?;
    swap_in(tmp, dir)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Makes `tmp` the set at `dir`, removing the set it replaces.
fn swap_in(tmp: &Path, dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let moving = || format!("moving {} to {}", tmp.display(), dir.display());
    if !dir.exists() {
        return std::fs::rename(tmp, dir).with_context(moving);
    }
    if exchange(tmp, dir).is_ok() {
        // `tmp` now holds the previous set.
        return std::fs::remove_dir_all(tmp).with_context(|| format!("removing {}", tmp.display()));
    }
    let old = suffixed(dir, ".old");
    if old.exists() {
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    std::fs::rename(dir, &old).with_context(|| format!("moving {} aside", dir.display()))?;
    std::fs::rename(tmp, dir).with_context(moving)?;
    std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))
}

/// Atomically exchanges two folders (Linux `renameat2(RENAME_EXCHANGE)`).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    // Directories can be opened and synced on Unix; elsewhere this is best effort.
    match File::open(dir).and_then(|f| f.sync_all()) {
        Err(e) if cfg!(unix) => Err(e).with_context(|| format!("syncing {}", dir.display())),
        _ => Ok(()),
    }
}

/// Size and SHA-256 (hex) of a file.
fn digest(path: &Path) -> anyhow::Result<(u64, String)> {
    use anyhow::Context;
    let mut file = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((bytes, hex(&hasher.finalize())))
}

/// Lower-case hex of a digest.
fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The set to read for `dir`: `dir` itself, or `<dir>.old` when a non-atomic swap was cut
/// short between its two renames. A manifest that is there but is no regular file (a
/// symbolic link, a FIFO) is never followed: that is a corrupt set, not a missing one.
pub fn locate(dir: &Path) -> Result<PathBuf, CheckpointError> {
    let manifest = |set: &Path| -> Result<bool, CheckpointError> {
        let path = set.join(MANIFEST);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(true),
            Ok(_) => Err(CheckpointError::Corrupt {
                path,
                what: NOT_REGULAR.into(),
            }),
            Err(_) => Ok(false),
        }
    };
    if manifest(dir)? {
        return Ok(dir.to_path_buf());
    }
    let old = suffixed(dir, ".old");
    if !dir.exists() && manifest(&old)? {
        return Ok(old);
    }
    Err(CheckpointError::Missing(dir.to_path_buf()))
}

/// Why a set's file that is a link, a FIFO, a device or a folder is refused.
const NOT_REGULAR: &str =
    "not a regular file (a checkpoint's files are never links, FIFOs or devices)";

/// The verified contents of a set's files, by name.
pub type Verified = BTreeMap<String, Vec<u8>>;

/// Checks that the manifest of the set at `dir` lists exactly the files `names`, each of at
/// most `limit(name)` bytes, and that every one has the size and checksum written; returns
/// their contents as read and hashed, so that nothing is opened again after the check.
pub fn verify(
    dir: &Path,
    names: &[&str],
    limit: impl Fn(&str) -> u64,
) -> Result<Verified, CheckpointError> {
    let path = dir.join(MANIFEST);
    let corrupt = |path: &Path, what: String| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    let text = read_regular(&path, MAX_MANIFEST_BYTES, None)
        .map_err(|what| corrupt(&path, what))
        .and_then(|bytes| {
            String::from_utf8(bytes).map_err(|_| corrupt(&path, "not UTF-8 text".into()))
        })?;
    let manifest: Manifest =
        serde_json::from_str(&text).map_err(|e| corrupt(&path, format!("not a manifest: {e}")))?;
    if let Some(name) = names.iter().find(|n| !manifest.files.contains_key(**n)) {
        return Err(corrupt(&path, format!("does not list {name}")));
    }
    if let Some(name) = manifest.files.keys().find(|k| !names.contains(&k.as_str())) {
        // Only the set's own names are ever opened: a manifest cannot point anywhere else.
        return Err(corrupt(
            &path,
            format!(
                "lists {name:?}, which is not a file of a checkpoint (those are {})",
                names.join(", ")
            ),
        ));
    }
    let mut files = Verified::new();
    for name in names {
        let expected = &manifest.files[*name];
        let max = limit(name);
        if expected.bytes > max {
            return Err(corrupt(
                &path,
                format!(
                    "states {} bytes for {name}, more than the {max} a checkpoint's {name} may \
                     hold",
                    expected.bytes
                ),
            ));
        }
        let file = dir.join(name);
        let bytes = read_regular(&file, expected.bytes, Some(expected.bytes))
            .map_err(|w| corrupt(&file, w))?;
        if hex(&Sha256::digest(&bytes)) != expected.sha256 {
            return Err(corrupt(
                &file,
                "checksum mismatch: its content changed after it was written".into(),
            ));
        }
        files.insert(name.to_string(), bytes);
    }
    Ok(files)
}

/// The largest manifest read: four entries take a few hundred bytes.
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Reads the regular file at `path` without following a symbolic link and without blocking
/// on a FIFO: at most `max` bytes, and exactly `exact` bytes where that is given (one byte
/// more is read to tell a longer file). Errors are the text of a one-line message.
fn read_regular(path: &Path, max: u64, exact: Option<u64>) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        // O_NOFOLLOW: a link (to /dev/zero, to another file) fails with ELOOP instead of being
        // followed; O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => NOT_REGULAR.to_string(),
            _ => format!("unreadable: {e}"),
        })?;
    // The opened handle is what is checked and read: a swap after the open changes nothing.
    let meta = file.metadata().map_err(|e| format!("unreadable: {e}"))?;
    if !meta.is_file() {
        return Err(NOT_REGULAR.into());
    }
    let mut bytes = Vec::with_capacity(meta.len().min(max) as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("unreadable: {e}"))?;
    let read = bytes.len() as u64;
    match exact {
        Some(n) if read > n => Err(format!(
            "more than the {n} bytes written (appended to or replaced)"
        )),
        Some(n) if read < n => Err(format!(
            "{read} bytes where {n} were written (truncated or replaced)"
        )),
        None if read > max => Err(format!("larger than {max} bytes")),
        _ => Ok(bytes),
    }
}
