//! Where a training run writes, settled and checked before the first step: a run never
//! silently replaces an earlier run's checkpoint, and an unwritable folder or summary path is
//! an error (exit 2) before any work is done, not after it is lost.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use crate::config::{out_of_range, ConfigError, Settings};
use crate::report::suffixed;
use crate::training::checkpoint;

/// Settles `settings.train.output_dir` and checks every output path:
/// - resuming without `train.output_dir` writes into the resumed run's folder (the parent of
///   `resume`);
/// - a run with the default folder (`runs/<config>`) that holds an earlier checkpoint takes
///   the first free `runs/<config>-N` instead, and says so;
/// - a folder given in the config that holds an earlier checkpoint is refused unless the run
///   resumes it or `overwrite` is set.
pub fn prepare(
    mut settings: Settings,
    resume: Option<&Path>,
    overwrite: bool,
    summary_json: Option<&Path>,
) -> Result<Settings, ConfigError> {
    let t = &mut settings.train;
    if let (Some(dir), false) = (resume, t.output_dir_given) {
        t.output_dir = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    } else if resume.is_none() && !overwrite && checkpoint::exists(&checkpoint::dir(&t.output_dir))
    {
        if t.output_dir_given {
            return Err(out_of_range(
                "train.output_dir",
                t.output_dir.display(),
                &format!(
                    "holds the checkpoint of an earlier run: continue it with --resume {}, \
                     replace it with --overwrite, or choose another folder",
                    checkpoint::dir(&t.output_dir).display()
                ),
            ));
        }
        let taken = t.output_dir.clone();
        t.output_dir = (2..)
            .map(|n| suffixed(&taken, &format!("-{n}")))
            .find(|d| !checkpoint::exists(&checkpoint::dir(d)))
            .unwrap_or(taken.clone());
        eprintln!(
            "note: {} holds an earlier run; this run writes to {}",
            taken.display(),
            t.output_dir.display()
        );
    }
    writable_dir(&t.output_dir)?;
    if let Some(path) = summary_json {
        writable_file(path)?;
    }
    Ok(settings)
}

/// Creates `dir` and proves a file can be written in it.
fn writable_dir(dir: &Path) -> Result<(), ConfigError> {
    let fail = |e: std::io::Error| {
        out_of_range(
            "train.output_dir",
            dir.display(),
            &format!("cannot write there: {e}"),
        )
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let probe = dir.join(".oomlab-write-check");
    std::fs::write(&probe, b"").map_err(fail)?;
    std::fs::remove_file(&probe).map_err(fail)
}

/// Proves `path` can be written, leaving an existing file as it was and no new one behind.
fn writable_file(path: &Path) -> Result<(), ConfigError> {
    let fail = |what: String| out_of_range("--summary-json", path.display(), &what);
    if path.is_dir() {
        return Err(fail("is a folder: name a file".into()));
    }
    let existed = path.exists();
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| fail(format!("cannot write there: {e}")))?;
    if !existed {
        std::fs::remove_file(path).map_err(|e| fail(format!("cannot write there: {e}")))?;
    }
    Ok(())
}
