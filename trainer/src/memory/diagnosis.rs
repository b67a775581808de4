//! Running out of memory, diagnosed: where it happened and the fixes ranked by how much the
//! estimate says each one saves for this very config. Raised before training when the estimate
//! exceeds `memory.budget` (or a CUDA device's free memory), and by [`super::catch`] when an
//! allocation fails during training. The binary prints it without a backtrace and exits with
//! code 3; checkpoints are written atomically, so the last one is intact.

use std::fmt;

use crate::config::{
    self, BackendKind, Checkpointing, Fuse, ModelSpec, PrecisionMode, Purpose, Settings, Shard,
};
use crate::memory::estimate::{estimate, Target};
use crate::memory::human;
use crate::training::checkpoint;

/// One way to need less memory, with the estimate's peak after applying it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fix {
    /// What changes, for people.
    pub what: String,
    /// The `--set` overrides that apply it.
    pub sets: Vec<String>,
    /// Predicted peak bytes with the fix.
    pub peak: u64,
    /// Predicted bytes saved.
    pub saves: u64,
}

/// Out of memory, with a diagnosis.
#[derive(Debug, thiserror::Error)]
pub struct OutOfMemory {
    /// When: "before training" or the training phase that failed.
    pub phase: String,
    /// What ran out: the budget, or the device's own message.
    pub cause: String,
    /// The estimate's peak for the config as it is.
    pub predicted: u64,
    /// `memory.budget`, when one is set.
    pub budget: Option<u64>,
    /// Largest predicted saving first.
    pub fixes: Vec<Fix>,
    /// Whether the last checkpoint is intact, or none was written.
    pub checkpoint: String,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "out of memory {}: {}", self.phase, self.cause)?;
        writeln!(
            f,
            "predicted peak of this config: {}",
            human(self.predicted)
        )?;
        if self.fixes.is_empty() {
            writeln!(f, "no fix the estimate knows of lowers it")?;
        } else {
            writeln!(f, "fixes, largest predicted saving first:")?;
        }
        let width = self.fixes.iter().map(|x| x.what.chars().count()).max();
        for fix in &self.fixes {
            let fits = match self.budget {
                Some(b) if fix.peak <= b => " (fits the budget)",
                _ => "",
            };
            writeln!(
                f,
                "  {:<w$}  {:>11} → {:>10}{fits}  --set {}",
                fix.what,
                format!("−{}", human(fix.saves)),
                human(fix.peak),
                fix.sets.join(" --set "),
                w = width.unwrap_or(0)
            )?;
        }
        write!(f, "{}", self.checkpoint)
    }
}

/// The fixes that lower the estimated peak of `settings`, largest saving first.
pub fn fixes(settings: &Settings, target: Target) -> Vec<Fix> {
    let now = estimate(settings, target).predicted_peak();
    let t = &settings.train;
    let mut candidates: Vec<(String, Vec<String>)> = Vec::new();
    if settings.precision.mode == PrecisionMode::F32 {
        candidates.push((
            "f16 mixed precision".into(),
            vec!["precision.mode=f16-mixed".into()],
        ));
    }
    for factor in [2, 4] {
        if t.batch_size.is_multiple_of(factor) {
            let (b, k) = (t.batch_size / factor, t.accum_steps * factor);
            candidates.push((
                format!("batch {b} × accum {k}"),
                vec![
                    format!("train.batch_size={b}"),
                    format!("train.accum_steps={k}"),
                ],
            ));
        }
    }
    if settings.memory.checkpointing == Checkpointing::None {
        candidates.push((
            "activation checkpointing".into(),
            vec!["memory.checkpointing=balanced".into()],
        ));
    }
    if settings.memory.fuse == Fuse::None {
        candidates.push(("fused blocks".into(), vec!["memory.fuse=blocks".into()]));
    }
    if let ModelSpec::Gpt(g) = &settings.model {
        if settings.memory.checkpointing != Checkpointing::Blocks {
            candidates.push((
                "whole-block checkpointing".into(),
                vec!["memory.checkpointing=blocks".into()],
            ));
        }
        if g.attention == burn_models::Attention::Naive {
            candidates.push((
                "memory-efficient attention".into(),
                vec!["model.attention=memory_efficient".into()],
            ));
        }
        if g.seq_len >= 2 {
            let half = g.seq_len / 2;
            candidates.push((
                format!("a shorter sequence ({half} tokens)"),
                vec![format!("model.seq_len={half}")],
            ));
        }
    }
    // Several peers: each may keep a shard of the optimizer state (ZeRO-1), and of the
    // gradients (ZeRO-2).
    let d = settings.distributed.as_ref();
    if let Some(d) = d.filter(|d| d.world() > 1) {
        let world = d.world();
        if d.shard == Shard::None {
            candidates.push((
                format!("ZeRO-1: optimizer state sharded over {world} peers"),
                vec!["distributed.shard=optimizer".into()],
            ));
        }
        if d.shard != Shard::OptimizerGradients {
            candidates.push((
                format!("ZeRO-2: optimizer state and gradients over {world} peers"),
                vec!["distributed.shard=optimizer+gradients".into()],
            ));
        }
    }
    // One GPU: a second one halves each device's micro-batch at the same step size, and
    // ZeRO-2 halves its optimizer state (only where a second GPU exists: the line says so).
    let gpu = matches!(settings.backend, BackendKind::Cuda | BackendKind::Auto);
    if d.is_none() && target == Target::Device && gpu && t.batch_size.is_multiple_of(2) {
        candidates.push((
            format!(
                "a second GPU: batch {} on each, ZeRO-2 (if you have one)",
                t.batch_size / 2
            ),
            vec![
                "distributed.devices=[\"cuda:0\",\"cuda:1\"]".into(),
                "distributed.shard=optimizer+gradients".into(),
                format!("train.batch_size={}", t.batch_size / 2),
            ],
        ));
    }
    if let ModelSpec::MobileNet(m) = &settings.model {
        if m.width_multiplier > 0.5 {
            candidates.push((
                "MobileNet α 0.5 (a smaller model)".into(),
                vec!["model.width_multiplier=0.5".into()],
            ));
        }
    }
    let mut fixes: Vec<Fix> = candidates
        .into_iter()
        .filter_map(|(what, sets)| {
            let with = config::load_for(&settings.toml, &settings.path, &sets, Purpose::Estimate);
            let peak = estimate(&with.ok()?, target).predicted_peak();
            (peak < now).then(|| Fix {
                what,
                sets,
                peak,
                saves: now - peak,
            })
        })
        .collect();
    fixes.sort_by_key(|f| std::cmp::Reverse(f.saves));
    fixes
}

/// The diagnosis for `settings` failing `phase` because of `cause`.
pub fn diagnose(settings: &Settings, target: Target, phase: &str, cause: String) -> OutOfMemory {
    OutOfMemory {
        phase: phase.into(),
        cause,
        predicted: estimate(settings, target).predicted_peak(),
        budget: settings.memory.budget,
        fixes: fixes(settings, target),
        checkpoint: checkpoint::describe(&checkpoint::dir(&settings.train.output_dir)),
    }
}

/// Before training: an error when the estimated peak exceeds `memory.budget`.
pub fn check_budget(settings: &Settings, target: Target) -> Result<(), OutOfMemory> {
    match settings.memory.budget {
        Some(budget) => check_limit(settings, target, budget, || {
            format!("over memory.budget = {}", human(budget))
        }),
        None => Ok(()),
    }
}

/// Before training on CUDA: an error when the estimated peak exceeds the device's free memory.
pub fn check_free(
    settings: &Settings,
    device: &str,
    free: u64,
    total: u64,
) -> Result<(), OutOfMemory> {
    check_limit(settings, Target::Device, free, || {
        format!(
            "over the free memory of {device} ({} free of {})",
            human(free),
            human(total)
        )
    })
}

/// Before training: the diagnosis, with `cause`, when the estimated peak exceeds `limit`.
fn check_limit(
    settings: &Settings,
    target: Target,
    limit: u64,
    cause: impl FnOnce() -> String,
) -> Result<(), OutOfMemory> {
    if estimate(settings, target).predicted_peak() <= limit {
        return Ok(());
    }
    Err(diagnose(settings, target, "before training", cause()))
}
