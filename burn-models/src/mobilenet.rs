//! MobileNetV1 — Howard et al. 2017, "MobileNets: Efficient Convolutional Neural Networks for
//! Mobile Vision Applications", <https://arxiv.org/abs/1704.04861>, Table 1.
//!
//! ```text
//! stem: Conv 3×3 (32·α, stride s) + BN + ReLU
//! 13 × depthwise-separable block:  Conv dw 3×3 + BN + ReLU → Conv 1×1 + BN + ReLU
//! global average pool → Linear (1024·α → classes)
//! ```
//! Convolutions carry no bias: the batch norm after each one has its own shift. With `fuse`,
//! each conv + BN + ReLU is one op ([`conv_bn_relu`](oomlab_engine::conv_bn_relu)) that keeps two
//! tensors for backward instead of three.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

use oomlab_engine::{mark, Boundary, Layer, ModelBackend, Plan, RunContext};

use crate::layers::{self, ConvBn};

/// The 13 depthwise-separable blocks of Table 1: `(out_channels at α = 1, stride)`.
pub const BLOCKS: [(usize, usize); 13] = [
    (64, 1),
    (128, 2),
    (128, 1),
    (256, 2),
    (256, 1),
    (512, 2),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (1024, 2),
    (1024, 1),
];

/// Smallest input side accepted: five stride-2 stages shrink an 8×8 input to 1×1 by block 12
/// (with a stride-1 stem); anything smaller is padding for most of the network.
pub const MIN_INPUT_SIZE: usize = 8;

/// Largest input side accepted: 2048² is 16× ImageNet's 224² per image already; the bound
/// keeps every size computed from it far inside `usize`.
pub const MAX_INPUT_SIZE: usize = 2048;

/// Most classes accepted (ImageNet-21k has 21,841).
pub const MAX_CLASSES: usize = 100_000;

/// Stem output channels at α = 1.
pub const STEM_CHANNELS: usize = 32;

/// A configuration that cannot build a MobileNet.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MobileNetError {
    /// α outside (0, 4].
    #[error("width_multiplier must be in (0, 4], got {0}")]
    WidthMultiplier(f64),
    /// Stem stride other than 1 or 2.
    #[error("stem_stride must be 1 or 2, got {0}")]
    StemStride(usize),
    /// Input outside [`MIN_INPUT_SIZE`]..=[`MAX_INPUT_SIZE`].
    #[error("input_size must be in {MIN_INPUT_SIZE}..={MAX_INPUT_SIZE}, got {0}")]
    InputSize(usize),
    /// Classes outside 1..=[`MAX_CLASSES`].
    #[error("num_classes must be in 1..={MAX_CLASSES}, got {0}")]
    Classes(usize),
}

/// Configuration of [`MobileNet`]. Defaults are the paper's ImageNet model.
#[derive(Config, Debug)]
pub struct MobileNetConfig {
    /// Width multiplier α: every layer's channels are `int(c · α)`.
    #[config(default = 1.0)]
    pub width_multiplier: f64,
    /// Side length of the square input images.
    #[config(default = 224)]
    pub input_size: usize,
    /// Output classes.
    #[config(default = 1000)]
    pub num_classes: usize,
    /// Stride of the stem conv: 2 as in the paper, 1 keeps resolution for 32×32 inputs.
    #[config(default = 2)]
    pub stem_stride: usize,
    /// Every conv → BN → ReLU as one op ([`conv_bn_relu`](oomlab_engine::conv_bn_relu)), and the
    /// classifier as [`sliced_linear`](oomlab_engine::sliced_linear); same function, same gradients,
    /// less kept for backward.
    #[config(default = false)]
    pub fuse: bool,
}

impl MobileNetConfig {
    /// The CIFAR preset: 32×32 input, 10 classes, stem stride 1.
    pub fn cifar() -> Self {
        Self::new()
            .with_input_size(32)
            .with_num_classes(10)
            .with_stem_stride(1)
    }

    /// Checks the configuration without building anything.
    pub fn validate(&self) -> Result<(), MobileNetError> {
        let a = self.width_multiplier;
        if !(a > 0.0 && a <= 4.0) {
            return Err(MobileNetError::WidthMultiplier(a));
        }
        if !(1..=2).contains(&self.stem_stride) {
            return Err(MobileNetError::StemStride(self.stem_stride));
        }
        if !(MIN_INPUT_SIZE..=MAX_INPUT_SIZE).contains(&self.input_size) {
            return Err(MobileNetError::InputSize(self.input_size));
        }
        if !(1..=MAX_CLASSES).contains(&self.num_classes) {
            return Err(MobileNetError::Classes(self.num_classes));
        }
        Ok(())
    }

    /// Channels of a layer with `base` channels at α = 1 (Keras' `int(c · α)`, at least 1).
    pub fn channels(&self, base: usize) -> usize {
        ((base as f64 * self.width_multiplier) as usize).max(1)
    }

    /// The forward pass as the memory estimate reads it: the ops `init` builds from
    /// [`BLOCKS`] and `forward` runs, with their per-image sizes.
    pub fn plan(&self) -> Plan {
        let mut plan = Plan::default();
        let what = match self.fuse {
            true => "fused conv+BN+ReLU: conv, BN inputs",
            false => "conv, BN, ReLU inputs",
        };
        // conv keeps its input, BN its input (the conv output), ReLU its input (BN's); fused,
        // one op keeps the first two and recomputes the third in backward.
        let fuse = self.fuse;
        let block = |plan: &mut Plan, group: String, sizes: [u64; 4]| {
            layers::plan_conv_bn(plan, &group, sizes, fuse, true)
        };
        let s = self.input_size as u64;
        let mut side = s.div_ceil(self.stem_stride as u64);
        let mut c_in = self.channels(STEM_CHANNELS) as u64;
        let stem = [3 * s * s, c_in * side * side, 3 * c_in * 9, c_in];
        block(&mut plan, format!("stem: {what}"), stem);
        for (i, &(base, stride)) in BLOCKS.iter().enumerate() {
            let c_out = self.channels(base) as u64;
            let input = c_in * side * side;
            side = side.div_ceil(stride as u64);
            let dw = c_in * side * side;
            let group = format!("block {:>2} depthwise: {what}", i + 1);
            block(&mut plan, group, [input, dw, c_in * 9, c_in]);
            let group = format!("block {:>2} pointwise: {what}", i + 1);
            block(
                &mut plan,
                group,
                [dw, c_out * side * side, c_in * c_out, c_out],
            );
            c_in = c_out;
        }
        let last = c_in * side * side;
        let pool = Layer::GlobalPool {
            input: last,
            channels: c_in,
        };
        plan.push("global pool (keeps its input)", pool);
        let fc = Layer::classifier(c_in, self.num_classes as u64, self.fuse);
        plan.push("linear (keeps its input)", fc);
        plan
    }

    /// Builds the model on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<MobileNet<B>, MobileNetError> {
        self.validate()?;
        let stem_out = self.channels(STEM_CHANNELS);
        let stem = ConvBn::new(3, stem_out, 3, self.stem_stride, 1, device).fused(self.fuse);
        let mut c_in = stem_out;
        let blocks = BLOCKS
            .iter()
            .map(|&(base, stride)| {
                let c_out = self.channels(base);
                let block = DepthwiseSeparable::new(c_in, c_out, stride, device, self.fuse);
                c_in = c_out;
                block
            })
            .collect();
        Ok(MobileNet {
            stem,
            blocks,
            fc: LinearConfig::new(c_in, self.num_classes).init(device),
            fuse: self.fuse,
        })
    }
}

/// Depthwise 3×3 conv + BN + ReLU, then pointwise 1×1 conv + BN + ReLU.
#[derive(Module, Debug)]
pub struct DepthwiseSeparable<B: Backend> {
    depthwise: ConvBn<B>,
    pointwise: ConvBn<B>,
}

impl<B: Backend> DepthwiseSeparable<B> {
    fn new(c_in: usize, c_out: usize, stride: usize, device: &B::Device, fuse: bool) -> Self {
        Self {
            depthwise: ConvBn::new(c_in, c_in, 3, stride, c_in, device).fused(fuse),
            pointwise: ConvBn::new(c_in, c_out, 1, 1, 1, device).fused(fuse),
        }
    }
}

impl<B: ModelBackend> DepthwiseSeparable<B> {
    /// # Shapes
    /// `[batch, c_in, h, w]` → `[batch, c_out, h / stride, w / stride]`
    pub fn forward(&self, x: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        let x = self.depthwise.forward(x, cx); // [B, c_in, h/s, w/s]
        self.pointwise.forward(x, cx) // [B, c_out, h/s, w/s]
    }
}

/// Boundary names of the 13 blocks, for memory timelines.
const BLOCK_NAMES: [&str; BLOCKS.len()] = [
    "block1", "block2", "block3", "block4", "block5", "block6", "block7", "block8", "block9",
    "block10", "block11", "block12", "block13",
];

/// MobileNetV1: stem, 13 depthwise-separable blocks, global average pool, classifier.
#[derive(Module, Debug)]
pub struct MobileNet<B: Backend> {
    stem: ConvBn<B>,
    blocks: Vec<DepthwiseSeparable<B>>,
    fc: Linear<B>,
    fuse: bool,
}

impl<B: Backend> MobileNet<B> {
    /// Trainable parameters, as the paper and PyTorch's `parameters()` count them.
    /// Burn's `num_params` also counts the batch norms' running statistics.
    pub fn trainable_params(&self) -> usize {
        let buffers = self.stem.buffers()
            + self
                .blocks
                .iter()
                .map(|b| b.depthwise.buffers() + b.pointwise.buffers())
                .sum::<usize>();
        self.num_params() - buffers
    }
}

impl<B: ModelBackend> MobileNet<B> {
    /// The last block's feature maps, in the policy's compute dtype.
    ///
    /// # Shapes
    /// `[batch, 3, size, size]` → `[batch, 1024α, size/(16s), size/(16s)]`
    pub fn features(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        let mut x = mark(self.stem.forward(images, cx), Boundary("stem"), cx); // [B, 32α, size/s, size/s]
        for (block, name) in self.blocks.iter().zip(BLOCK_NAMES) {
            x = mark(block.forward(x, cx), Boundary(name), cx);
        }
        x
    }

    /// Logits for a batch of images.
    ///
    /// # Shapes
    /// `[batch, 3, size, size]` → `[batch, num_classes]`
    pub fn forward(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 2> {
        let x = layers::global_avg_pool(self.features(images, cx)); // [B, 1024α]
        let x = mark(x, Boundary("pool"), cx);
        let x = layers::classifier(cx, &self.fc, x, self.fuse);
        let x = mark(x, Boundary("fc"), cx); // [B, classes]
        cx.precision.output(x)
    }
}
