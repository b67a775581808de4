//! `[model]`: which network; a CNN's width, input size and classes, or a GPT's sizes.

use burn_models::gpt::{Attention, GptConfig, GptError};
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
    /// A GPT-2-style language model.
    Gpt,
}

/// `model.attention` for GPT.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionName {
    /// Composed from tensor ops: keeps the `batch × heads × seq × seq` probabilities.
    #[default]
    Naive,
    /// oomlab's memory-efficient op: keeps the output and one log-sum-exp per row.
    MemoryEfficient,
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
    /// CNNs only (default 10).
    pub num_classes: Option<usize>,
    /// CNNs only (default 32).
    pub input_size: Option<usize>,
    pub width_multiplier: Option<f64>,
    pub stem_stride: Option<usize>,
    /// ResNet only: 18, 34 or 50.
    pub depth: Option<usize>,
    /// ResNet only: `cifar` or `imagenet`.
    pub stem: Option<StemName>,
    /// GPT only: transformer blocks (default 4).
    pub n_layer: Option<usize>,
    /// GPT only: attention heads (default 4).
    pub n_head: Option<usize>,
    /// GPT only: the residual stream's width (default 128).
    pub d_model: Option<usize>,
    /// GPT only: tokens per sequence (default 64).
    pub seq_len: Option<usize>,
    /// GPT only: the vocabulary (default 256, the byte-level tokens).
    pub vocab_size: Option<usize>,
    /// GPT only.
    pub attention: Option<AttentionName>,
    /// GPT only: must be 0 (the model has no dropout).
    pub dropout: Option<f64>,
}

impl Default for RawModel {
    fn default() -> Self {
        Self {
            name: ModelName::Simple,
            num_classes: None,
            input_size: None,
            width_multiplier: None,
            stem_stride: None,
            depth: None,
            stem: None,
            n_layer: None,
            n_head: None,
            d_model: None,
            seq_len: None,
            vocab_size: None,
            attention: None,
            dropout: None,
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
    /// A GPT-2-style language model.
    Gpt(GptConfig),
}

/// A CNN's default input size and classes (the data sets' 32×32 images, ten classes).
pub const DEFAULT_INPUT_SIZE: usize = 32;
/// See [`DEFAULT_INPUT_SIZE`].
pub const DEFAULT_CLASSES: usize = 10;

impl ModelSpec {
    /// The forward pass as the memory estimate reads it (the model's own plan).
    pub fn plan(&self) -> oomlab_engine::Plan {
        match self {
            Self::Simple(c) => c.plan(),
            Self::MobileNet(c) => c.plan(),
            Self::ResNet(c) => c.plan(),
            Self::Gpt(c) => c.plan(),
        }
    }

    /// Classes each prediction chooses among: a CNN's classes, a GPT's vocabulary.
    pub fn classes(&self) -> usize {
        match self {
            Self::Simple(c) => c.num_classes,
            Self::MobileNet(c) => c.num_classes,
            Self::ResNet(c) => c.num_classes,
            Self::Gpt(c) => c.vocab_size,
        }
    }

    /// Predictions per sample: one per image, one per token of a sequence.
    pub fn predictions_per_sample(&self) -> usize {
        self.tokens_per_sample().unwrap_or(1)
    }

    /// A language model's tokens per sample (its sequence length); `None` for a CNN.
    pub fn tokens_per_sample(&self) -> Option<usize> {
        match self {
            Self::Gpt(c) => Some(c.seq_len),
            _ => None,
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
            Self::Gpt(c) => format!(
                "gpt({} layers, {} heads, d={}, seq={}, {} attention)",
                c.n_layer,
                c.n_head,
                c.d_model,
                c.seq_len,
                match c.attention {
                    Attention::Naive => "naive",
                    Attention::MemoryEfficient => "memory-efficient",
                }
            ),
        }
    }

    /// The same model with its blocks fused (`memory.fuse = "blocks"`) or not.
    pub fn fused(self, fuse: bool) -> Self {
        match self {
            Self::Simple(c) => Self::Simple(c.with_fuse(fuse)),
            Self::MobileNet(c) => Self::MobileNet(c.with_fuse(fuse)),
            Self::ResNet(c) => Self::ResNet(c.with_fuse(fuse)),
            // The config check refuses fused blocks for a GPT: it has none.
            Self::Gpt(c) => Self::Gpt(c),
        }
    }

    /// The same model with whole-block checkpointing (`memory.checkpointing = "blocks"`; the
    /// config check allows it for a GPT only).
    pub fn checkpoint_blocks(self, on: bool) -> Self {
        match self {
            Self::Gpt(c) => Self::Gpt(GptConfig {
                checkpoint_blocks: on,
                ..c
            }),
            other => other,
        }
    }

    /// Whether the blocks run as fused ops.
    pub fn is_fused(&self) -> bool {
        match self {
            Self::Simple(c) => c.fuse,
            Self::MobileNet(c) => c.fuse,
            Self::ResNet(c) => c.fuse,
            Self::Gpt(_) => false,
        }
    }
}

/// Checks `[model]` and builds the model's config.
pub fn validate(m: &RawModel) -> Result<ModelSpec, ConfigError> {
    if m.name == ModelName::Gpt {
        return gpt(m);
    }
    let gpt_keys = [
        ("model.n_layer", m.n_layer.is_some()),
        ("model.n_head", m.n_head.is_some()),
        ("model.d_model", m.d_model.is_some()),
        ("model.seq_len", m.seq_len.is_some()),
        ("model.vocab_size", m.vocab_size.is_some()),
        ("model.attention", m.attention.is_some()),
        ("model.dropout", m.dropout.is_some()),
    ];
    not_set(&gpt_keys, "only to model.name = \"gpt\"")?;
    let num_classes = m.num_classes.unwrap_or(DEFAULT_CLASSES);
    let input_size = m.input_size.unwrap_or(DEFAULT_INPUT_SIZE);
    if num_classes == 0 {
        return Err(out_of_range("model.num_classes", 0, "must be at least 1"));
    }
    at_most("model.num_classes", num_classes, MAX_CLASSES)?;
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
            if input_size != burn_models::simple::SIMPLE_INPUT_SIZE {
                return Err(out_of_range(
                    "model.input_size",
                    input_size,
                    "SimpleModel takes 32×32 images: must be 32",
                ));
            }
            ModelSpec::Simple(SimpleModelConfig::new().with_num_classes(num_classes))
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
                .unwrap_or(if input_size <= 64 { 1 } else { 2 });
            let config = MobileNetConfig::new()
                .with_width_multiplier(m.width_multiplier.unwrap_or(1.0))
                .with_input_size(input_size)
                .with_num_classes(num_classes)
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
            let stem = match m.stem.unwrap_or(if input_size <= 64 {
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
                .with_input_size(input_size)
                .with_num_classes(num_classes);
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
        ModelName::Gpt => unreachable!("handled above"),
    };
    Ok(model)
}

/// GPT's defaults: a small character-level model (nanoGPT's "shakespeare-char" is 6 × 6 × 384
/// at 256 tokens) that trains on a CPU in minutes.
pub const GPT_DEFAULT: GptConfig = GptConfig {
    n_layer: 4,
    n_head: 4,
    d_model: 128,
    seq_len: 64,
    vocab_size: crate::data::text::VOCAB,
    attention: Attention::Naive,
    checkpoint_blocks: false,
};

/// Checks a GPT's `[model]` keys.
fn gpt(m: &RawModel) -> Result<ModelSpec, ConfigError> {
    not_set(
        &[
            ("model.num_classes", m.num_classes.is_some()),
            ("model.input_size", m.input_size.is_some()),
            ("model.width_multiplier", m.width_multiplier.is_some()),
            ("model.stem_stride", m.stem_stride.is_some()),
            ("model.depth", m.depth.is_some()),
            ("model.stem", m.stem.is_some()),
        ],
        "only to the CNNs (model.name = \"simple\", \"mobilenet\" or \"resnet\")",
    )?;
    if let Some(p) = m.dropout.filter(|&p| p != 0.0) {
        return Err(out_of_range(
            "model.dropout",
            p,
            "must be 0: oomlab's GPT has no dropout (its memory figures are without it)",
        ));
    }
    let d = GPT_DEFAULT;
    let config = GptConfig {
        n_layer: m.n_layer.unwrap_or(d.n_layer),
        n_head: m.n_head.unwrap_or(d.n_head),
        d_model: m.d_model.unwrap_or(d.d_model),
        seq_len: m.seq_len.unwrap_or(d.seq_len),
        vocab_size: m.vocab_size.unwrap_or(d.vocab_size),
        attention: match m.attention.unwrap_or_default() {
            AttentionName::Naive => Attention::Naive,
            AttentionName::MemoryEfficient => Attention::MemoryEfficient,
        },
        checkpoint_blocks: false,
    };
    // The model owns its bounds; this only names the config key for each.
    config.validate().map_err(|e| {
        let bound = |key, v, max| out_of_range(key, v, &format!("must be in 1..={max}"));
        match e {
            GptError::Layers(n) => bound("model.n_layer", n, burn_models::gpt::MAX_LAYERS),
            GptError::Heads(n) => bound("model.n_head", n, burn_models::gpt::MAX_HEADS),
            GptError::DModel(n) => bound("model.d_model", n, burn_models::gpt::MAX_D_MODEL),
            GptError::SeqLen(n) => bound("model.seq_len", n, burn_models::gpt::MAX_SEQ_LEN),
            GptError::Vocab(n) => bound("model.vocab_size", n, burn_models::gpt::MAX_VOCAB),
            GptError::Indivisible { d_model, n_head } => out_of_range(
                "model.d_model",
                d_model,
                &format!("must be divisible by model.n_head ({n_head})"),
            ),
        }
    })?;
    Ok(ModelSpec::Gpt(config))
}
