//! The TOML file as written: plain serde structs, every key optional with its default.
//! `validate` (in the parent module) turns these into the settings the trainer runs on.

use serde::{Deserialize, Serialize};

/// A whole config file.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    /// `[model]`
    pub model: RawModel,
    /// `[data]`
    pub data: RawData,
    /// `[train]`
    pub train: RawTrain,
    /// `[precision]`
    pub precision: RawPrecision,
    /// `[backend]`
    pub backend: RawBackend,
    /// `[memory]`
    pub memory: super::memory::RawMemory,
}

/// Which network to build.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelName {
    /// The seed article's SimpleModel.
    #[default]
    Simple,
    /// MobileNetV1.
    Mobilenet,
}

/// `[model]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawModel {
    pub name: ModelName,
    pub num_classes: usize,
    pub input_size: usize,
    pub width_multiplier: Option<f64>,
    pub stem_stride: Option<usize>,
}

impl Default for RawModel {
    fn default() -> Self {
        Self {
            name: ModelName::Simple,
            num_classes: 10,
            input_size: 32,
            width_multiplier: None,
            stem_stride: None,
        }
    }
}

/// Where the images come from.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    /// Built-in procedurally generated images: nothing to download.
    #[default]
    Synthetic,
    /// The CIFAR-10 binary version in `data.path`.
    Cifar10,
}

/// `[data]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawData {
    pub source: DataSource,
    pub path: Option<String>,
    pub train_size: usize,
    pub eval_size: usize,
    pub seed: u64,
}

impl Default for RawData {
    fn default() -> Self {
        Self {
            source: DataSource::Synthetic,
            path: None,
            train_size: 8192,
            eval_size: 2048,
            seed: 0,
        }
    }
}

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
        }
    }
}

/// Which device runs the job.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA when a device initialises, else the CPU.
    #[default]
    Auto,
    /// NVIDIA GPU through burn-cuda; an error when none is usable.
    Cuda,
    /// The CPU through Burn's Flex backend.
    Cpu,
}

impl BackendKind {
    /// The spelling of `backend.kind` and `--backend`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cuda => "cuda",
            Self::Cpu => "cpu",
        }
    }
}

/// `[backend]`
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawBackend {
    pub kind: BackendKind,
    pub cuda_index: usize,
}

/// `precision.mode` as written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModeName {
    /// Everything in f32.
    #[default]
    #[serde(rename = "f32")]
    F32,
    /// f16 compute, f32 master weights.
    #[serde(rename = "f16-mixed")]
    F16Mixed,
    /// bf16 compute, f32 master weights.
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
    /// Everything in f16.
    #[serde(rename = "f16")]
    F16,
}

/// `precision.loss_scale` as written: `"dynamic"`, `"off"` or a number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RawLossScale {
    /// A fixed scale.
    Fixed(f64),
    /// `"dynamic"` or `"off"`.
    Named(String),
}

/// `[precision]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawPrecision {
    pub mode: ModeName,
    pub batch_norm_f32: bool,
    pub loss_scale: Option<RawLossScale>,
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: usize,
}

impl Default for RawPrecision {
    /// PyTorch GradScaler's defaults.
    fn default() -> Self {
        Self {
            mode: ModeName::F32,
            batch_norm_f32: true,
            loss_scale: None,
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}
