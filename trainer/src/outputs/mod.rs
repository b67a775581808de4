//! Where a run writes, settled and checked before the first step. The rule: **a process writes
//! only files it owns, in a folder it owns**.
//!
//! - A folder is owned for the life of the process by an advisory lock ([`lock`]): a second
//!   run into the same folder is refused in one line naming the first one's pid (exit 2), or,
//!   when the folder was chosen by default (`runs/<config>`), takes the next numbered one.
//! - Only a new or empty folder, or one this program claimed before, is written in
//!   ([`folder::standing`]): `output_dir = "/"` or a folder of the user's own files is refused.
//! - Every name the run writes there is checked first: a file is absent or a regular file, a
//!   checkpoint folder holds nothing but a checkpoint's files ([`folder`]); an output path on the
//!   command line is absent or a regular file, never a link, FIFO or device ([`file`]).
//! - A run never silently replaces an earlier run's checkpoint, resumes into a folder inside
//!   the checkpoint it reads, or writes `--summary-json` over its own files or into a checkpoint.

pub mod file;
pub mod folder;
pub mod lock;

use std::path::{Path, PathBuf};

use crate::config::{out_of_range, ConfigError, Settings};
use crate::report::{printable, suffixed};
use crate::training::{checkpoint, checkpoint_set};
use folder::Standing;
use lock::{FolderLock, LockError, LOCK_FILE};

/// The files a training run writes in its output folder, each replaced whole.
pub const RUN_FILES: [&str; 4] = [
    "steps.csv",
    "loss_scale.svg",
    "memory_timeline.csv",
    "memory_timeline.svg",
];

/// The folders a training run replaces whole: the checkpoint, the next one being written, and
/// what a swap cut short leaves.
pub const RUN_SETS: [&str; 3] = ["checkpoint", "checkpoint.partial", "checkpoint.old"];

/// The files `trainer compare` writes in `--out` (its runs go to `runs/`).
pub const REPORT_FILES: [&str; 8] = [
    "report.md",
    "report.csv",
    "report.json",
    "memory.svg",
    "terms.svg",
    "steps.svg",
    "timeline.svg",
    "batch.svg",
];

/// Numbered folders tried after a default one is taken (`runs/amp-2` … `runs/amp-1000`).
const MAX_NUMBERED: usize = 1000;

/// Why a folder was not claimed.
enum Refusal {
    /// Another run's (locked, holding a checkpoint or someone else's files): a default folder
    /// moves on to the next number.
    Taken(String),
    /// Unusable as it is.
    Bad(String),
}

impl Refusal {
    fn error(self, key: &'static str, dir: &Path) -> ConfigError {
        let (Self::Taken(what) | Self::Bad(what)) = self;
        out_of_range(key, printable(&dir.display().to_string()), &what)
    }
}

/// Settles `settings.train.output_dir`, claims it and checks every output path:
/// - resuming without `train.output_dir` writes into the resumed run's folder (the parent of
///   `resume`);
/// - a run with the default folder (`runs/<config>`) that another run holds (its lock, its
///   checkpoint or files not this program's) takes the first free `runs/<config>-N`, and says
///   so;
/// - a folder given in the config is refused when it is in use, not this program's, holds an
///   earlier checkpoint (unless the run resumes that one or `overwrite` is set), or lies inside
///   the checkpoint being resumed.
///
/// The returned lock must be held until the run ends.
pub fn prepare(
    mut settings: Settings,
    resume: Option<&Path>,
    overwrite: bool,
    summary_json: Option<&Path>,
) -> Result<(Settings, FolderLock), ConfigError> {
    let t = &mut settings.train;
    let key = "train.output_dir";
    if let (Some(dir), false) = (resume, t.output_dir_given) {
        t.output_dir = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    }
    let lock = if resume.is_none() && !t.output_dir_given {
        let first = t.output_dir.clone();
        let mut note = None;
        let mut claimed = None;
        for n in 1..=MAX_NUMBERED {
            let dir = match n {
                1 => first.clone(),
                n => suffixed(&first, &format!("-{n}")),
            };
            match claim(&dir, None, overwrite) {
                Ok(lock) => {
                    claimed = Some((dir, lock));
                    break;
                }
                Err(Refusal::Taken(why)) => {
                    note.get_or_insert(why);
                }
                Err(bad) => return Err(bad.error(key, &dir)),
            }
        }
        let Some((dir, lock)) = claimed else {
            return Err(out_of_range(
                key,
                printable(&first.display().to_string()),
                &format!("it and its {MAX_NUMBERED} numbered neighbours are taken: name a folder"),
            ));
        };
        if let (Some(why), true) = (note, dir != first) {
            eprintln!(
                "note: {} {}; this run writes to {}",
                printable(&first.display().to_string()),
                short(&why),
                printable(&dir.display().to_string())
            );
        }
        t.output_dir = dir;
        lock
    } else {
        claim(&t.output_dir, resume, overwrite).map_err(|r| r.error(key, &t.output_dir))?
    };
    if let Some(path) = summary_json {
        check_summary(path, &t.output_dir, resume)?;
    }
    Ok((settings, lock))
}

/// A refusal's reason without its advice, for the note about a numbered folder.
fn short(why: &str) -> &str {
    match why {
        w if w.starts_with("holds the checkpoint") => "holds an earlier run",
        w => w.split(':').next().unwrap_or(w),
    }
}

/// Claims `dir` for a training run (see [`prepare`]).
fn claim(dir: &Path, resume: Option<&Path>, overwrite: bool) -> Result<FolderLock, Refusal> {
    let shown = |p: &Path| printable(&p.display().to_string());
    // Before anything is made: a folder inside the checkpoint would change what it resumes.
    if let Some(resumed) = resume.map(canonical) {
        if canonical(dir).starts_with(&resumed) {
            return Err(Refusal::Bad(format!(
                "lies inside the checkpoint it resumes (--resume {}): choose another folder",
                shown(&resumed)
            )));
        }
    }
    let has_checkpoint = |d: &Path| checkpoint::exists(&checkpoint::dir(d));
    let lock = claim_folder(dir, &has_checkpoint)?;
    folder::check_files(dir, &RUN_FILES).map_err(Refusal::Bad)?;
    let mut members = checkpoint::FILES.to_vec();
    members.push(checkpoint_set::MANIFEST);
    folder::check_sets(dir, &RUN_SETS, &members).map_err(Refusal::Bad)?;
    match resume {
        None if has_checkpoint(dir) && !overwrite => Err(Refusal::Taken(format!(
            "holds the checkpoint of an earlier run: continue it with --resume {}, replace it \
             with --overwrite, or choose another folder",
            shown(&checkpoint::dir(dir))
        ))),
        Some(resumed) => {
            let resumed = canonical(resumed);
            let own = checkpoint_set::locate(&checkpoint::dir(dir)).ok();
            if own.is_some_and(|own| canonical(&own) != resumed) && !overwrite {
                return Err(Refusal::Bad(format!(
                    "holds the checkpoint of another run than the one resumed (--resume {}): \
                     choose another folder, or replace it with --overwrite",
                    shown(&resumed)
                )));
            }
            Ok(lock)
        }
        None => Ok(lock),
    }
}

/// Creates `dir` if needed, checks it is this program's ([`folder::standing`], `earlier`
/// recognising an unmarked folder of an earlier version), locks it and proves it takes files.
fn claim_folder(dir: &Path, earlier: &dyn Fn(&Path) -> bool) -> Result<FolderLock, Refusal> {
    let cannot = |e: std::io::Error| Refusal::Bad(format!("cannot write there: {e}"));
    std::fs::create_dir_all(dir).map_err(cannot)?;
    if let Standing::Foreign(example) = folder::standing(dir, earlier).map_err(cannot)? {
        return Err(Refusal::Taken(format!(
            "holds files this program did not write ({example}, …): name a new or empty folder, \
             or one an earlier run wrote"
        )));
    }
    let lock = FolderLock::acquire(dir).map_err(|e| match e {
        LockError::Held(_) => Refusal::Taken(e.describe()),
        LockError::Io(_) => Refusal::Bad(e.describe()),
    })?;
    file::writable_folder(dir).map_err(cannot)?;
    Ok(lock)
}

/// Claims `--out` of `trainer compare` (`given`: named on the command line, else the default,
/// which moves on to `-2`, `-3`, … when an earlier compare's report is there). A named folder
/// holding an earlier report is refused unless `overwrite`.
pub fn claim_report(
    out: &Path,
    given: bool,
    overwrite: bool,
) -> Result<(PathBuf, FolderLock), ConfigError> {
    let has_report = |d: &Path| d.join("report.json").is_file();
    let one = |dir: &Path| -> Result<FolderLock, Refusal> {
        let lock = claim_folder(dir, &has_report)?;
        folder::check_files(dir, &REPORT_FILES).map_err(Refusal::Bad)?;
        let runs = dir.join("runs");
        if std::fs::symlink_metadata(&runs).is_ok_and(|m| !m.is_dir()) {
            return Err(Refusal::Bad(
                "runs there is not a folder (compare keeps each run's outputs in it): move it away"
                    .into(),
            ));
        }
        if has_report(dir) && !overwrite {
            return Err(Refusal::Taken(
                "holds the report of an earlier compare: replace it with --overwrite, or choose \
                 another folder"
                    .into(),
            ));
        }
        Ok(lock)
    };
    if given {
        let lock = one(out).map_err(|r| r.error("--out", out))?;
        return Ok((out.to_path_buf(), lock));
    }
    let mut note: Option<String> = None;
    for n in 1..=MAX_NUMBERED {
        let dir = match n {
            1 => out.to_path_buf(),
            n => suffixed(out, &format!("-{n}")),
        };
        match one(&dir) {
            Ok(lock) => {
                if let (Some(why), true) = (note.as_deref(), n > 1) {
                    eprintln!(
                        "note: {} {}; this compare writes to {}",
                        printable(&out.display().to_string()),
                        short(why),
                        printable(&dir.display().to_string())
                    );
                }
                return Ok((dir, lock));
            }
            Err(Refusal::Taken(why)) => {
                note.get_or_insert(why);
            }
            Err(bad) => return Err(bad.error("--out", &dir)),
        }
    }
    Err(out_of_range(
        "--out",
        printable(&out.display().to_string()),
        &format!("it and its {MAX_NUMBERED} numbered neighbours are taken: name a folder"),
    ))
}

/// Checks `--summary-json`: a file that can be written ([`file::check`]), and not one of the
/// run's own files or a path inside a checkpoint (its own, or the one it resumes).
fn check_summary(path: &Path, dir: &Path, resume: Option<&Path>) -> Result<(), ConfigError> {
    let flag = "--summary-json";
    let refuse = |what: String| out_of_range(flag, printable(&path.display().to_string()), &what);
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let full =
        canonical(parent.unwrap_or(Path::new("."))).join(path.file_name().unwrap_or_default());
    // (A path ending in `..` has no file name: file::check below refuses it as a folder.)
    let dir = canonical(dir);
    let name = full
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let owned = RUN_FILES
        .iter()
        .flat_map(|f| [f.to_string(), format!("{f}.partial")])
        .chain([LOCK_FILE.to_string()]);
    if full.parent() == Some(dir.as_path()) && owned.into_iter().any(|f| f == name) {
        return Err(refuse(format!(
            "is one of the run's own files ({}): name another file",
            printable(&name)
        )));
    }
    let sets = RUN_SETS.iter().map(|s| dir.join(s));
    if let Some(set) = sets
        .chain(resume.map(canonical))
        .find(|set| full.starts_with(set))
    {
        return Err(refuse(format!(
            "lies inside a checkpoint ({}): name a file outside it",
            printable(&set.display().to_string())
        )));
    }
    file::check(flag, path)
}

/// Claims `find-batch-size`'s scratch folder (`<output_dir>/find-batch-size`) for the search:
/// one search at a time per config.
pub fn claim_scratch(dir: &Path) -> Result<FolderLock, ConfigError> {
    claim_folder(dir, &|_| false).map_err(|r| r.error("train.output_dir", dir))
}

/// `path` with links and `..` resolved: its longest existing ancestor canonicalized, the rest
/// (not made yet) appended as given, so a folder not yet made compares like the one it will be.
fn canonical(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    let mut head = absolute.as_path();
    loop {
        if let Ok(real) = std::fs::canonicalize(head) {
            return rest.iter().rev().fold(real, |p, part| p.join(part));
        }
        match (head.parent(), head.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                head = parent;
            }
            _ => return absolute,
        }
    }
}
