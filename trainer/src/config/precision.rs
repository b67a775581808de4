//! `[precision]`, validated: the mode, where batch norm computes, and the loss scaling.

use burn::tensor::DType;
use oomlab_engine::Precision;
use serde::{Deserialize, Serialize};

use super::{at_most, out_of_range, ConfigError};

/// The four training precisions a config can name (`precision.mode`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PrecisionMode {
    /// Everything in f32.
    #[default]
    #[serde(rename = "f32")]
    F32,
    /// f32 master weights; layers compute and save activations in f16.
    #[serde(rename = "f16-mixed")]
    F16Mixed,
    /// f32 master weights; layers compute and save activations in bf16.
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
    /// Parameters, gradients and optimizer state in f16, no master weights (teaching mode).
    #[serde(rename = "f16")]
    F16,
}

impl PrecisionMode {
    /// Every mode, in the order configs list them.
    pub const ALL: [Self; 4] = [Self::F32, Self::F16Mixed, Self::Bf16Mixed, Self::F16];

    /// The spelling configs use: `f32`, `f16-mixed`, `bf16-mixed`, `f16`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16Mixed => "f16-mixed",
            Self::Bf16Mixed => "bf16-mixed",
            Self::F16 => "f16",
        }
    }

    /// The half type layers compute in, or `None` for f32.
    pub fn half(self) -> Option<DType> {
        match self {
            Self::F32 => None,
            Self::F16Mixed | Self::F16 => Some(DType::F16),
            Self::Bf16Mixed => Some(DType::BF16),
        }
    }

    /// Whether f32 master weights are kept (every mode but pure f16).
    pub fn master_weights(self) -> bool {
        self != Self::F16
    }

    /// dtype the parameters (and so gradients and optimizer state) are stored in.
    pub fn parameter_dtype(self) -> DType {
        match self {
            Self::F16 => DType::F16,
            _ => DType::F32,
        }
    }

    /// The layer policy the models receive: compute in the half type, batch norm in f32 when
    /// `batch_norm_f32`, the loss in f32.
    pub fn policy(self, batch_norm_f32: bool) -> Precision {
        match self.half() {
            None => Precision::F32,
            Some(half) => Precision::mixed(half, batch_norm_f32),
        }
    }
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
    pub mode: PrecisionMode,
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
            mode: PrecisionMode::F32,
            batch_norm_f32: true,
            loss_scale: None,
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// How the loss is scaled before backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScaleSpec {
    /// No scaling (f32, bf16).
    Off,
    /// A constant scale; a step whose gradients overflow is still skipped.
    Fixed(f64),
    /// GradScaler-style dynamic scaling.
    Dynamic {
        init_scale: f64,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: usize,
    },
}

impl LossScaleSpec {
    /// Which kind of scaling this is.
    pub fn kind(&self) -> LossScaleKind {
        match self {
            Self::Off => LossScaleKind::Off,
            Self::Fixed(_) => LossScaleKind::Fixed,
            Self::Dynamic { .. } => LossScaleKind::Dynamic,
        }
    }

    /// `off`, `fixed` or `dynamic`, for reports.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// A [`LossScaleSpec`] without its numbers: what reports say the scaling was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossScaleKind {
    /// No scaling.
    Off,
    /// A constant scale.
    Fixed,
    /// GradScaler-style dynamic scaling.
    Dynamic,
}

impl LossScaleKind {
    /// Every kind.
    pub const ALL: [Self; 3] = [Self::Off, Self::Fixed, Self::Dynamic];

    /// `off`, `fixed` or `dynamic`, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Fixed => "fixed",
            Self::Dynamic => "dynamic",
        }
    }
}

/// The smallest loss scale: 2⁻²⁴, f16's smallest subnormal.
pub const MIN_SCALE: f64 = 1.0 / 16_777_216.0;
/// The largest loss scale: 2⁴⁰. A loss of 10 times more than 2⁴⁰ is still far inside f32
/// (3.4e38); 1e40 itself is infinite in f32.
pub const MAX_SCALE: f64 = 1_099_511_627_776.0;
/// The smallest scale a config may ask for: a scale below 1 shrinks the very gradients f16
/// cannot hold, flushing them to zero, and the run would train on nothing. Only the dynamic
/// scaler's back-off goes lower (to [`MIN_SCALE`]), and only after an overflow at a scale ≥ 1.
pub const MIN_CONFIG_SCALE: f64 = 1.0;
const SCALE_RANGE: &str = "must be in [1, 2^40] (1 … 1.10e12): a larger scale overflows the \
                           scaled loss, a smaller one shrinks f16 gradients to zero";

/// `[precision]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct PrecisionSpec {
    pub mode: PrecisionMode,
    pub batch_norm_f32: bool,
    pub loss_scale: LossScaleSpec,
    /// Set when the config asked for loss scaling in f32, where it is turned off.
    pub note: Option<String>,
}

impl PrecisionSpec {
    /// The layer policy the models receive.
    pub fn policy(&self) -> Precision {
        self.mode.policy(self.batch_norm_f32)
    }
}

pub(super) fn validate(p: &RawPrecision) -> Result<PrecisionSpec, ConfigError> {
    let mode = p.mode;
    let positive = |key: &'static str, v: f64| {
        if !(v > 0.0 && v.is_finite()) {
            Err(out_of_range(key, v, "must be a finite number > 0"))
        } else if !(MIN_CONFIG_SCALE..=MAX_SCALE).contains(&v) {
            Err(out_of_range(key, v, SCALE_RANGE))
        } else {
            Ok(v)
        }
    };
    let init_scale = positive("precision.init_scale", p.init_scale)?;
    if !(p.growth_factor > 1.0 && p.growth_factor.is_finite()) {
        return Err(out_of_range(
            "precision.growth_factor",
            p.growth_factor,
            "must be a finite number > 1",
        ));
    }
    if p.growth_factor > 1024.0 {
        return Err(out_of_range(
            "precision.growth_factor",
            p.growth_factor,
            "must be at most 1024",
        ));
    }
    if !(p.backoff_factor > 0.0 && p.backoff_factor < 1.0) {
        return Err(out_of_range(
            "precision.backoff_factor",
            p.backoff_factor,
            "must be in (0, 1)",
        ));
    }
    if p.growth_interval == 0 {
        return Err(out_of_range(
            "precision.growth_interval",
            0,
            "must be at least 1",
        ));
    }
    at_most(
        "precision.growth_interval",
        p.growth_interval,
        1_000_000_000,
    )?;
    let dynamic = LossScaleSpec::Dynamic {
        init_scale,
        growth_factor: p.growth_factor,
        backoff_factor: p.backoff_factor,
        growth_interval: p.growth_interval,
    };
    let requested = match &p.loss_scale {
        None => None,
        Some(RawLossScale::Named(name)) if name == "dynamic" => Some(dynamic),
        Some(RawLossScale::Named(name)) if name == "off" => Some(LossScaleSpec::Off),
        Some(RawLossScale::Named(name)) => {
            return Err(out_of_range(
                "precision.loss_scale",
                format!("{name:?}"),
                "must be \"dynamic\", \"off\" or a number > 0",
            ))
        }
        Some(RawLossScale::Fixed(v)) => {
            Some(LossScaleSpec::Fixed(positive("precision.loss_scale", *v)?))
        }
    };
    let default = match mode {
        PrecisionMode::F16Mixed | PrecisionMode::F16 => dynamic,
        PrecisionMode::F32 | PrecisionMode::Bf16Mixed => LossScaleSpec::Off,
    };
    let (loss_scale, note) = match (mode, requested) {
        (PrecisionMode::F32, Some(r)) if r != LossScaleSpec::Off => (
            LossScaleSpec::Off,
            Some(format!(
                "precision.loss_scale = {} has no effect with precision.mode = \"f32\": \
                 f32 gradients do not underflow, so loss scaling is off",
                match r {
                    LossScaleSpec::Fixed(v) => v.to_string(),
                    _ => format!("{:?}", r.name()),
                }
            )),
        ),
        (_, r) => (r.unwrap_or(default), None),
    };
    Ok(PrecisionSpec {
        mode,
        batch_norm_f32: p.batch_norm_f32,
        loss_scale,
        note,
    })
}

/// The error for a half type the chosen backend cannot compute in.
pub fn unsupported_dtype(mode: PrecisionMode, backend: &str) -> ConfigError {
    // Where bf16 is missing, f16 may still be there.
    let (dtype, instead) = match mode.half() {
        Some(DType::BF16) => ("bf16", " or \"f16-mixed\""),
        _ => ("f16", ""),
    };
    ConfigError::Value {
        key: "precision.mode",
        value: format!("{:?}", mode.name()),
        allowed: format!(
            "the {backend} backend does not support {dtype} arithmetic on this device; \
             use \"f32\"{instead}"
        ),
    }
}
