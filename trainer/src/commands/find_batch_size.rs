//! `trainer find-batch-size`: the seed article's "halve the batch until the error goes away",
//! done properly. Trial steps at growing, then bisected, micro-batch sizes, each in a fresh
//! child process (a CUDA out-of-memory error is caught there and its memory released). On the
//! CPU there is no device limit, so the budget decides: a trial fits when its measured peak is
//! within the budget less a safety margin. A signal is forwarded to the running trial; the
//! search then stops with the trials so far and the largest size that fitted.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::child;
use super::{dry_run_ok, settings};
use crate::backend::{self, Selected};
use crate::cli::{ConfigArgs, FindArgs};
use crate::config::{self, Purpose};
use crate::memory::human;
use crate::outputs;
use crate::training::interrupt::{Interrupt, Stopped};

/// One trial step.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub batch_size: usize,
    /// Measured peak bytes, when the trial finished.
    pub peak_bytes: Option<u64>,
    pub fits: bool,
    /// Why it does not fit: over the limit, or the run's own error (e.g. out of memory).
    pub reason: Option<String>,
}

/// The search and its answer.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// Bytes a trial may peak at: budget × (1 − margin); absent where only the device decides.
    pub limit_bytes: Option<u64>,
    pub trials: Vec<Trial>,
    /// The largest micro-batch that fits.
    pub batch_size: usize,
    /// The config's samples per optimizer step, kept by the suggestion below.
    pub effective_batch: usize,
    /// Suggested `train.batch_size` (≤ the largest that fits, dividing the effective batch).
    pub suggested_batch_size: usize,
    /// Suggested `train.accum_steps`.
    pub suggested_accum_steps: usize,
}

/// What to search.
#[derive(Debug, Clone)]
pub struct Search {
    /// The config and `--set`s every trial shares (the run's own flags).
    pub args: child::Args,
    /// Peak bytes a trial may reach; `None`: a trial fits when it does not run out of memory.
    pub limit: Option<u64>,
    /// The config's effective batch (batch_size × accum_steps).
    pub effective_batch: usize,
    /// Largest micro-batch tried.
    pub max_batch: usize,
    /// Where trial runs write (its owner removes it afterwards).
    pub scratch: PathBuf,
}

/// The largest micro-batch among `trials` that fitted, with its peak.
fn largest_fit(trials: &[Trial]) -> Option<&Trial> {
    trials
        .iter()
        .filter(|t| t.fits)
        .max_by_key(|t| t.batch_size)
}

/// What a search stopped by `signal` after `trials` leaves: the trials are on stderr already,
/// the answer so far is the error's line.
fn stopped(signal: i32, trials: &[Trial]) -> anyhow::Error {
    let so_far = match largest_fit(trials) {
        Some(t) => format!(
            "the largest micro-batch that fitted so far is {}{}",
            t.batch_size,
            t.peak_bytes
                .map_or_else(String::new, |p| format!(" (measured peak {})", human(p)))
        ),
        None => "none fitted yet".into(),
    };
    let what = format!(
        "find-batch-size stopped after {} finished trials; {so_far}; the search did not finish",
        trials.len()
    );
    Stopped { signal, what }.into()
}

/// Runs the trials and finds the largest micro-batch that fits; after a signal
/// (`interrupt`, forwarded to the running trial) it stops with the trials so far.
pub fn find(search: &Search, interrupt: &Interrupt) -> anyhow::Result<Found> {
    let bar = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} {elapsed} trial {pos}: {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    // For a second signal's line, which cannot wait for the search.
    let (finished, largest) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, fit) = (Arc::clone(&finished), Arc::clone(&largest));
    interrupt.on_second(move || {
        let fit = match fit.load(Ordering::SeqCst) {
            0 => "none fitted yet".into(),
            b => format!("the largest micro-batch that fitted: {b}"),
        };
        format!("{} trials had finished; {fit}", n.load(Ordering::SeqCst))
    });
    let mut trials: Vec<Trial> = Vec::new();
    let mut trial = |b: usize| -> anyhow::Result<bool> {
        if let Some(signal) = interrupt.requested() {
            bar.finish_and_clear();
            return Err(stopped(signal, &trials));
        }
        bar.set_message(format!("micro-batch {b}"));
        bar.inc(1);
        let args = search
            .args
            .clone()
            .set(format!("train.batch_size={b}"))
            .set("train.accum_steps=1")
            .max_steps(1)
            .trial();
        let dir = search.scratch.join(format!("batch-{b}"));
        let result = child::train(&args, &dir, interrupt)?;
        if let (Some(signal), Err(_)) = (interrupt.requested(), &result) {
            // Stopped by the signal: not a measurement.
            bar.finish_and_clear();
            return Err(stopped(signal, &trials));
        }
        let t = match result {
            Ok(s) => {
                let peak = s.memory.peak_bytes;
                let over = matches!((peak, search.limit), (Some(p), Some(l)) if p > l);
                Trial {
                    batch_size: b,
                    peak_bytes: peak,
                    fits: !over,
                    reason: over.then(|| "over the limit".into()),
                }
            }
            Err(f) if f.out_of_memory() => Trial {
                batch_size: b,
                peak_bytes: None,
                fits: false,
                reason: Some(f.message),
            },
            Err(f) => anyhow::bail!("trial at micro-batch {b} failed: {}", f.message),
        };
        let fits = t.fits;
        let line = format!(
            "  micro-batch {:>5}: {:>10}  {}",
            b,
            t.peak_bytes.map_or("—".into(), human),
            if fits { "fits" } else { "does not fit" }
        );
        // Shown with or without a terminal: the trials are the evidence for the answer.
        bar.suspend(|| eprintln!("{line}"));
        trials.push(t);
        finished.store(trials.len(), Ordering::SeqCst);
        if let Some(t) = largest_fit(&trials) {
            largest.store(t.batch_size, Ordering::SeqCst);
        }
        Ok(fits)
    };
    // Grow by doubling from 1 until a size does not fit, then bisect between the two.
    let (mut good, mut bad) = (0usize, None);
    let mut b = 1usize;
    while b <= search.max_batch {
        if trial(b)? {
            good = b;
            b *= 2;
        } else {
            bad = Some(b);
            break;
        }
    }
    if good == 0 {
        bar.finish_and_clear();
        // Out of memory at the smallest batch: the same exit as any out-of-memory run.
        return Err(crate::memory::host::NothingFits {
            limit: search.limit,
        }
        .into());
    }
    if bad.is_none() && good < search.max_batch {
        // Doubling stepped over the largest size allowed: try that size itself.
        match trial(search.max_batch)? {
            true => good = search.max_batch,
            false => bad = Some(search.max_batch),
        }
    }
    if let Some(mut bad) = bad {
        // To within 1/16 of the answer: finer steps cost trials and gain little.
        while bad - good > (good / 16).max(1) {
            let mid = good + (bad - good) / 2;
            if trial(mid)? {
                good = mid;
            } else {
                bad = mid;
            }
        }
    }
    bar.finish_and_clear();
    let e = search.effective_batch;
    // The fewest micro-batches that divide the effective batch exactly and each fit.
    let k = (1..=e)
        .find(|k| e.is_multiple_of(*k) && e / k <= good)
        .unwrap_or(e);
    Ok(Found {
        limit_bytes: search.limit,
        trials,
        batch_size: good,
        effective_batch: e,
        suggested_batch_size: e / k,
        suggested_accum_steps: k,
    })
}

impl Found {
    /// The answer for the terminal.
    pub fn describe(&self, config: &str) -> String {
        let mut out = format!("largest micro-batch that fits: {}", self.batch_size);
        if let Some(p) = self
            .trials
            .iter()
            .find(|t| t.batch_size == self.batch_size)
            .and_then(|t| t.peak_bytes)
        {
            out.push_str(&format!(" (measured peak {})", human(p)));
        }
        if let Some(l) = self.limit_bytes {
            out.push_str(&format!(", limit {}", human(l)));
        }
        out.push_str(&format!(
            "\nto keep the effective batch of {}: batch_size = {}, accum_steps = {}\n  trainer --config {config} --set train.batch_size={} --set train.accum_steps={}\n",
            self.effective_batch,
            self.suggested_batch_size,
            self.suggested_accum_steps,
            self.suggested_batch_size,
            self.suggested_accum_steps
        ));
        out
    }
}

/// `trainer find-batch-size`: checks the flags, runs the search and prints the answer.
pub fn run(args: FindArgs, dry: bool, interrupt: &Interrupt) -> anyhow::Result<()> {
    let FindArgs {
        config: ConfigArgs {
            config,
            overrides: sets,
        },
        ..
    } = &args;
    let flags: Vec<String> = args
        .backend
        .iter()
        .map(|b| format!("backend.kind={}", b.name()))
        .collect();
    let settings = settings(config.as_deref(), sets, &flags, Purpose::Train)?;
    let budget = args.budget.or(settings.memory.budget);
    if let Some(path) = &args.json {
        crate::outputs::file::check("--json", path)?;
    }
    if dry {
        return dry_run_ok(&format!("{} loads", settings.path.display()));
    }
    let selected = backend::select(settings.backend, settings.cuda_index)?;
    let unknown_limit = match selected {
        Selected::Cuda(_) => None,
        Selected::Cpu => Some("the CPU has no memory limit to find"),
        Selected::Wgpu(_) => Some("wgpu reports no device memory size"),
    };
    if let (None, Some(why)) = (budget, unknown_limit) {
        return Err(config::out_of_range(
            "--budget",
            "(none)",
            &format!("{why}: give --budget SIZE or memory.budget"),
        )
        .into());
    }
    let limit = budget.map(|b| (b as f64 * (1.0 - args.margin)) as u64);
    // Every trial runs on the backend chosen here, whatever `auto` would pick in the child.
    let trial = child::Args::new(config.as_deref())
        .sets(sets.iter().cloned())
        .backend(selected.kind());
    // A window never holds more than the train split: a larger trial would measure the split.
    let split = settings.data.train_samples();
    if args.max_batch > split {
        eprintln!(
            "note: the train split has {split} images, so micro-batches above {split} are not \
             tried (a trial would train on {split})"
        );
    }
    let scratch = settings.train.output_dir.join(outputs::FIND_BATCH_SIZE);
    // One search per config at a time: the trials' folders are this search's.
    let _owned = outputs::claim_scratch(&settings.train.output_dir, outputs::FIND_BATCH_SIZE)?;
    // However the search ends (an answer, nothing fitting, an error), its trials' folders go.
    let _trials = RemoveOnDrop(scratch.clone());
    let search = Search {
        args: trial,
        limit,
        effective_batch: settings.train.effective_batch(),
        max_batch: args.max_batch.min(split),
        scratch,
    };
    let found = find(&search, interrupt)?;
    let shown = config
        .as_ref()
        .map_or_else(|| "configs/amp.toml".into(), |c| c.display().to_string());
    print!("{}", found.describe(&shown));
    if let Some(path) = &args.json {
        crate::report::write_atomic(
            path,
            (serde_json::to_string_pretty(&found)? + "\n").as_bytes(),
        )?;
    }
    Ok(())
}

/// A folder removed when the search ends, however it ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        // Best effort: what is left is this search's own scratch, taken back by the next one.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
