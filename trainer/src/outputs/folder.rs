//! What a folder is to a process that wants to write in it. A folder is this program's when it
//! is empty or holds the lock file an earlier claim left ([`super::lock::LOCK_FILE`]); a
//! folder of someone else's (the home folder, `/`, a folder of the user's own files) is never
//! written in. Inside its folder a process writes only the names it owns, and each of those
//! must be what it would write: a regular file, or a real folder holding only a set's names.

use std::ffi::OsString;
use std::path::Path;

use super::lock::LOCK_FILE;
use crate::report::{printable, suffixed};

/// Entries looked at before a folder is judged: far more than any run folder holds.
const MAX_ENTRIES: usize = 100_000;

/// Whether a process of this program may claim a folder.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    /// Empty, or claimed before by this program.
    Ours,
    /// Holds something else (one of its names, to show).
    Foreign(String),
}

/// Judges `dir` (an existing folder); `earlier` recognises a folder an earlier version of this
/// program wrote before folders were marked (e.g. one holding a verified checkpoint).
pub fn standing(dir: &Path, earlier: &dyn Fn(&Path) -> bool) -> std::io::Result<Standing> {
    let mut first: Option<OsString> = None;
    for entry in std::fs::read_dir(dir)?.take(MAX_ENTRIES) {
        let name = entry?.file_name();
        if name == LOCK_FILE {
            return Ok(Standing::Ours);
        }
        first.get_or_insert(name);
    }
    Ok(match first {
        None => Standing::Ours,
        Some(_) if earlier(dir) => Standing::Ours,
        Some(name) => Standing::Foreign(printable(&name.to_string_lossy())),
    })
}

/// Checks that each of `files` in `dir`, and the temporary `.partial` it is written through,
/// is absent or a regular file: `steps.csv: is a folder: name a file`.
pub fn check_files(dir: &Path, files: &[&str]) -> Result<(), String> {
    for name in files {
        for path in [dir.join(name), suffixed(&dir.join(name), ".partial")] {
            if let Some(fault) = super::file::fault(&path) {
                let shown = path.file_name().unwrap_or_default().to_string_lossy();
                return Err(format!("{shown} there {fault}"));
            }
        }
    }
    Ok(())
}

/// Checks that each of `sets` in `dir` (folders replaced whole, such as a checkpoint) is absent
/// or a real folder (not a link) holding nothing but `members`: what is replaced or removed
/// with it is only ever what the set itself wrote.
pub fn check_sets(dir: &Path, sets: &[&str], members: &[&str]) -> Result<(), String> {
    for set in sets {
        let path = dir.join(set);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{set} there cannot be read: {e}")),
        };
        if !meta.is_dir() {
            let what = match meta.file_type().is_symlink() {
                true => "a symbolic link",
                false => "not a folder",
            };
            return Err(format!(
                "{set} there is {what}, not a checkpoint this run wrote: move it away"
            ));
        }
        let entries = std::fs::read_dir(&path).map_err(|e| format!("{set} there: {e}"))?;
        for entry in entries.take(MAX_ENTRIES) {
            let name = entry.map_err(|e| format!("{set} there: {e}"))?.file_name();
            if !members.iter().any(|m| name == *m) {
                return Err(format!(
                    "{set}/{} there is not part of a checkpoint and would be deleted with it: \
                     move it away",
                    printable(&name.to_string_lossy())
                ));
            }
        }
    }
    Ok(())
}

/// A name as one safe folder name: letters, digits, `.`, `_` and `-` kept, anything else (`/`,
/// spaces, `=`, a newline, an escape) a `-`, at most 100 characters, and no name that is only
/// dots, so `--sweep data.path=../../x` or a config named `a\nb.toml` stays one plain folder.
pub fn safe_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '-',
        })
        .take(100)
        .collect();
    if safe.chars().all(|c| c == '.') {
        format!("run{safe}").replace('.', "-")
    } else {
        safe
    }
}
