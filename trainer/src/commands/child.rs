//! Training runs in child processes: `compare` and `find-batch-size` run each config or trial
//! in a fresh `trainer` process, so memory peaks do not mix and a CUDA out-of-memory error
//! takes down only that process, releasing its memory. A child reports success as its
//! `--summary-json` and failure as its `--failure-json`: structured, never scraped from stderr.
//!
//! A child runs in its own process group, so a terminal's Ctrl-C reaches only the parent,
//! which forwards it (and SIGTERM, SIGHUP) exactly once through its [`Interrupt`].

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::config::BackendKind;
use crate::exit::Exit;
use crate::report::summary::Summary;
use crate::training::interrupt::{Interrupt, PARENT_PID_ENV};

/// A child run that did not finish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// How it ended.
    pub kind: Exit,
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its error, on one line.
    pub message: String,
}

impl Failure {
    /// The failure `error` means, for `--failure-json`: its exit and the first line of what
    /// the binary printed for it.
    pub fn of(error: &anyhow::Error) -> Self {
        let kind = Exit::of(error);
        let text = crate::exit::describe(error);
        Self {
            kind,
            code: Some(kind.code().into()),
            message: text.lines().next().unwrap_or_default().to_string(),
        }
    }

    /// Writes it as JSON to `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self)? + "\n";
        crate::report::write_atomic(path, json.as_bytes())
    }

    /// Whether it ran out of memory.
    pub fn out_of_memory(&self) -> bool {
        self.kind == Exit::OutOfMemory
    }
}

/// The command line of a child training run: a config and its `--set` overrides, in
/// precedence order.
#[derive(Debug, Clone, Default)]
pub struct Args {
    config: Option<PathBuf>,
    sets: Vec<String>,
    /// `--backend`, `--max-steps`: applied after the `--set`s, which the child validates
    /// without them first.
    flags: Vec<String>,
    trial: bool,
    overwrite: bool,
}

impl Args {
    /// A run of `config` (the embedded default when `None`).
    pub fn new(config: Option<&Path>) -> Self {
        Self {
            config: config.map(Path::to_path_buf),
            ..Self::default()
        }
    }

    /// Adds one `--set KEY=VALUE` (later ones win).
    pub fn set(mut self, set: impl Into<String>) -> Self {
        self.sets.push(set.into());
        self
    }

    /// Adds several `--set`s, in order.
    pub fn sets<S: Into<String>>(mut self, sets: impl IntoIterator<Item = S>) -> Self {
        self.sets.extend(sets.into_iter().map(Into::into));
        self
    }

    /// `--backend KIND` for the child.
    pub fn backend(mut self, kind: BackendKind) -> Self {
        self.flags.extend(["--backend".into(), kind.name().into()]);
        self
    }

    /// `--max-steps N` for the child.
    pub fn max_steps(mut self, n: usize) -> Self {
        self.flags.extend(["--max-steps".into(), n.to_string()]);
        self
    }

    /// The flags as the overrides they stand for, after [`overrides`](Self::overrides).
    pub fn flag_overrides(&self) -> Vec<String> {
        self.flags
            .chunks(2)
            .filter_map(|f| match f {
                [flag, v] if flag == "--backend" => Some(format!("backend.kind={v}")),
                [flag, v] if flag == "--max-steps" => Some(format!("train.max_steps={v}")),
                _ => None,
            })
            .collect()
    }

    /// Replaces what an earlier child left in its folder (`--overwrite`): the parent owns it.
    pub fn overwrite(mut self) -> Self {
        self.overwrite = true;
        self
    }

    /// A measuring trial (`--trial`): no budget check, evaluation or checkpoint.
    pub fn trial(mut self) -> Self {
        self.trial = true;
        self
    }

    /// The overrides given so far.
    pub fn overrides(&self) -> &[String] {
        &self.sets
    }

    /// The argument list, with the outputs of one run in `dir`.
    fn to_vec(&self, dir: &Path) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(config) = &self.config {
            args.extend(["--config".into(), config.display().to_string()]);
        }
        let output = format!("train.output_dir={}", toml_string(dir));
        for set in self.sets.iter().chain([&output]) {
            args.extend(["--set".into(), set.clone()]);
        }
        args.extend(self.flags.iter().cloned());
        for (flag, name) in [("--summary-json", SUMMARY), ("--failure-json", FAILURE)] {
            args.extend([flag.into(), dir.join(name).display().to_string()]);
        }
        if self.trial {
            args.push("--trial".into());
        }
        if self.overwrite {
            args.push("--overwrite".into());
        }
        args
    }
}

const SUMMARY: &str = "summary.json";
const FAILURE: &str = "failure.json";

/// Runs `trainer ARGS` with its outputs in `dir` and returns its summary, or its failure;
/// `interrupt` forwards signals to it while it runs. An error is only for a process that
/// could not be started, or a summary that cannot be read.
pub fn train(
    args: &Args,
    dir: &Path,
    interrupt: &Interrupt,
) -> anyhow::Result<Result<Summary, Failure>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in [SUMMARY, FAILURE] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    let exe = std::env::current_exe().context("finding the trainer executable")?;
    let mut child = Command::new(exe)
        .args(args.to_vec(dir))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env(PARENT_PID_ENV, std::process::id().to_string())
        // Its own process group: the terminal's signals reach the parent only.
        .process_group(0)
        .spawn()
        .context("starting a trainer process")?;
    // Read on a thread while waiting, so a child that writes much never blocks on the pipe.
    let stderr = child.stderr.take().map(|mut pipe| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            text
        })
    });
    let status = interrupt
        .wait(&mut child)
        .context("waiting for a trainer process")?;
    // The pipe closed when the child exited (it starts no processes of its own).
    let stderr = stderr
        .and_then(|reader| reader.join().ok())
        .unwrap_or_default();
    if !status.success() {
        return Ok(Err(read_failure(
            &dir.join(FAILURE),
            status.code(),
            &stderr,
        )));
    }
    let json = dir.join(SUMMARY);
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    Ok(Ok(
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?
    ))
}

/// The child's own failure report; a child that wrote none (killed by a signal, or a panic)
/// is a runtime failure, described by its exit status and the last line it printed.
fn read_failure(path: &Path, code: Option<i32>, stderr: &[u8]) -> Failure {
    if let Some(failure) = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
    {
        return failure;
    }
    let stderr = String::from_utf8_lossy(stderr);
    let last = stderr.lines().map(str::trim).rfind(|l| !l.is_empty());
    let status = code.map_or_else(|| "killed by a signal".into(), |c| format!("exit code {c}"));
    Failure {
        kind: Exit::Runtime,
        code,
        message: match last {
            Some(line) => format!("failed ({status}) without a report: {line}"),
            None => format!("failed ({status}) without a report"),
        },
    }
}

/// A path as a TOML string value, so `--set` keeps it as written.
fn toml_string(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
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
