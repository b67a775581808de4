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
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((bytes, hex))
}

/// The set to read for `dir`: `dir` itself, or `<dir>.old` when a non-atomic swap was cut
/// short between its two renames.
pub fn locate(dir: &Path) -> Result<PathBuf, CheckpointError> {
    if dir.join(MANIFEST).is_file() {
        return Ok(dir.to_path_buf());
    }
    let old = suffixed(dir, ".old");
    if !dir.exists() && old.join(MANIFEST).is_file() {
        return Ok(old);
    }
    Err(CheckpointError::Missing(dir.to_path_buf()))
}

/// Checks that the set at `dir` lists every one of `required` and that every file it lists
/// has the size and checksum written.
pub fn verify(dir: &Path, required: &[&str]) -> Result<(), CheckpointError> {
    let path = dir.join(MANIFEST);
    let corrupt = |path: &Path, what: String| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        what,
    };
    let text = crate::config::read_bounded(&path, 1 << 20)
        .map_err(|e| corrupt(&path, format!("unreadable: {e}")))?;
    let manifest: Manifest =
        serde_json::from_str(&text).map_err(|e| corrupt(&path, format!("not a manifest: {e}")))?;
    if let Some(name) = required.iter().find(|n| !manifest.files.contains_key(**n)) {
        return Err(corrupt(&path, format!("does not list {name}")));
    }
    for (name, expected) in &manifest.files {
        let file = dir.join(name);
        let (bytes, sha256) = digest(&file).map_err(|e| corrupt(&file, format!("{e:#}")))?;
        if bytes != expected.bytes {
            return Err(corrupt(
                &file,
                format!(
                    "{bytes} bytes where {} were written (truncated or replaced)",
                    expected.bytes
                ),
            ));
        }
        if sha256 != expected.sha256 {
            return Err(corrupt(
                &file,
                "checksum mismatch: its content changed after it was written".into(),
            ));
        }
    }
    Ok(())
}
