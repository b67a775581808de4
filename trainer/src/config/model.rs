//! `[model]`: which network, its width, input size and classes.

use burn_models::mobilenet::{MAX_CLASSES, MAX_INPUT_SIZE, MIN_INPUT_SIZE};
use burn_models::{
    MobileNetConfig, MobileNetError, ResNetConfig, ResNetError, SimpleModelConfig, Stem,
};
use serde::{Deserialize, Serialize};

use super::{at_most, not_set, out_of_range, ConfigError};

/// Which network to build.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelName {
    /// The seed article's SimpleModel.
    #[default]
    Simple,
    /// MobileNetV1.
    Mobilenet,
    /// ResNet-18, 34 or 50 (torchvision's layout).
    Resnet,
}

/// `model.stem` for ResNet: CIFAR's 3×3 conv, or ImageNet's 7×7/2 conv and 3×3/2 max-pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StemName {
    /// 3×3 conv, stride 1, no max-pool.
    Cifar,
    /// 7×7 conv, stride 2, then a 3×3 max-pool with stride 2.
    Imagenet,
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
    /// ResNet only: 18, 34 or 50.
    pub depth: Option<usize>,
    /// ResNet only: `cifar` or `imagenet`.
    pub stem: Option<StemName>,
}

impl Default for RawModel {
    fn default() -> Self {
        Self {
            name: ModelName::Simple,
            num_classes: 10,
            input_size: 32,
            width_multiplier: None,
            stem_stride: None,
            depth: None,
            stem: None,
        }
    }
}

/// The model to build, validated.
#[derive(Debug, Clone)]
pub enum ModelSpec {
    /// The seed article's SimpleModel.
    Simple(SimpleModelConfig),
    /// MobileNetV1.
    MobileNet(MobileNetConfig),
    /// ResNet.
    ResNet(ResNetConfig),
}

impl ModelSpec {
    /// The forward pass as the memory estimate reads it (the model's own plan).
    pub fn plan(&self) -> oomlab_engine::Plan {
        match self {
            Self::Simple(c) => c.plan(),
            Self::MobileNet(c) => c.plan(),
            Self::ResNet(c) => c.plan(),
        }
    }

    /// Short name used in reports.
    pub fn name(&self) -> String {
        match self {
            Self::Simple(_) => "simple".into(),
            Self::MobileNet(c) => format!("mobilenet(α={})", c.width_multiplier),
            Self::ResNet(c) => format!(
                "resnet{}({}, α={})",
                c.depth,
                c.stem.name(),
                c.width_multiplier
            ),
        }
    }

    /// The same model with its blocks fused (`memory.fuse = "blocks"`) or not.
    pub fn fused(self, fuse: bool) -> Self {
        match self {
            Self::Simple(c) => Self::Simple(c.with_fuse(fuse)),
            Self::MobileNet(c) => Self::MobileNet(c.with_fuse(fuse)),
            Self::ResNet(c) => Self::ResNet(c.with_fuse(fuse)),
        }
    }

    /// Whether the blocks run as fused ops.
    pub fn is_fused(&self) -> bool {
        match self {
            Self::Simple(c) => c.fuse,
            Self::MobileNet(c) => c.fuse,
            Self::ResNet(c) => c.fuse,
        }
    }
}

/// Checks `[model]` and builds the model's config.
pub fn validate(m: &RawModel) -> Result<ModelSpec, ConfigError> {
    if m.num_classes == 0 {
        return Err(out_of_range("model.num_classes", 0, "must be at least 1"));
    }
    at_most("model.num_classes", m.num_classes, MAX_CLASSES)?;
    let model = match m.name {
        ModelName::Simple => {
            not_set(
                &[("model.width_multiplier", m.width_multiplier.is_some())],
                "only to model.name = \"mobilenet\" or \"resnet\"",
            )?;
            not_set(
                &[("model.stem_stride", m.stem_stride.is_some())],
                "only to model.name = \"mobilenet\"",
            )?;
            not_set(
                &[
                    ("model.depth", m.depth.is_some()),
                    ("model.stem", m.stem.is_some()),
                ],
                "only to model.name = \"resnet\"",
            )?;
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
            not_set(
                &[
                    ("model.depth", m.depth.is_some()),
                    ("model.stem", m.stem.is_some()),
                ],
                "only to model.name = \"resnet\"",
            )?;
            let stem_stride = m
                .stem_stride
                .unwrap_or(if m.input_size <= 64 { 1 } else { 2 });
            let config = MobileNetConfig::new()
                .with_width_multiplier(m.width_multiplier.unwrap_or(1.0))
                .with_input_size(m.input_size)
                .with_num_classes(m.num_classes)
                .with_stem_stride(stem_stride);
            // The model owns its bounds; this only names the config key for each.
            config.validate().map_err(|e| match e {
                MobileNetError::WidthMultiplier(a) => out_of_range(
                    "model.width_multiplier",
                    a,
                    "must be in (0, 4], e.g. 1.0, 0.75, 0.5, 0.25",
                ),
                MobileNetError::StemStride(s) => {
                    out_of_range("model.stem_stride", s, "must be 1 or 2")
                }
                MobileNetError::InputSize(n) if n < MIN_INPUT_SIZE => out_of_range(
                    "model.input_size",
                    n,
                    &format!("must be at least {MIN_INPUT_SIZE}"),
                ),
                MobileNetError::InputSize(n) => out_of_range(
                    "model.input_size",
                    n,
                    &format!("must be at most {MAX_INPUT_SIZE}"),
                ),
                MobileNetError::Classes(n) => out_of_range(
                    "model.num_classes",
                    n,
                    &format!("must be in 1..={MAX_CLASSES}"),
                ),
            })?;
            ModelSpec::MobileNet(config)
        }
        ModelName::Resnet => {
            not_set(
                &[("model.stem_stride", m.stem_stride.is_some())],
                "only to model.name = \"mobilenet\" (ResNet's stem is model.stem)",
            )?;
            let stem = match m.stem.unwrap_or(if m.input_size <= 64 {
                StemName::Cifar
            } else {
                StemName::Imagenet
            }) {
                StemName::Cifar => Stem::Cifar,
                StemName::Imagenet => Stem::Imagenet,
            };
            let config = ResNetConfig::new()
                .with_depth(m.depth.unwrap_or(18))
                .with_stem(stem)
                .with_width_multiplier(m.width_multiplier.unwrap_or(1.0))
                .with_input_size(m.input_size)
                .with_num_classes(m.num_classes);
            // The model owns its bounds; this only names the config key for each.
            config.validate().map_err(|e| match e {
                ResNetError::Depth(d) => out_of_range("model.depth", d, "must be 18, 34 or 50"),
                ResNetError::WidthMultiplier(a) => out_of_range(
                    "model.width_multiplier",
                    a,
                    "must be in (0, 4], e.g. 1.0, 0.5, 0.25",
                ),
                ResNetError::InputSize { size, stem } => out_of_range(
                    "model.input_size",
                    size,
                    &format!(
                        "must be in {}..={} with model.stem = \"{}\"",
                        stem.min_input_size(),
                        burn_models::resnet::MAX_INPUT_SIZE,
                        stem.name()
                    ),
                ),
                ResNetError::Classes(n) => out_of_range(
                    "model.num_classes",
                    n,
                    &format!("must be in 1..={MAX_CLASSES}"),
                ),
            })?;
            ModelSpec::ResNet(config)
        }
    };
    Ok(model)
}
