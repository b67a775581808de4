//! `trainer find-batch-size`: the seed article's "halve the batch until the error goes away",
//! done properly. Trials at growing, then bisected, micro-batch sizes, each in a fresh child
//! process (a CUDA out-of-memory error is caught there and its memory released), each two
//! optimizer steps: the optimizer makes its state in its first update, so only the second
//! step's backward holds everything a real run's steps do. On the CPU there is no device
//! limit, so the budget decides: a trial fits when its measured peak is within the budget less
//! a safety margin. A signal is forwarded to the running trial; the search then stops with the
//! trials so far and the largest size that fitted.
//!
//! `--search seq_len` searches a GPT's `model.seq_len` the same way at the config's
//! micro-batch: how long a context fits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::child;
use super::{dry_run_ok, settings};
use crate::backend::{self, Selected};
use crate::cli::{ConfigArgs, FindArgs, SearchKey};
use crate::config::{self, Purpose};
use crate::memory::human;
use crate::outputs;
use crate::training::interrupt::{Interrupt, Stopped};

/// Optimizer steps per trial: the second is the first with the optimizer's state.
const TRIAL_STEPS: usize = 2;

impl SearchKey {
    /// The key a trial sets.
    fn setting(self) -> &'static str {
        match self {
            Self::BatchSize => "train.batch_size",
            Self::SeqLen => "model.seq_len",
        }
    }

    /// What one value is called in the lines printed.
    fn noun(self) -> &'static str {
        match self {
            Self::BatchSize => "micro-batch",
            Self::SeqLen => "seq_len",
        }
    }

    /// "largest" or "longest".
    fn most(self) -> &'static str {
        match self {
            Self::BatchSize => "largest",
            Self::SeqLen => "longest",
        }
    }
}

/// One trial: a run of [`TRIAL_STEPS`] steps at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    pub batch_size: usize,
    /// A GPT's sequence length in this trial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
    /// Measured peak bytes, when the trial finished.
    pub peak_bytes: Option<u64>,
    pub fits: bool,
    /// Why it does not fit: over the limit, or the run's own error (e.g. out of memory).
    pub reason: Option<String>,
}

/// The search and its answer.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// `train.batch_size` or `model.seq_len`.
    pub searched: &'static str,
    /// Bytes a trial may peak at: budget × (1 − margin); absent where only the device decides.
    pub limit_bytes: Option<u64>,
    pub trials: Vec<Trial>,
    /// The largest micro-batch that fits; with `--search seq_len`, the config's.
    pub batch_size: usize,
    /// A GPT's longest `seq_len` that fits, or the config's when the batch was searched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
    /// The measured peak of the answer's trial.
    pub peak_bytes: Option<u64>,
    /// How to keep the effective batch (batch size searches).
    #[serde(flatten)]
    pub accumulation: Option<Accumulation>,
}

/// Micro-batches that keep the config's effective batch and each fit.
#[derive(Debug, Clone, Serialize)]
pub struct Accumulation {
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
    /// The key searched.
    pub key: SearchKey,
    /// Peak bytes a trial may reach; `None`: a trial fits when it does not run out of memory.
    pub limit: Option<u64>,
    /// The config's micro-batch (the one kept when `seq_len` is searched).
    pub batch_size: usize,
    /// A GPT config's `seq_len` (the one kept when the batch is searched).
    pub seq_len: Option<usize>,
    /// The config's effective batch (batch_size × accum_steps).
    pub effective_batch: usize,
    /// Largest value tried.
    pub max: usize,
    /// Where trial runs write (its owner removes it afterwards).
    pub scratch: PathBuf,
}

impl Search {
    /// A trial's value of the key searched.
    fn value(&self, t: &Trial) -> usize {
        match self.key {
            SearchKey::BatchSize => t.batch_size,
            SearchKey::SeqLen => t.seq_len.unwrap_or(0),
        }
    }

    /// The trial among `trials` with the largest value that fitted.
    fn largest_fit<'a>(&self, trials: &'a [Trial]) -> Option<&'a Trial> {
        trials
            .iter()
            .filter(|t| t.fits)
            .max_by_key(|t| self.value(t))
    }
}

/// What a search stopped by `signal` after `trials` leaves: the trials are on stderr already,
/// the answer so far is the error's line.
fn stopped(search: &Search, signal: i32, trials: &[Trial]) -> anyhow::Error {
    let key = search.key;
    let so_far = match search.largest_fit(trials) {
        Some(t) => format!(
            "the {} {} that fitted so far is {}{}",
            key.most(),
            key.noun(),
            search.value(t),
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

/// Runs the trials and finds the largest value of the key that fits; after a signal
/// (`interrupt`, forwarded to the running trial) it stops with the trials so far.
pub fn find(search: &Search, interrupt: &Interrupt) -> anyhow::Result<Found> {
    let key = search.key;
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
            b => format!("the {} {} that fitted: {b}", key.most(), key.noun()),
        };
        format!("{} trials had finished; {fit}", n.load(Ordering::SeqCst))
    });
    let mut trials: Vec<Trial> = Vec::new();
    let mut trial = |v: usize| -> anyhow::Result<bool> {
        if let Some(signal) = interrupt.requested() {
            bar.finish_and_clear();
            return Err(stopped(search, signal, &trials));
        }
        bar.set_message(format!("{} {v}", key.noun()));
        bar.inc(1);
        let (batch_size, seq_len) = match key {
            SearchKey::BatchSize => (v, search.seq_len),
            SearchKey::SeqLen => (search.batch_size, Some(v)),
        };
        let mut args = search
            .args
            .clone()
            .set(format!("{}={v}", key.setting()))
            .max_steps(TRIAL_STEPS)
            .trial();
        if key == SearchKey::BatchSize {
            // One micro-batch per step: the accumulation is what the answer suggests.
            args = args.set("train.accum_steps=1");
        }
        let dir = search.scratch.join(format!("{}-{v}", key.setting()));
        let result = child::train(&args, &dir, interrupt)?;
        if let (Some(signal), Err(_)) = (interrupt.requested(), &result) {
            // Stopped by the signal: not a measurement.
            bar.finish_and_clear();
            return Err(stopped(search, signal, &trials));
        }
        let t = match result {
            Ok(s) => {
                let peak = s.memory.peak_bytes;
                let over = matches!((peak, search.limit), (Some(p), Some(l)) if p > l);
                Trial {
                    batch_size,
                    seq_len,
                    peak_bytes: peak,
                    fits: !over,
                    reason: over.then(|| "over the limit".into()),
                }
            }
            Err(f) if f.out_of_memory() => Trial {
                batch_size,
                seq_len,
                peak_bytes: None,
                fits: false,
                reason: Some(f.message),
            },
            Err(f) => anyhow::bail!("trial at {} {v} failed: {}", key.noun(), f.message),
        };
        let fits = t.fits;
        let line = format!(
            "  {} {:>5}: {:>10}  {}",
            key.noun(),
            v,
            t.peak_bytes.map_or("—".into(), human),
            if fits { "fits" } else { "does not fit" }
        );
        // Shown with or without a terminal: the trials are the evidence for the answer.
        bar.suspend(|| eprintln!("{line}"));
        trials.push(t);
        finished.store(trials.len(), Ordering::SeqCst);
        if let Some(t) = search.largest_fit(&trials) {
            largest.store(search.value(t), Ordering::SeqCst);
        }
        Ok(fits)
    };
    // Grow by doubling from 1 until a value does not fit, then bisect between the two.
    let (mut good, mut bad) = (0usize, None);
    let mut b = 1usize;
    while b <= search.max {
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
        // Out of memory at the smallest value: the same exit as any out-of-memory run.
        return Err(crate::memory::host::NothingFits {
            what: match key {
                SearchKey::BatchSize => "a micro-batch of 1",
                SearchKey::SeqLen => "a seq_len of 1",
            },
            limit: search.limit,
        }
        .into());
    }
    if bad.is_none() && good < search.max {
        // Doubling stepped over the largest value allowed: try that value itself.
        match trial(search.max)? {
            true => good = search.max,
            false => bad = Some(search.max),
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
    let peak = search.largest_fit(&trials).and_then(|t| t.peak_bytes);
    Ok(match key {
        SearchKey::BatchSize => {
            let e = search.effective_batch;
            // The fewest micro-batches that divide the effective batch exactly and each fit.
            let k = (1..=e)
                .find(|k| e.is_multiple_of(*k) && e / k <= good)
                .unwrap_or(e);
            Found {
                searched: key.setting(),
                limit_bytes: search.limit,
                batch_size: good,
                seq_len: search.seq_len,
                accumulation: Some(Accumulation {
                    effective_batch: e,
                    suggested_batch_size: e / k,
                    suggested_accum_steps: k,
                }),
                peak_bytes: peak,
                trials,
            }
        }
        SearchKey::SeqLen => Found {
            searched: key.setting(),
            limit_bytes: search.limit,
            batch_size: search.batch_size,
            seq_len: Some(good),
            accumulation: None,
            peak_bytes: peak,
            trials,
        },
    })
}

impl Found {
    /// The answer for the terminal.
    pub fn describe(&self, config: &str) -> String {
        // A batch search suggests an accumulation; a seq_len search has none.
        let mut out = match (&self.accumulation, self.seq_len) {
            (None, Some(s)) => format!(
                "longest seq_len that fits at micro-batch {}: {s}",
                self.batch_size
            ),
            _ => format!("largest micro-batch that fits: {}", self.batch_size),
        };
        if let Some(p) = self.peak_bytes {
            out.push_str(&format!(" (measured peak {})", human(p)));
        }
        if let Some(l) = self.limit_bytes {
            out.push_str(&format!(", limit {}", human(l)));
        }
        match (&self.accumulation, self.seq_len) {
            (Some(a), _) => out.push_str(&format!(
                "\nto keep the effective batch of {}: batch_size = {}, accum_steps = {}\n  trainer --config {config} --set train.batch_size={} --set train.accum_steps={}\n",
                a.effective_batch,
                a.suggested_batch_size,
                a.suggested_accum_steps,
                a.suggested_batch_size,
                a.suggested_accum_steps
            )),
            (None, Some(s)) => {
                out.push_str(&format!("\n  trainer --config {config} --set model.seq_len={s}\n"))
            }
            (None, None) => out.push('\n'),
        }
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
    let batch_size = settings.train.batch_size;
    // The most a trial may set the key to: beyond what the data holds, a trial would measure
    // the data, not the size.
    let max = match (args.search, settings.data.longest_seq_len(batch_size)) {
        (SearchKey::BatchSize, _) => {
            let split = settings.data.train_samples();
            if args.max_batch > split {
                let samples = match settings.model.tokens_per_sample() {
                    Some(_) => "windows",
                    None => "images",
                };
                eprintln!(
                    "note: the train split has {split} {samples}, so micro-batches above {split} \
                     are not tried (a trial would train on {split})"
                );
            }
            args.max_batch.min(split)
        }
        (SearchKey::SeqLen, None) => {
            return Err(config::out_of_range(
                "--search",
                "seq_len",
                &format!(
                    "only a GPT has a seq_len (model.name = \"gpt\"); this config's model is {}",
                    settings.model.name()
                ),
            )
            .into())
        }
        (SearchKey::SeqLen, Some(0)) => {
            return Err(config::out_of_range(
                "--search",
                "seq_len",
                &format!(
                    "the text holds no micro-batch of {batch_size} windows at any seq_len (more \
                     text, or a smaller train.batch_size)"
                ),
            )
            .into())
        }
        (SearchKey::SeqLen, Some(longest)) => args.max_seq_len.min(longest),
    };
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
    let scratch = settings.train.output_dir.join(outputs::FIND_BATCH_SIZE);
    // One search per config at a time: the trials' folders are this search's.
    let _owned = outputs::claim_scratch(&settings.train.output_dir, outputs::FIND_BATCH_SIZE)?;
    // However the search ends (an answer, nothing fitting, an error), its trials' folders go.
    let _trials = RemoveOnDrop(scratch.clone());
    let search = Search {
        args: trial,
        key: args.search,
        limit,
        batch_size,
        seq_len: settings.model.tokens_per_sample(),
        effective_batch: settings.train.effective_batch(),
        max,
        scratch,
    };
    let found = find(&search, interrupt)?;
    if args.search == SearchKey::SeqLen && found.seq_len == Some(max) && max < args.max_seq_len {
        // The text, not the memory, ended the search.
        eprintln!(
            "note: the text holds {batch_size} train windows up to seq_len {max} only, so longer \
             ones were not tried (more text: a larger file, or data.corpus_bytes)"
        );
    }
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
