//! An advisory lock on an output folder, held for the life of the process that claimed it.
//!
//! `flock` on `<folder>/.oomlab.lock`: the kernel releases it when the process ends, however it
//! ends, so a crash never leaves a stale lock. The file holds the owner's pid, which a refused
//! run names. It stays after the run and marks the folder as one this program writes in.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The lock file's name inside a claimed folder.
pub const LOCK_FILE: &str = ".oomlab.lock";

/// A folder this process owns until the value is dropped (or the process ends).
#[derive(Debug)]
pub struct FolderLock {
    // Holding the open file holds the lock.
    _file: File,
    dir: PathBuf,
}

/// Why a folder could not be locked; shown after `key = folder: `.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it (its pid, when it had written it).
    #[error(
        "in use by another trainer process{}: wait for it to end, or choose another folder",
        .0.map_or_else(String::new, |pid| format!(" (pid {pid})"))
    )]
    Held(Option<u32>),
    /// The lock file could not be opened or locked (or is not a regular file).
    #[error("cannot lock it ({LOCK_FILE}): {0}")]
    Io(std::io::Error),
}

impl FolderLock {
    /// Takes the lock of `dir` (an existing folder) without waiting.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        // A lock file removed (by its owner, giving up an unused folder) between our open and
        // our lock is no longer the folder's: lock the one at the path now. Bounded: each
        // retry needs another process to remove the file again in that instant.
        for _ in 0..8 {
            if let Some(lock) = Self::try_once(dir)? {
                return Ok(lock);
            }
        }
        Err(LockError::Held(None))
    }

    /// One attempt; `None` when the file locked is no longer the one at the path.
    fn try_once(dir: &Path) -> Result<Option<Self>, LockError> {
        use std::os::unix::fs::MetadataExt;
        let path = dir.join(LOCK_FILE);
        // O_NOFOLLOW: a symlink planted as the lock file is refused (ELOOP), never followed;
        // O_NONBLOCK: a FIFO there cannot block the open.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(LockError::Io)?;
        let held = file.metadata().map_err(LockError::Io)?;
        // One link only: a hard link planted as the lock file would have another file emptied.
        if !held.is_file() || held.nlink() != 1 {
            return Err(LockError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{LOCK_FILE} is not a regular file of its own"),
            )));
        }
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(LockError::Held(owner(&mut file))),
            Err(TryLockError::Error(e)) => return Err(LockError::Io(e)),
        }
        let same = std::fs::symlink_metadata(&path)
            .is_ok_and(|now| now.dev() == held.dev() && now.ino() == held.ino());
        if !same {
            return Ok(None);
        }
        // The pid is written in place (the file holds at most a line): a reader racing with
        // this write sees no pid, never another process's.
        let pid = format!("{:<20}\n", std::process::id());
        file.write_all_at(pid.as_bytes(), 0)
            .and_then(|()| file.set_len(pid.len() as u64))
            .map_err(LockError::Io)?;
        Ok(Some(Self {
            _file: file,
            dir: dir.to_path_buf(),
        }))
    }

    /// The folder held.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The pid the holder wrote (the first 32 bytes are plenty for one).
fn owner(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}
