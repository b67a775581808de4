//! Configuration: a TOML file plus `--set key=value` overrides, validated into [`Settings`].
//!
//! Every failure is one [`ConfigError`] line that names the key, the value and what is allowed.

mod memory;
mod precision;
mod raw;

use std::path::{Path, PathBuf};

use burn_models::{MobileNetConfig, SimpleModelConfig};

pub use memory::{parse_size, Checkpointing, FreeCache, MemorySpec, SIZE_HELP};
pub use precision::{unsupported_dtype, LossScaleSpec, PrecisionSpec};
pub use raw::{BackendKind, DataSource, ModelName, OptimizerName, RawConfig, ScheduleName};

/// A config that cannot be used. The binary prints it on one line and exits with code 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file is not TOML.
    #[error("{path}:{line}: not valid TOML: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A `--set` argument without `=`.
    #[error("--set {0}: expected key=value, e.g. --set train.batch_size=32")]
    SetSyntax(String),
    /// A key whose value has the wrong type or is unknown.
    #[error("{key}: {message}")]
    Key { key: String, message: String },
    /// A value of the right type outside what is allowed.
    #[error("{key} = {value}: {allowed}")]
    Value {
        key: &'static str,
        value: String,
        allowed: String,
    },
}

/// The model to build, validated.
#[derive(Debug, Clone)]
pub enum ModelSpec {
    /// The seed article's SimpleModel.
    Simple(SimpleModelConfig),
    /// MobileNetV1.
    MobileNet(MobileNetConfig),
}

impl ModelSpec {
    /// Short name used in reports.
    pub fn name(&self) -> String {
        match self {
            Self::Simple(_) => "simple".into(),
            Self::MobileNet(c) => format!("mobilenet(α={})", c.width_multiplier),
        }
    }
}

/// The data to train on, validated.
#[derive(Debug, Clone)]
pub enum DataSpec {
    /// Built-in synthetic images.
    Synthetic {
        train_size: usize,
        eval_size: usize,
        seed: u64,
    },
    /// CIFAR-10 binary files in a directory.
    Cifar10 { path: PathBuf },
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
}

impl TrainSpec {
    /// Samples per optimizer step: `batch_size × accum_steps`.
    pub fn effective_batch(&self) -> usize {
        self.batch_size * self.accum_steps
    }
}

/// Everything the trainer runs on.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the config came from (for reports).
    pub path: PathBuf,
    /// The config after overrides, as TOML: stored in checkpoints and summaries.
    pub toml: String,
    pub model: ModelSpec,
    pub input_size: usize,
    pub num_classes: usize,
    pub data: DataSpec,
    pub train: TrainSpec,
    pub precision: PrecisionSpec,
    pub backend: BackendKind,
    pub cuda_index: usize,
    pub memory: MemorySpec,
}

/// Reads `path`, applies `overrides` (`key=value`, value in TOML syntax or a bare string) and
/// validates the result.
pub fn load(path: &Path, overrides: &[String]) -> Result<Settings, ConfigError> {
    load_file_for(path, overrides, Purpose::Train)
}

/// Like [`load`], validated for `purpose`.
pub fn load_file_for(
    path: &Path,
    overrides: &[String],
    purpose: Purpose,
) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    load_for(&text, path, overrides, purpose)
}

/// Like [`load`], for config text already in memory; `path` names it in messages.
pub fn load_str(text: &str, path: &Path, overrides: &[String]) -> Result<Settings, ConfigError> {
    load_for(text, path, overrides, Purpose::Train)
}

/// What the settings will be used for: an estimate needs no data, so any class count goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Training: the model must fit the data sets (10 classes).
    Train,
    /// `trainer estimate`: only the model and the step matter.
    Estimate,
}

/// Like [`load_str`], validated for `purpose`.
pub fn load_for(
    text: &str,
    path: &Path,
    overrides: &[String],
    purpose: Purpose,
) -> Result<Settings, ConfigError> {
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                path: path.to_owned(),
                line: e
                    .span()
                    .map_or(1, |span| 1 + text[..span.start].matches('\n').count()),
                message: one_line(e.message()),
            })?;
    for arg in overrides {
        apply_override(&mut table, arg)?;
    }
    let raw: RawConfig =
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            ConfigError::Key {
                key: e.path().to_string(),
                message: strip_location(&one_line(&e.inner().to_string())),
            }
        })?;
    validate(path, raw, purpose)
}

/// toml ends value errors with " in `a.b`"; the key is already named in front.
fn strip_location(message: &str) -> String {
    match message.rfind(" in `") {
        Some(i) if message.ends_with('`') => message[..i].to_string(),
        _ => message.to_string(),
    }
}

fn one_line(s: &str) -> String {
    s.trim().replace('\n', " ")
}

/// Sets a dotted `key` in `table` to `value`, creating sections as needed.
fn apply_override(table: &mut toml::Table, arg: &str) -> Result<(), ConfigError> {
    let (key, value) = arg
        .split_once('=')
        .ok_or_else(|| ConfigError::SetSyntax(arg.into()))?;
    let key = key.trim();
    let value = value.trim();
    if key.is_empty() {
        return Err(ConfigError::SetSyntax(arg.into()));
    }
    // A value is TOML when it parses as one (`32`, `1e-3`, `"x"`, `true`), else a bare string.
    let value = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.into()));
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().unwrap_or(key);
    let mut node = table;
    for part in parts {
        let entry = node
            .entry(part)
            .or_insert_with(|| toml::Value::Table(Default::default()));
        node = entry.as_table_mut().ok_or_else(|| ConfigError::Key {
            key: part.into(),
            message: "is a value, not a section".into(),
        })?;
    }
    node.insert(leaf.into(), value);
    Ok(())
}

/// A [`ConfigError::Value`]: `key` has `value`, outside what `allowed` says.
pub fn out_of_range(key: &'static str, value: impl ToString, allowed: &str) -> ConfigError {
    ConfigError::Value {
        key,
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

fn validate(path: &Path, raw: RawConfig, purpose: Purpose) -> Result<Settings, ConfigError> {
    let toml = toml::to_string(&raw).unwrap_or_default();
    let m = &raw.model;
    if m.num_classes == 0 {
        return Err(out_of_range("model.num_classes", 0, "must be at least 1"));
    }
    let model = match m.name {
        ModelName::Simple => {
            for (key, set) in [
                ("model.width_multiplier", m.width_multiplier.is_some()),
                ("model.stem_stride", m.stem_stride.is_some()),
            ] {
                if set {
                    return Err(ConfigError::Key {
                        key: key.into(),
                        message: "applies only to model.name = \"mobilenet\"".into(),
                    });
                }
            }
            if m.input_size != burn_models::simple::SIMPLE_INPUT_SIZE {
                return Err(out_of_range(
                    "model.input_size",
                    m.input_size,
                    "SimpleModel takes 32×32 images: must be 32",
                ));
            }
            ModelSpec::Simple(SimpleModelConfig::new().with_num_classes(m.num_classes))
        }
        ModelName::Mobilenet => {
            let alpha = m.width_multiplier.unwrap_or(1.0);
            if !(alpha > 0.0 && alpha <= 4.0) {
                return Err(out_of_range(
                    "model.width_multiplier",
                    alpha,
                    "must be in (0, 4], e.g. 1.0, 0.75, 0.5, 0.25",
                ));
            }
            let stem_stride = m
                .stem_stride
                .unwrap_or(if m.input_size <= 64 { 1 } else { 2 });
            if !(1..=2).contains(&stem_stride) {
                return Err(out_of_range(
                    "model.stem_stride",
                    stem_stride,
                    "must be 1 or 2",
                ));
            }
            if m.input_size < 8 {
                return Err(out_of_range(
                    "model.input_size",
                    m.input_size,
                    "must be at least 8",
                ));
            }
            ModelSpec::MobileNet(
                MobileNetConfig::new()
                    .with_width_multiplier(alpha)
                    .with_input_size(m.input_size)
                    .with_num_classes(m.num_classes)
                    .with_stem_stride(stem_stride),
            )
        }
    };

    let d = &raw.data;
    let data = match d.source {
        DataSource::Synthetic => {
            if d.path.is_some() {
                return Err(ConfigError::Key {
                    key: "data.path".into(),
                    message: "applies only to data.source = \"cifar10\"".into(),
                });
            }
            if d.train_size == 0 {
                return Err(out_of_range("data.train_size", 0, "must be at least 1"));
            }
            if d.eval_size == 0 {
                return Err(out_of_range("data.eval_size", 0, "must be at least 1"));
            }
            DataSpec::Synthetic {
                train_size: d.train_size,
                eval_size: d.eval_size,
                seed: d.seed,
            }
        }
        DataSource::Cifar10 => {
            let Some(dir) = &d.path else {
                return Err(ConfigError::Key {
                    key: "data.path".into(),
                    message: "is required when data.source = \"cifar10\" (the folder holding data_batch_1.bin … test_batch.bin)".into(),
                });
            };
            if m.input_size != 32 {
                return Err(out_of_range(
                    "model.input_size",
                    m.input_size,
                    "CIFAR-10 images are 32×32: must be 32",
                ));
            }
            DataSpec::Cifar10 {
                path: PathBuf::from(dir),
            }
        }
    };
    if purpose == Purpose::Train && m.num_classes != crate::data::NUM_CLASSES {
        return Err(out_of_range(
            "model.num_classes",
            m.num_classes,
            "the data sets have 10 classes: must be 10",
        ));
    }

    let t = &raw.train;
    if t.batch_size == 0 {
        return Err(out_of_range("train.batch_size", 0, "must be at least 1"));
    }
    if t.epochs == 0 {
        return Err(out_of_range("train.epochs", 0, "must be at least 1"));
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
    if !(t.min_lr >= 0.0 && t.min_lr <= t.lr) {
        return Err(out_of_range(
            "train.min_lr",
            t.min_lr,
            "must be in [0, train.lr]",
        ));
    }
    if t.lr_schedule == ScheduleName::Constant && t.warmup_steps > 0 {
        return Err(ConfigError::Key {
            key: "train.warmup_steps".into(),
            message: "applies only to train.lr_schedule = \"warmup-cosine\"".into(),
        });
    }
    if let Some(c) = t.grad_clip_norm {
        if !(c > 0.0 && c.is_finite()) {
            return Err(out_of_range(
                "train.grad_clip_norm",
                c,
                "must be a finite number > 0 (or left out)",
            ));
        }
    }
    let precision = precision::validate(&raw.precision)?;
    let memory = memory::validate(&raw.memory)?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let output_dir = t
        .output_dir
        .clone()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("runs").join(stem));

    Ok(Settings {
        path: path.to_owned(),
        toml,
        model,
        input_size: m.input_size,
        num_classes: m.num_classes,
        data,
        train: TrainSpec {
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
        },
        precision,
        backend: raw.backend.kind,
        cuda_index: raw.backend.cuda_index,
        memory,
    })
}
