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
        out_of_range(key, shown(dir), &what)
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
    if let Some(path) = summary_json {
        // Before any folder is made: a bad path leaves nothing behind.
        file::check("--summary-json", path)?;
    }
    let lock = if resume.is_none() && !t.output_dir_given {
        let (dir, lock) = claim_numbered(&t.output_dir, key, "this run", &|d| {
            claim(d, None, overwrite)
        })?;
        t.output_dir = dir;
        lock
    } else {
        claim(&t.output_dir, resume, overwrite).map_err(|r| r.error(key, &t.output_dir))?
    };
    if let Some(path) = summary_json {
        if let Err(e) = check_summary(path, &t.output_dir, resume) {
            drop(lock);
            forget_if_unused(&t.output_dir);
            return Err(e);
        }
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
    // Before anything is made: a folder inside the checkpoint would change what it resumes.
    if let Some(resumed) = resume.map(canonical) {
        if canonical(dir).starts_with(&resumed) {
            return Err(Refusal::Bad(format!(
                "lies inside the checkpoint it resumes (--resume {}): choose another folder",
                shown(&resumed)
            )));
        }
    }
    claim_folder(dir, &earlier_run, &|d| {
        run_folder_fits(d, resume, overwrite)
    })
}

/// `first`, or the first of `first-2` … `first-1000` that `claim` takes, for a folder chosen
/// by default: a folder another run holds ([`Refusal::Taken`]) moves on to the next number,
/// and the note says why (`who` writes there).
fn claim_numbered(
    first: &Path,
    key: &'static str,
    who: &str,
    claim: &dyn Fn(&Path) -> Result<FolderLock, Refusal>,
) -> Result<(PathBuf, FolderLock), ConfigError> {
    let mut note: Option<String> = None;
    for n in 1..=MAX_NUMBERED {
        let dir = match n {
            1 => first.to_path_buf(),
            n => suffixed(first, &format!("-{n}")),
        };
        match claim(&dir) {
            Ok(lock) => {
                if let (Some(why), true) = (note.as_deref(), n > 1) {
                    eprintln!(
                        "note: {} {}; {who} writes to {}",
                        shown(first),
                        short(why),
                        shown(&dir)
                    );
                }
                return Ok((dir, lock));
            }
            Err(Refusal::Taken(why)) => {
                note.get_or_insert(why);
            }
            Err(bad) => return Err(bad.error(key, &dir)),
        }
    }
    Err(out_of_range(
        key,
        shown(first),
        &format!("it and its {MAX_NUMBERED} numbered neighbours are taken: name a folder"),
    ))
}

/// What a claimed run folder must be: its own names what the run would write, and no
/// checkpoint but the one it continues (unless `overwrite`).
fn run_folder_fits(dir: &Path, resume: Option<&Path>, overwrite: bool) -> Result<(), Refusal> {
    folder::check_files(dir, &RUN_FILES).map_err(Refusal::Bad)?;
    let mut members = checkpoint::FILES.to_vec();
    members.push(checkpoint_set::MANIFEST);
    folder::check_sets(dir, &RUN_SETS, &members).map_err(Refusal::Bad)?;
    let own = checkpoint::dir(dir);
    // `exists` counts a damaged set too: it is a set, never silently replaced.
    if !checkpoint::exists(&own) || overwrite {
        return Ok(());
    }
    let Some(resumed) = resume else {
        return Err(Refusal::Taken(format!(
            "holds the checkpoint of an earlier run: continue it with --resume {}, replace it \
             with --overwrite, or choose another folder",
            shown(&own)
        )));
    };
    // Both as the loader finds them (`checkpoint.old` after a swap cut short).
    let set = |p: &Path| checkpoint_set::locate(p).ok().map(|s| canonical(&s));
    match (set(&own), set(resumed)) {
        (Some(own), Some(resumed)) if own == resumed => Ok(()),
        _ => Err(Refusal::Bad(format!(
            "holds the checkpoint of another run than the one resumed (--resume {}): choose \
             another folder, or replace it with --overwrite",
            shown(&canonical(resumed))
        ))),
    }
}

/// Creates `dir` if needed and checks it is this program's ([`folder::standing`], `earlier`
/// recognising an unmarked folder of an earlier version).
fn ours(dir: &Path, earlier: &dyn Fn(&Path) -> bool) -> Result<(), Refusal> {
    std::fs::create_dir_all(dir).map_err(cannot)?;
    match folder::standing(dir, earlier).map_err(cannot)? {
        Standing::Ours => Ok(()),
        Standing::Foreign(example) => Err(Refusal::Taken(format!(
            "holds files this program did not write ({example}, …): name a new or empty folder, \
             or one an earlier run wrote"
        ))),
    }
}

/// [`ours`], then locks `dir`, proves it takes files and checks it `fits` what the claimant
/// will write there; a refusal after the lock gives the folder up ([`forget_if_unused`]).
fn claim_folder(
    dir: &Path,
    earlier: &dyn Fn(&Path) -> bool,
    fits: &dyn Fn(&Path) -> Result<(), Refusal>,
) -> Result<FolderLock, Refusal> {
    ours(dir, earlier)?;
    let lock = FolderLock::acquire(dir).map_err(|e| match e {
        LockError::Held(_) => Refusal::Taken(e.to_string()),
        LockError::Io(_) => Refusal::Bad(e.to_string()),
    })?;
    if let Err(refusal) = file::writable_folder(dir)
        .map_err(cannot)
        .and_then(|()| fits(dir))
    {
        drop(lock);
        forget_if_unused(dir);
        return Err(refusal);
    }
    Ok(lock)
}

/// An I/O error as the refusal `cannot write there: …`.
fn cannot(e: std::io::Error) -> Refusal {
    Refusal::Bad(format!("cannot write there: {e}"))
}

/// A path as it is shown in a message (control characters escaped).
fn shown(path: &Path) -> String {
    printable(&path.display().to_string())
}

/// Whether an unmarked folder is a run folder an earlier version wrote: it holds a readable
/// checkpoint (a linked or FIFO manifest does not make it so), or only what that version's
/// `find-batch-size` left (its scratch folder).
fn earlier_run(dir: &Path) -> bool {
    checkpoint_set::locate(&checkpoint::dir(dir)).is_ok()
        || std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .take(2)
                .all(|e| e.is_ok_and(|e| e.file_name() == FIND_BATCH_SIZE))
        })
}

/// `find-batch-size`'s scratch folder inside a run folder.
pub const FIND_BATCH_SIZE: &str = "find-batch-size";

/// Claims `--out` of `trainer compare` (`given`: named on the command line, else the default,
/// which moves on to `-2`, `-3`, … when an earlier compare's report is there). A named folder
/// holding an earlier report is refused unless `overwrite`.
pub fn claim_report(
    out: &Path,
    given: bool,
    overwrite: bool,
) -> Result<(PathBuf, FolderLock), ConfigError> {
    let has_report = |d: &Path| {
        std::fs::symlink_metadata(d.join("report.json")).is_ok_and(|m| m.file_type().is_file())
    };
    let claim = |dir: &Path| {
        claim_folder(dir, &has_report, &|d| {
            report_folder_fits(d, &has_report, overwrite)
        })
    };
    if given {
        let lock = claim(out).map_err(|r| r.error("--out", out))?;
        return Ok((out.to_path_buf(), lock));
    }
    claim_numbered(out, "--out", "this compare", &claim)
}

/// What a claimed `--out` must be: its report files what compare writes, `runs` a folder, and
/// no earlier report unless `overwrite`.
fn report_folder_fits(
    dir: &Path,
    has_report: &dyn Fn(&Path) -> bool,
    overwrite: bool,
) -> Result<(), Refusal> {
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
    Ok(())
}

/// Checks `--summary-json`: a file that can be written ([`file::check`]), and not one of the
/// run's own files or a path inside a checkpoint (its own, or the one it resumes).
fn check_summary(path: &Path, dir: &Path, resume: Option<&Path>) -> Result<(), ConfigError> {
    let flag = "--summary-json";
    let refuse = |what: String| out_of_range(flag, shown(path), &what);
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let full =
        canonical(parent.unwrap_or(Path::new("."))).join(path.file_name().unwrap_or_default());
    // (A path ending in `..` has no file name: file::check refused it as a folder.)
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
            shown(&set)
        )));
    }
    Ok(())
}

/// Claims `find-batch-size`'s scratch folder (`<output_dir>/find-batch-size`) for the search:
/// one search at a time per config.
pub fn claim_scratch(output_dir: &Path, name: &str) -> Result<FolderLock, ConfigError> {
    let key = "train.output_dir";
    // The run folder it lies in must be this program's too (never `/` or a home folder); a
    // new one is marked as such, so a later run takes it as its own. It is not locked: a run
    // may train there while a search measures beside it.
    ours(output_dir, &earlier_run)
        .and_then(|()| file::create_marker(&output_dir.join(LOCK_FILE)).map_err(cannot))
        .map_err(|r| r.error(key, output_dir))?;
    let dir = output_dir.join(name);
    // An earlier version left only trial folders (`batch-N`) in its scratch folder.
    let earlier = |d: &Path| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries
                .take(10_000)
                .all(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("batch-")))
        })
    };
    claim_folder(&dir, &earlier, &|_| Ok(())).map_err(|r| r.error(key, &dir))
}

/// `path` made absolute with links and `..` resolved, one component at a time: where a
/// prefix exists it is canonicalized (links followed as the kernel would), and the part not
/// made yet is appended with its `..` applied, so a folder not yet made compares like the one
/// it will be (`nope/../runs/a/checkpoint/out` is inside `runs/a/checkpoint`).
pub fn canonical(path: &Path) -> PathBuf {
    use std::path::Component;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut real = PathBuf::new();
    for part in absolute.components() {
        match part {
            Component::ParentDir => {
                real.pop();
            }
            Component::CurDir => {}
            other => {
                real.push(other);
                if let Ok(resolved) = std::fs::canonicalize(&real) {
                    real = resolved;
                }
            }
        }
    }
    real
}

/// Gives up a folder this process claimed but wrote nothing in (a refusal or an error after
/// the claim): when it holds only the lock file, both are removed. A process that opened the
/// lock file meanwhile notices it is gone ([`lock::FolderLock::acquire`]).
pub fn forget_if_unused(dir: &Path) {
    let only_lock = std::fs::read_dir(dir).is_ok_and(|entries| {
        let names: Vec<_> = entries
            .take(2)
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        names.len() == 1 && names[0] == LOCK_FILE
    });
    if only_lock {
        let _ = std::fs::remove_file(dir.join(LOCK_FILE));
        let _ = std::fs::remove_dir(dir);
    }
}
