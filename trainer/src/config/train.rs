//! `[train]`: batch, optimizer, learning-rate schedule, accumulation and clipping.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{at_most, not_set, out_of_range, ConfigError};

/// Which optimizer updates the weights.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    /// Adam (Kingma & Ba).
    #[default]
    Adam,
    /// SGD with momentum.
    Sgd,
}

/// `[train]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTrain {
    pub batch_size: usize,
    pub epochs: usize,
    pub max_steps: Option<usize>,
    pub optimizer: OptimizerName,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub seed: u64,
    pub output_dir: Option<String>,
    pub accum_steps: usize,
    pub lr_schedule: ScheduleName,
    pub warmup_steps: usize,
    pub min_lr: f64,
    pub grad_clip_norm: Option<f64>,
    pub checkpoint_every: Option<usize>,
}

/// How the learning rate moves over the optimizer steps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleName {
    /// `train.lr` throughout.
    #[default]
    Constant,
    /// Linear warmup over `train.warmup_steps`, then cosine decay to `train.min_lr`.
    WarmupCosine,
}

impl Default for RawTrain {
    fn default() -> Self {
        Self {
            batch_size: 128,
            epochs: 1,
            max_steps: None,
            optimizer: OptimizerName::Adam,
            lr: 1e-3,
            momentum: 0.9,
            weight_decay: 0.0,
            seed: 42,
            output_dir: None,
            accum_steps: 1,
            lr_schedule: ScheduleName::Constant,
            warmup_steps: 0,
            min_lr: 0.0,
            grad_clip_norm: None,
            checkpoint_every: None,
        }
    }
}

impl OptimizerName {
    /// The spelling of `train.optimizer`: `adam`, `sgd`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Adam => "adam",
            Self::Sgd => "sgd",
        }
    }
}

impl ScheduleName {
    /// The spelling of `train.lr_schedule`: `constant`, `warmup-cosine`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Constant => "constant",
            Self::WarmupCosine => "warmup-cosine",
        }
    }
}

/// `[train]`, validated.
#[derive(Debug, Clone)]
pub struct TrainSpec {
    pub batch_size: usize,
    pub epochs: usize,
    pub max_steps: Option<usize>,
    pub optimizer: OptimizerName,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub seed: u64,
    pub output_dir: PathBuf,
    /// Micro-batches per optimizer step.
    pub accum_steps: usize,
    pub lr_schedule: ScheduleName,
    pub warmup_steps: usize,
    pub min_lr: f64,
    pub grad_clip_norm: Option<f64>,
    /// Also write a checkpoint every this many optimizer steps (besides every epoch's end).
    pub checkpoint_every: Option<usize>,
    /// Whether the config named `output_dir` (else it is `runs/<config name>`).
    pub output_dir_given: bool,
}

impl TrainSpec {
    /// Samples per optimizer step: `batch_size × accum_steps`.
    pub fn effective_batch(&self) -> usize {
        self.batch_size * self.accum_steps
    }
}

/// Largest `train.batch_size` and `train.accum_steps`; their product is bounded by
/// [`MAX_EFFECTIVE_BATCH`].
pub const MAX_BATCH: usize = 1 << 16;
/// Largest `batch_size × accum_steps`.
pub const MAX_EFFECTIVE_BATCH: usize = 1 << 20;
/// Largest `train.epochs`.
pub const MAX_EPOCHS: usize = 1_000_000;
/// Largest `train.max_steps` and `train.warmup_steps`.
pub const MAX_STEPS: usize = 1_000_000_000;

/// Smallest `train.lr`.
pub const MIN_LR: f64 = 1e-9;

/// Checks `[train]`; `path` (the config file) names the default output directory.
pub fn validate(t: &RawTrain, path: &Path) -> Result<TrainSpec, ConfigError> {
    if t.batch_size == 0 {
        return Err(out_of_range("train.batch_size", 0, "must be at least 1"));
    }
    at_most("train.batch_size", t.batch_size, MAX_BATCH)?;
    if t.epochs == 0 {
        return Err(out_of_range("train.epochs", 0, "must be at least 1"));
    }
    at_most("train.epochs", t.epochs, MAX_EPOCHS)?;
    if let Some(max) = t.max_steps {
        at_most("train.max_steps", max, MAX_STEPS)?;
    }
    at_most("train.warmup_steps", t.warmup_steps, MAX_STEPS)?;
    if let Some(every) = t.checkpoint_every {
        if every == 0 {
            return Err(out_of_range(
                "train.checkpoint_every",
                0,
                "must be at least 1 (or left out: checkpoints at epoch ends only)",
            ));
        }
        at_most("train.checkpoint_every", every, MAX_STEPS)?;
    }
    if t.max_steps == Some(0) {
        return Err(out_of_range(
            "train.max_steps",
            0,
            "must be at least 1 (or left out)",
        ));
    }
    if !(t.lr > 0.0 && t.lr.is_finite()) {
        return Err(out_of_range(
            "train.lr",
            t.lr,
            "must be a finite number > 0",
        ));
    }
    if t.lr < MIN_LR {
        return Err(out_of_range(
            "train.lr",
            t.lr,
            "must be at least 1e-9: a smaller step leaves every f32 weight above 0.01 as it was \
             (Adam moves a weight by about lr per step), so nothing would train",
        ));
    }
    if !(0.0..1.0).contains(&t.momentum) {
        return Err(out_of_range(
            "train.momentum",
            t.momentum,
            "must be in [0, 1)",
        ));
    }
    if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
        return Err(out_of_range(
            "train.weight_decay",
            t.weight_decay,
            "must be a finite number >= 0",
        ));
    }
    if t.accum_steps == 0 {
        return Err(out_of_range(
            "train.accum_steps",
            0,
            "must be at least 1 (1 = no accumulation)",
        ));
    }
    at_most("train.accum_steps", t.accum_steps, MAX_BATCH)?;
    if t.batch_size * t.accum_steps > MAX_EFFECTIVE_BATCH {
        return Err(out_of_range(
            "train.accum_steps",
            t.accum_steps,
            &format!("train.batch_size × train.accum_steps must be at most {MAX_EFFECTIVE_BATCH}"),
        ));
    }
    if !(t.min_lr >= 0.0 && t.min_lr <= t.lr) {
        return Err(out_of_range(
            "train.min_lr",
            t.min_lr,
            "must be in [0, train.lr]",
        ));
    }
    let constant = t.lr_schedule == ScheduleName::Constant;
    not_set(
        &[("train.warmup_steps", constant && t.warmup_steps > 0)],
        "only to train.lr_schedule = \"warmup-cosine\"",
    )?;
    if let Some(c) = t.grad_clip_norm {
        if !(c > 0.0 && c.is_finite()) {
            return Err(out_of_range(
                "train.grad_clip_norm",
                c,
                "must be a finite number > 0 (or left out)",
            ));
        }
    }
    // The config's name becomes a folder name: nothing in it may reach a terminal raw.
    let stem = path
        .file_stem()
        .map(|s| crate::outputs::folder::safe_name(&s.to_string_lossy()))
        .unwrap_or_else(|| "run".into());
    if t.output_dir.as_deref().is_some_and(|d| d.trim().is_empty()) {
        return Err(out_of_range(
            "train.output_dir",
            "\"\"",
            "must name a folder (or be left out for runs/<config name>)",
        ));
    }
    let output_dir = t
        .output_dir
        .clone()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("runs").join(stem));
    Ok(TrainSpec {
        batch_size: t.batch_size,
        epochs: t.epochs,
        max_steps: t.max_steps,
        optimizer: t.optimizer,
        lr: t.lr,
        momentum: t.momentum,
        weight_decay: t.weight_decay,
        seed: t.seed,
        output_dir,
        accum_steps: t.accum_steps,
        lr_schedule: t.lr_schedule,
        warmup_steps: t.warmup_steps,
        min_lr: t.min_lr,
        grad_clip_norm: t.grad_clip_norm,
        checkpoint_every: t.checkpoint_every,
        output_dir_given: t.output_dir.is_some(),
    })
}
