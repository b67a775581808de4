//! `trainer compare`: runs each config in a fresh child process (so peaks do not mix), then
//! reports them side by side. A config that fails gets a row with its error. A signal is
//! forwarded to the running config, which checkpoints and stops; the report then holds the
//! configs that finished.

mod lines;
pub mod report;
mod terms;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::child::{self, unique_dir};
use super::dry_run_ok;
use crate::backend::BackendUsed;
use crate::cli::CompareArgs;
use crate::config::{self, BackendKind, ConfigError, Mistakes, PrecisionMode, Purpose, Settings};
use crate::memory::estimate::{estimate, Estimate, Target, Terms};
use crate::memory::timeline::WindowPhase;
use crate::memory::ProbeKind;
use crate::outputs::{self, folder};
use crate::report::step_log::StepLog;
use crate::report::summary::{mistakes_text, Summary};
use crate::training::checkpoint;
use crate::training::interrupt::{Interrupt, Stopped};

/// Bytes in use and reserved after one optimizer step (either may be unmeasured).
pub type StepMemory = (Option<u64>, Option<u64>);

/// One config's results; `--out`'s report.json holds a list of these.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// The config file as given.
    pub config: String,
    /// Short name used on the chart.
    pub name: String,
    pub model: Option<String>,
    /// Trainable parameters.
    pub parameters: Option<usize>,
    pub backend: Option<BackendUsed>,
    pub precision: Option<PrecisionMode>,
    /// Batch norm's dtype; absent for a model without batch norm.
    pub batch_norm: Option<String>,
    pub batch_size: Option<usize>,
    pub accum_steps: Option<usize>,
    /// A language model's tokens per sequence.
    #[serde(default)]
    pub seq_len: Option<usize>,
    pub predicted_peak_bytes: Option<u64>,
    pub peak_bytes: Option<u64>,
    /// `peak_bytes` above what was resident before the model (the data set on the CPU heap):
    /// the figure the "vs first" ratios use, comparable across backends.
    #[serde(default)]
    pub training_peak_bytes: Option<u64>,
    pub reserved_peak_bytes: Option<u64>,
    /// Reserved bytes right after the last optimizer step (after `free_cache`'s cleanup).
    #[serde(default)]
    pub reserved_after_step_bytes: Option<u64>,
    /// What `peak_bytes` counts: the CPU heap, or CubeCL's usage on CUDA or wgpu.
    pub memory_probe: Option<ProbeKind>,
    pub images_per_sec: Option<f64>,
    pub final_train_loss: Option<f64>,
    pub eval_accuracy: Option<f64>,
    pub skipped_steps: Option<usize>,
    /// The `[mistakes]` switches the run made (none for most), written as summary.json
    /// writes them.
    #[serde(serialize_with = "mistakes_text::serialize_option")]
    pub mistakes: Option<Mistakes>,
    /// Peak bytes in use during evaluation, and what evaluating added above what was in use
    /// when it began (`[mistakes] eval_with_autograd` raises both).
    #[serde(default)]
    pub eval_peak_bytes: Option<u64>,
    #[serde(default)]
    pub eval_added_bytes: Option<u64>,
    /// The predicted peak by term (`trainer estimate` for the config as run), for the
    /// stacked chart.
    #[serde(default)]
    pub terms: Option<Terms>,
    /// Bytes in use and reserved after each optimizer step (the run's `steps.csv`), for
    /// `steps.svg`.
    #[serde(skip)]
    pub per_step: Vec<StepMemory>,
    /// Phase and bytes in use at each sample of the peak window (`memory_timeline.csv`), for
    /// `timeline.svg`.
    #[serde(skip)]
    pub timeline: Vec<(WindowPhase, u64)>,
    /// Why the run failed; absent when it finished.
    pub error: Option<String>,
}

impl Row {
    fn finished(config: &Path, name: String, s: Summary) -> Self {
        Self {
            config: crate::report::printable(&config.display().to_string()),
            name,
            model: Some(s.model),
            parameters: Some(s.parameters),
            backend: Some(s.backend),
            precision: Some(s.precision),
            batch_norm: s.batch_norm,
            batch_size: Some(s.batch_size),
            accum_steps: Some(s.accum_steps),
            seq_len: s.seq_len,
            predicted_peak_bytes: Some(s.predicted_peak_bytes),
            peak_bytes: s.memory.peak_bytes,
            training_peak_bytes: s.memory.training_peak_bytes,
            reserved_peak_bytes: s.memory.reserved_peak_bytes,
            reserved_after_step_bytes: s.memory.reserved_after_step_bytes,
            memory_probe: Some(s.memory.memory_probe),
            images_per_sec: Some(s.images_per_sec),
            final_train_loss: Some(s.final_train_loss),
            eval_accuracy: Some(s.eval_accuracy),
            skipped_steps: Some(s.skipped_steps),
            mistakes: Some(s.mistakes),
            eval_peak_bytes: s.memory.eval_peak_bytes,
            eval_added_bytes: s.memory.eval_added_bytes,
            ..Self::default()
        }
    }

    /// Reads the per-step memory and the timeline a finished run wrote into `dir` (either may
    /// be absent: a run that measured nothing writes no timeline).
    fn read_series(&mut self, dir: &Path) {
        if let Ok(csv) = std::fs::read_to_string(dir.join("steps.csv")) {
            self.per_step = StepLog::parse(&csv).memory().collect();
        }
        if let Ok(csv) = std::fs::read_to_string(dir.join("memory_timeline.csv")) {
            self.timeline = csv
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split(',').collect();
                    Some((WindowPhase::parse(f.get(1)?)?, f.get(4)?.parse().ok()?))
                })
                .collect();
        }
    }

    /// A failed run: what the config says, where it loads (`estimate` of it), and the error.
    /// The config's own `backend.kind` (with the overrides, `--backend` among them) decides
    /// what the prediction counts.
    fn failed(
        config: &Path,
        name: String,
        loaded: Option<(&Settings, &Estimate)>,
        error: String,
    ) -> Self {
        let mut row = Self {
            config: crate::report::printable(&config.display().to_string()),
            name,
            error: Some(error),
            ..Self::default()
        };
        if let Some((s, e)) = loaded {
            row.model = Some(s.model.name());
            row.parameters = Some(e.parameters as usize);
            row.predicted_peak_bytes = Some(e.predicted_peak());
            row.precision = Some(s.precision.mode);
            row.batch_size = Some(s.train.batch_size);
            row.accum_steps = Some(s.train.accum_steps);
        }
        row
    }
}

/// What to compare and how.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Config files, in report order.
    pub configs: Vec<PathBuf>,
    /// Optimizer steps per config.
    pub steps: usize,
    /// `--backend` for every run, else each config's own.
    pub backend: Option<BackendKind>,
    /// `--set` overrides applied to every config.
    pub sets: Vec<String>,
    /// `--sweep KEY=V1,V2,…`: every config runs once per value.
    pub sweep: Option<Sweep>,
    /// Where each run's folder and the reports go.
    pub out: PathBuf,
    /// A line under every chart.
    pub note: Option<String>,
}

/// One key tried at several values.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// Dotted config key, e.g. `train.batch_size`.
    pub key: String,
    /// Its values, in order.
    pub values: Vec<String>,
}

impl Sweep {
    /// Parses `KEY=V1,V2,…`.
    pub fn parse(arg: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::Value {
            key: "--sweep",
            value: arg.into(),
            allowed: "expected KEY=V1,V2,…, e.g. --sweep train.batch_size=32,64,128".into(),
        };
        let (key, values) = arg.split_once('=').ok_or_else(bad)?;
        let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
        if key.trim().is_empty() || values.iter().any(String::is_empty) {
            return Err(bad());
        }
        if key.trim() == "train.max_steps" {
            return Err(ConfigError::Value {
                key: "--sweep",
                value: arg.into(),
                allowed: "--steps sets every run's steps: sweep another key".into(),
            });
        }
        if key.trim() == "train.output_dir" {
            return Err(ConfigError::Value {
                key: "--sweep",
                value: arg.into(),
                allowed: "compare gives every run its own folder under --out: sweep another key"
                    .into(),
            });
        }
        Ok(Self {
            key: key.trim().into(),
            values,
        })
    }

    /// The last part of the key: `batch_size` for `train.batch_size`.
    fn leaf(&self) -> &str {
        self.key.rsplit('.').next().unwrap_or(&self.key)
    }
}

/// `--out` when not given.
pub const DEFAULT_OUT: &str = "runs/compare";

/// Each run of a plan: config, row name, extra `--set`s.
fn runs(plan: &Plan) -> Vec<(&PathBuf, String, Vec<String>)> {
    let mut runs = Vec::new();
    for config in &plan.configs {
        let stem = config.file_stem().map_or_else(
            || "config".into(),
            |s| crate::report::printable(&s.to_string_lossy()),
        );
        match &plan.sweep {
            None => runs.push((config, stem, Vec::new())),
            Some(sweep) => {
                for v in &sweep.values {
                    let name = format!("{stem} {}={v}", sweep.leaf());
                    runs.push((config, name, vec![format!("{}={v}", sweep.key)]));
                }
            }
        }
    }
    runs
}

/// Checks that every run's config loads, training nothing (`--dry-run`).
pub fn check(plan: &Plan) -> Result<usize, ConfigError> {
    let runs = runs(plan);
    for (config, _, extra) in &runs {
        let sets = [plan.sets.clone(), extra.clone()].concat();
        config::load_file_for(config, &sets, Purpose::Train)?;
    }
    Ok(runs.len())
}

/// What [`run_plan`] ran.
#[derive(Debug, Default)]
pub struct Ran {
    /// One row per run that ended by itself, finished or failed, in plan order.
    pub rows: Vec<Row>,
    /// Runs in the plan.
    pub planned: usize,
    /// The folder of the run a signal stopped, if one did.
    pub stopped: Option<PathBuf>,
}

/// Runs every config of `plan`, one child process each; after a signal (`interrupt`,
/// forwarded to the running child) it starts no other.
pub fn run_plan(plan: &Plan, interrupt: &Interrupt) -> anyhow::Result<Ran> {
    let runs = runs(plan);
    let planned = runs.len();
    let done = Arc::new(AtomicUsize::new(0));
    let (count, out) = (Arc::clone(&done), plan.out.join("runs"));
    interrupt.on_second(move || {
        format!(
            "{} of {planned} configs had finished (their folders are in {}); no report was \
             written",
            count.load(Ordering::SeqCst),
            out.display()
        )
    });
    let bar = ProgressBar::new(runs.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} configs  {elapsed}  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut taken = Vec::new();
    let mut rows = Vec::new();
    let mut stopped = None;
    for (config, name, extra) in runs {
        if interrupt.requested().is_some() {
            break;
        }
        bar.set_message(name.clone());
        let dir = unique_dir(
            &plan.out.join("runs"),
            &folder::safe_name(&name),
            &mut taken,
        );
        // --out is compare's own folder: a repeated compare replaces its runs.
        let mut args = child::Args::new(Some(config))
            .sets(plan.sets.iter().cloned())
            .sets(extra)
            .max_steps(plan.steps)
            .overwrite();
        if let Some(b) = plan.backend {
            args = args.backend(b);
        }
        // The config as the child ran it, and its estimate: the terms chart's bars, and what a
        // failed run's row can still say.
        let as_run = [args.overrides(), &args.flag_overrides()].concat();
        let loaded = config::load_file_for(config, &as_run, Purpose::Train)
            .ok()
            .map(|s| {
                let e = estimate(&s, Target::of(s.backend));
                (s, e)
            });
        let result = child::train(&args, &dir, interrupt)?;
        if let (Some(_), Err(_)) = (interrupt.requested(), &result) {
            // Stopped by the signal: not a result, and not a failure of the config.
            stopped = Some(dir);
            break;
        }
        let mut row = match result {
            Ok(summary) => {
                let mut row = Row::finished(config, name, summary);
                row.read_series(&dir);
                row
            }
            Err(failure) => {
                bar.suspend(|| eprintln!("{name}: {}", failure.message));
                let loaded = loaded.as_ref().map(|(s, e)| (s, e));
                Row::failed(config, name, loaded, failure.message)
            }
        };
        row.terms = loaded.map(|(_, e)| e.terms);
        rows.push(row);
        done.store(rows.len(), Ordering::SeqCst);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(Ran {
        rows,
        planned,
        stopped,
    })
}

/// Why a one-step compare measures less than it predicts: the optimizer makes its state
/// (Adam's moments, SGD's momentum) in its first update, after that step's backward peak.
const ONE_STEP: &str = "one step: the optimizer makes its state in its first update, after \
    that step's backward peak, so a one-step peak can sit below \"predicted\", which is every \
    later step's peak: use --steps 2 or more to check the estimate";

/// `trainer compare`: runs the plan, prints the table and writes the reports; stopped by a
/// signal, the reports of the configs that finished.
pub fn run(args: CompareArgs, dry: bool, interrupt: &Interrupt) -> anyhow::Result<()> {
    let mut plan = Plan {
        configs: args.configs,
        steps: args.steps,
        backend: args.backend,
        sets: args.overrides,
        sweep: args.sweep.as_deref().map(Sweep::parse).transpose()?,
        out: args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT)),
        note: args.note,
    };
    if let Some(set) = plan.sets.iter().find(|s| {
        s.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "train.output_dir")
    }) {
        return Err(ConfigError::Value {
            key: "--set",
            value: set.clone(),
            allowed: "compare gives every run its own folder under --out: name --out instead"
                .into(),
        }
        .into());
    }
    if let (Some(sweep), Some(_)) = (&plan.sweep, plan.backend) {
        if sweep.key == "backend.kind" {
            return Err(ConfigError::Value {
                key: "--sweep",
                value: format!("{}={}", sweep.key, sweep.values.join(",")),
                allowed: "--backend sets every run's backend: drop one of the two".into(),
            }
            .into());
        }
    }
    if dry {
        let n = check(&plan)?;
        return dry_run_ok(&format!("{n} runs, every config loads"));
    }
    // --out is this compare's until it ends; an earlier report there is kept unless replaced.
    let (out, _owned) = outputs::claim_report(&plan.out, args.out.is_some(), args.overwrite)?;
    plan.out = out;
    let ran = run_plan(&plan, interrupt)?;
    let rows = ran.rows;
    let signal = interrupt.requested().filter(|_| rows.len() < ran.planned);
    let mut heading = format!(
        "`trainer compare {}` — {} optimizer steps per config, backend {}",
        plan.configs
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
        plan.steps,
        plan.backend
            .map_or("as each config says", BackendKind::name)
    );
    if plan.steps == 1 {
        heading.push_str(&format!(" ({ONE_STEP})"));
    }
    if let Some(signal) = signal {
        let mut what = format!("{} of {} configs finished; ", rows.len(), ran.planned);
        if rows.is_empty() {
            what.push_str("no report was written");
        } else {
            // Not print!: after SIGHUP the terminal may be gone, and the report must be written.
            let _ = write!(std::io::stdout(), "{}", report::markdown(&rows));
            let heading = format!("{heading} (stopped by a signal: {what}the others did not run)");
            report::write_all(&rows, &plan.out, &heading, plan.note.as_deref())?;
            what.push_str(&format!(
                "their report (report.md, report.csv, report.json, charts) is in {}",
                plan.out.display()
            ));
        }
        if let Some(dir) = ran.stopped {
            let kept = checkpoint::describe(&checkpoint::dir(&dir));
            what.push_str(&format!("; the stopped run: {kept}"));
        }
        return Err(Stopped { signal, what }.into());
    }
    print!("{}", report::markdown(&rows));
    if plan.steps == 1 {
        println!("Note: {ONE_STEP}.");
    }
    report::write_all(&rows, &plan.out, &heading, plan.note.as_deref())?;
    let failed = rows.iter().filter(|r| r.error.is_some()).count();
    println!(
        "{} configs, {failed} failed; report.md, report.csv, report.json and the charts (*.svg) in {}",
        rows.len(),
        plan.out.display()
    );
    if failed > 0 {
        // The report is written either way; the exit code says not every row is a result.
        anyhow::bail!(
            "{failed} of {} configs failed (see the error column of report.md)",
            rows.len()
        );
    }
    Ok(())
}
