//! Training runs in child processes: `compare` and `find-batch-size` run each config or trial
//! in a fresh `trainer` process, so memory peaks do not mix and a CUDA out-of-memory error
//! takes down only that process, releasing its memory.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::report::summary::Summary;

/// The exit code of a run that ran out of memory (see [`crate::memory::diagnosis`]).
pub const EXIT_OUT_OF_MEMORY: i32 = 3;

/// A child run that did not finish.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its error, on one line.
    pub message: String,
}

impl Failure {
    /// Whether it ran out of memory (exit code 3).
    pub fn out_of_memory(&self) -> bool {
        self.code == Some(EXIT_OUT_OF_MEMORY)
    }
}

/// Runs `trainer ARGS --summary-json <dir>/summary.json --set train.output_dir=<dir>` and
/// returns its summary. An error is only for a process that could not be started at all.
pub fn train(args: &[String], dir: &Path) -> anyhow::Result<Result<Summary, Failure>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join("summary.json");
    let _ = std::fs::remove_file(&json);
    let exe = std::env::current_exe().context("finding the trainer executable")?;
    let out = Command::new(exe)
        .args(args)
        .arg("--set")
        .arg(format!("train.output_dir={}", toml_string(dir)))
        .arg("--summary-json")
        .arg(&json)
        .output()
        .context("starting a trainer process")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Ok(Err(Failure {
            code: out.status.code(),
            message: error_line(&stderr),
        }));
    }
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    Ok(Ok(
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?
    ))
}

/// A path as a TOML string value, so `--set` keeps it as written.
fn toml_string(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

/// The line of a failed run's stderr that says why: its `error:`/`config error:`/`out of
/// memory` line, else its last line.
fn error_line(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| {
            l.starts_with("error:")
                || l.starts_with("config error:")
                || l.starts_with("out of memory")
        })
        .or(lines.last())
        .map_or_else(|| "failed without a message".into(), |l| l.to_string())
}

/// `base/name`, or `base/name-2`, … when a sibling already took the name.
pub fn unique_dir(base: &Path, name: &str, taken: &mut Vec<PathBuf>) -> PathBuf {
    let mut dir = base.join(name);
    let mut n = 2;
    while taken.contains(&dir) {
        dir = base.join(format!("{name}-{n}"));
        n += 1;
    }
    taken.push(dir.clone());
    dir
}
