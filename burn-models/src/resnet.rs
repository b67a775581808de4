//! ResNet — He et al. 2015, "Deep Residual Learning for Image Recognition",
//! <https://arxiv.org/abs/1512.03385>, Table 1, in torchvision's layout (`resnet.py`, v1.5:
//! a bottleneck strides in its 3×3 conv, not its first 1×1).
//!
//! ```text
//! stem  cifar:    Conv 3×3 (64·α) + BN + ReLU
//!       imagenet: Conv 7×7/2 (64·α) + BN + ReLU → MaxPool 3×3/2
//! 4 stages of (64, 128, 256, 512)·α channels, the first block of each with stride 1, 2, 2, 2:
//!   basic (18, 34):   Conv 3×3/s + BN + ReLU → Conv 3×3 + BN                          ─┐
//!   bottleneck (50):  Conv 1×1 + BN + ReLU → Conv 3×3/s + BN + ReLU → Conv 1×1 (×4) + BN ─┴ + identity → ReLU
//!   identity: the block's input, or Conv 1×1/s + BN where the stride or the channels change
//! global average pool → Linear (512·α·expansion → classes)
//! ```
//! Convolutions carry no bias: the batch norm after each one has its own shift. With `fuse`,
//! each conv + BN + ReLU is one op ([`conv_bn_relu`](oomlab_engine::conv_bn_relu)) that keeps two
//! tensors for backward instead of three; a conv + BN that the residual addition reads stays
//! two ops (nothing follows it to fuse), and the identity's tensor is alive across the block.
//!
//! The architecture is data: [`ARCHITECTURES`] holds Table 1 per depth, and
//! [`ResNetConfig::blocks`] the list of blocks that [`ResNetConfig::init`] builds, for anything
//! (a memory estimate) that must walk the same network.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

use oomlab_engine::{mark, Boundary, Layer, ModelBackend, Plan, RunContext};

use crate::layers::{self, ConvBn};

/// Which residual block a depth stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3×3 convs (ResNet-18 and 34).
    Basic,
    /// 1×1 conv, 3×3 conv, 1×1 conv to four times the width (ResNet-50).
    Bottleneck,
}

impl BlockKind {
    /// A block's output channels per channel of its width (torchvision's `expansion`).
    pub const fn expansion(self) -> usize {
        match self {
            Self::Basic => 1,
            Self::Bottleneck => 4,
        }
    }
}

/// One stage of Table 1 (torchvision's `layer1`..`layer4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage {
    /// Residual blocks in the stage.
    pub blocks: usize,
    /// Width at α = 1: a basic block's channels, a bottleneck's inner ones.
    pub width: usize,
    /// Stride of the stage's first block (the others have stride 1).
    pub stride: usize,
}

/// One depth of Table 1: its block and its four stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Architecture {
    /// Weighted layers, the name's number.
    pub depth: usize,
    /// The residual block every stage stacks.
    pub block: BlockKind,
    /// The four stages, in forward order.
    pub stages: [Stage; 4],
}

/// The four stages' widths and strides, with `blocks` residual blocks each.
const fn stages([b1, b2, b3, b4]: [usize; 4]) -> [Stage; 4] {
    const fn stage(blocks: usize, width: usize, stride: usize) -> Stage {
        Stage {
            blocks,
            width,
            stride,
        }
    }
    [
        stage(b1, 64, 1),
        stage(b2, 128, 2),
        stage(b3, 256, 2),
        stage(b4, 512, 2),
    ]
}

/// ResNet-18: basic blocks, [2, 2, 2, 2].
pub const RESNET18: Architecture = Architecture {
    depth: 18,
    block: BlockKind::Basic,
    stages: stages([2, 2, 2, 2]),
};

/// ResNet-34: basic blocks, [3, 4, 6, 3].
pub const RESNET34: Architecture = Architecture {
    depth: 34,
    block: BlockKind::Basic,
    stages: stages([3, 4, 6, 3]),
};

/// ResNet-50: bottleneck blocks, [3, 4, 6, 3].
pub const RESNET50: Architecture = Architecture {
    depth: 50,
    block: BlockKind::Bottleneck,
    stages: stages([3, 4, 6, 3]),
};

/// Every depth built.
pub const ARCHITECTURES: [Architecture; 3] = [RESNET18, RESNET34, RESNET50];

impl Architecture {
    /// The architecture of `depth`, if it is one of [`ARCHITECTURES`].
    pub fn of(depth: usize) -> Option<&'static Architecture> {
        ARCHITECTURES.iter().find(|a| a.depth == depth)
    }
}

/// Most blocks in one stage of any depth (ResNet-34's and 50's `layer3`).
const MAX_STAGE_BLOCKS: usize = 6;

/// Boundary names of the blocks, torchvision's module paths: `layer{stage}.{block}`.
const BLOCK_NAMES: [[&str; MAX_STAGE_BLOCKS]; 4] = [
    [
        "layer1.0", "layer1.1", "layer1.2", "layer1.3", "layer1.4", "layer1.5",
    ],
    [
        "layer2.0", "layer2.1", "layer2.2", "layer2.3", "layer2.4", "layer2.5",
    ],
    [
        "layer3.0", "layer3.1", "layer3.2", "layer3.3", "layer3.4", "layer3.5",
    ],
    [
        "layer4.0", "layer4.1", "layer4.2", "layer4.3", "layer4.4", "layer4.5",
    ],
];

// Every stage of every depth has a name for each of its blocks.
const _: () = {
    let mut a = 0;
    while a < ARCHITECTURES.len() {
        let mut s = 0;
        while s < 4 {
            assert!(ARCHITECTURES[a].stages[s].blocks <= MAX_STAGE_BLOCKS);
            s += 1;
        }
        a += 1;
    }
};

/// Stem output channels at α = 1.
pub const STEM_CHANNELS: usize = 64;

/// Largest input side accepted: 2048² is 84× ImageNet's 224² per image already; the bound
/// keeps every size computed from it far inside `usize`.
pub const MAX_INPUT_SIZE: usize = 2048;

/// Most classes accepted (ImageNet-21k has 21,841).
pub const MAX_CLASSES: usize = 100_000;

/// The layers before the first stage.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Stem {
    /// 3×3 conv, stride 1, no max-pool: full resolution into `layer1`, for 32×32 images.
    Cifar,
    /// 7×7 conv with stride 2, then a 3×3 max-pool with stride 2: a quarter of the side.
    Imagenet,
}

impl Stem {
    /// The name a config file gives it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cifar => "cifar",
            Self::Imagenet => "imagenet",
        }
    }

    /// The stem conv's `(kernel, stride)`; its padding is `kernel / 2`.
    pub fn conv(self) -> (usize, usize) {
        match self {
            Self::Cifar => (3, 1),
            Self::Imagenet => (7, 2),
        }
    }

    /// Whether a 3×3 max-pool with stride 2 and padding 1 follows the stem conv.
    pub fn max_pool(self) -> bool {
        self == Self::Imagenet
    }

    /// Smallest input side accepted: the stem's and the three stride-2 stages' downsampling
    /// shrink it to 1×1 by `layer4`; anything smaller is padding for most of the network.
    pub fn min_input_size(self) -> usize {
        match self {
            Self::Cifar => 8,
            Self::Imagenet => 32,
        }
    }
}

/// A configuration that cannot build a ResNet.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ResNetError {
    /// A depth not in [`ARCHITECTURES`].
    #[error("depth must be 18, 34 or 50, got {0}")]
    Depth(usize),
    /// α outside (0, 4].
    #[error("width_multiplier must be in (0, 4], got {0}")]
    WidthMultiplier(f64),
    /// Input outside the stem's [`min_input_size`](Stem::min_input_size)..=[`MAX_INPUT_SIZE`].
    #[error(
        "input_size must be in {}..={MAX_INPUT_SIZE} with the {} stem, got {size}",
        .stem.min_input_size(),
        .stem.name()
    )]
    InputSize {
        /// The side asked for.
        size: usize,
        /// The stem it was asked with.
        stem: Stem,
    },
    /// Classes outside 1..=[`MAX_CLASSES`].
    #[error("num_classes must be in 1..={MAX_CLASSES}, got {0}")]
    Classes(usize),
}

/// Configuration of [`ResNet`]. Defaults are torchvision's `resnet18()`.
#[derive(Config, Debug)]
pub struct ResNetConfig {
    /// 18, 34 or 50 ([`ARCHITECTURES`]).
    #[config(default = 18)]
    pub depth: usize,
    /// The layers before the first stage.
    #[config(default = "Stem::Imagenet")]
    pub stem: Stem,
    /// Width multiplier α: every layer's channels are `int(c · α)`.
    #[config(default = 1.0)]
    pub width_multiplier: f64,
    /// Output classes.
    #[config(default = 1000)]
    pub num_classes: usize,
    /// Side length of the square input images.
    #[config(default = 224)]
    pub input_size: usize,
    /// Every conv → BN → ReLU as one op ([`conv_bn_relu`](oomlab_engine::conv_bn_relu)), and the
    /// classifier as [`sliced_linear`](oomlab_engine::sliced_linear); same function, same gradients,
    /// less kept for backward.
    #[config(default = false)]
    pub fuse: bool,
}

/// One residual block as [`ResNetConfig::init`] builds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSpec {
    /// Its boundary name, torchvision's module path (`"layer2.0"`).
    pub name: &'static str,
    /// Its stage, 0 for `layer1`.
    pub stage: usize,
    /// Basic or bottleneck.
    pub kind: BlockKind,
    /// Input channels.
    pub c_in: usize,
    /// A basic block's channels, a bottleneck's inner ones (its 1×1 and 3×3 convs' outputs).
    pub width: usize,
    /// Output channels: `width · expansion`.
    pub c_out: usize,
    /// Stride of the block's strided conv (and of its downsample).
    pub stride: usize,
}

impl BlockSpec {
    /// Whether the identity is a 1×1 conv + BN (the shapes change) rather than the input.
    pub fn downsample(&self) -> bool {
        self.stride != 1 || self.c_in != self.c_out
    }
}

impl ResNetConfig {
    /// The CIFAR preset: 32×32 input, 10 classes, the 3×3 stem without max-pool.
    pub fn cifar() -> Self {
        Self::new()
            .with_stem(Stem::Cifar)
            .with_input_size(32)
            .with_num_classes(10)
    }

    /// Checks the configuration without building anything.
    pub fn validate(&self) -> Result<(), ResNetError> {
        self.architecture()?;
        let a = self.width_multiplier;
        if !(a > 0.0 && a <= 4.0) {
            return Err(ResNetError::WidthMultiplier(a));
        }
        if !(self.stem.min_input_size()..=MAX_INPUT_SIZE).contains(&self.input_size) {
            return Err(ResNetError::InputSize {
                size: self.input_size,
                stem: self.stem,
            });
        }
        if !(1..=MAX_CLASSES).contains(&self.num_classes) {
            return Err(ResNetError::Classes(self.num_classes));
        }
        Ok(())
    }

    /// The depth's row of Table 1.
    pub fn architecture(&self) -> Result<&'static Architecture, ResNetError> {
        Architecture::of(self.depth).ok_or(ResNetError::Depth(self.depth))
    }

    /// Channels of a layer with `base` channels at α = 1 (`int(c · α)`, at least 1, as
    /// [`MobileNetConfig::channels`](crate::MobileNetConfig::channels)).
    pub fn channels(&self, base: usize) -> usize {
        ((base as f64 * self.width_multiplier) as usize).max(1)
    }

    /// Every residual block, in forward order, as [`init`](Self::init) builds them.
    pub fn blocks(&self) -> Result<Vec<BlockSpec>, ResNetError> {
        self.validate()?;
        let arch = self.architecture()?;
        let mut c_in = self.channels(STEM_CHANNELS);
        let mut blocks = Vec::new();
        for (stage, (s, names)) in arch.stages.iter().zip(BLOCK_NAMES).enumerate() {
            let width = self.channels(s.width);
            let c_out = width * arch.block.expansion();
            for (i, name) in names.into_iter().take(s.blocks).enumerate() {
                let stride = if i == 0 { s.stride } else { 1 };
                blocks.push(BlockSpec {
                    name,
                    stage,
                    kind: arch.block,
                    c_in,
                    width,
                    c_out,
                    stride,
                });
                c_in = c_out;
            }
        }
        Ok(blocks)
    }

    /// The forward pass as the memory estimate reads it: the stem, then the ops of each block
    /// of [`blocks`](Self::blocks) (the list `init` builds from) in the order `forward` runs
    /// them, with their per-image sizes. A config `init` refuses plans nothing.
    pub fn plan(&self) -> Plan {
        let mut plan = Plan::default();
        let Ok(blocks) = self.blocks() else {
            return plan;
        };
        let what = match self.fuse {
            true => "fused conv+BN+ReLU, conv+BN inputs",
            false => "conv, BN, ReLU inputs",
        };
        // A k×k conv padded by k/2 with stride s (and the stem's 3×3/2 max-pool padded by 1)
        // maps a side to ⌈side / s⌉.
        let mut side = self.input_size as u64;
        let (kernel, stride) = self.stem.conv();
        let c = self.channels(STEM_CHANNELS) as u64;
        let input = 3 * side * side;
        side = side.div_ceil(stride as u64);
        let stem = format!("stem: {what}");
        let weight = 3 * c * (kernel * kernel) as u64;
        layers::plan_conv_bn(
            &mut plan,
            &stem,
            [input, c * side * side, weight, c],
            self.fuse,
            true,
        );
        if self.stem.max_pool() {
            let input = c * side * side;
            side = side.div_ceil(2);
            let output = c * side * side;
            plan.push(stem, Layer::MaxPool { input, output });
        }
        for b in &blocks {
            let group = format!("{}: {what}", b.name);
            let (c_in, width, c_out) = (b.c_in as u64, b.width as u64, b.c_out as u64);
            let input = c_in * side * side;
            let after = side.div_ceil(b.stride as u64);
            let (mid, out) = (width * after * after, c_out * after * after);
            match b.kind {
                BlockKind::Basic => {
                    let conv1 = [input, mid, c_in * width * 9, width];
                    layers::plan_conv_bn(&mut plan, &group, conv1, self.fuse, true);
                    let conv2 = [mid, out, width * c_out * 9, c_out];
                    layers::plan_conv_bn(&mut plan, &group, conv2, self.fuse, false);
                }
                BlockKind::Bottleneck => {
                    let conv1 = [input, width * side * side, c_in * width, width];
                    layers::plan_conv_bn(&mut plan, &group, conv1, self.fuse, true);
                    let conv2 = [width * side * side, mid, width * width * 9, width];
                    layers::plan_conv_bn(&mut plan, &group, conv2, self.fuse, true);
                    let conv3 = [mid, out, width * c_out, c_out];
                    layers::plan_conv_bn(&mut plan, &group, conv3, self.fuse, false);
                }
            }
            if b.downsample() {
                let conv = Layer::Conv {
                    input,
                    output: out,
                    weight: c_in * c_out,
                    bias: 0,
                };
                plan.push_branch(group.clone(), conv);
                let bn = Layer::BatchNorm {
                    elements: out,
                    channels: c_out,
                };
                plan.push(group.clone(), bn);
            }
            plan.push(group.clone(), Layer::Add { elements: out });
            plan.push(group, Layer::Relu { elements: out });
            side = after;
        }
        let features = blocks.last().map_or(c, |b| b.c_out as u64);
        let pool = Layer::GlobalPool {
            input: features * side * side,
            channels: features,
        };
        plan.push("global pool (keeps its input)", pool);
        let fc = Layer::classifier(features, self.num_classes as u64, self.fuse);
        plan.push("linear (keeps its input)", fc);
        plan
    }

    /// Builds the model on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<ResNet<B>, ResNetError> {
        let blocks = self.blocks()?;
        let (kernel, stride) = self.stem.conv();
        let stem_out = self.channels(STEM_CHANNELS);
        let mut stages: [Vec<Residual<B>>; 4] = Default::default();
        for spec in &blocks {
            stages[spec.stage].push(Residual::new(spec, device, self.fuse));
        }
        let features = blocks.last().map_or(stem_out, |b| b.c_out);
        let [layer1, layer2, layer3, layer4] = stages;
        Ok(ResNet {
            stem: ConvBn::new(3, stem_out, kernel, stride, 1, device).fused(self.fuse),
            max_pool: self.stem.max_pool(),
            layer1,
            layer2,
            layer3,
            layer4,
            fc: LinearConfig::new(features, self.num_classes).init(device),
            fuse: self.fuse,
        })
    }
}

/// ResNet-18's and 34's block: two 3×3 convs, the first with the stride.
#[derive(Module, Debug)]
pub struct BasicBlock<B: Backend> {
    conv1: ConvBn<B>,
    conv2: ConvBn<B>,
    downsample: Option<ConvBn<B>>,
}

/// ResNet-50's block: 1×1 to the width, 3×3 with the stride, 1×1 to four times the width.
#[derive(Module, Debug)]
pub struct Bottleneck<B: Backend> {
    conv1: ConvBn<B>,
    conv2: ConvBn<B>,
    conv3: ConvBn<B>,
    downsample: Option<ConvBn<B>>,
}

/// A residual block of either kind.
#[derive(Module, Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "a model holds at most 16 blocks, all of one kind: boxing saves nothing that matters"
)]
pub enum Residual<B: Backend> {
    /// Two 3×3 convs.
    Basic(BasicBlock<B>),
    /// 1×1, 3×3, 1×1 ×4.
    Bottleneck(Bottleneck<B>),
}

impl<B: Backend> Residual<B> {
    fn new(spec: &BlockSpec, device: &B::Device, fuse: bool) -> Self {
        let &BlockSpec {
            c_in,
            width,
            c_out,
            stride,
            ..
        } = spec;
        let conv = |c_in, c_out, kernel, stride| {
            ConvBn::new(c_in, c_out, kernel, stride, 1, device).fused(fuse)
        };
        let downsample = spec.downsample().then(|| conv(c_in, c_out, 1, stride));
        match spec.kind {
            BlockKind::Basic => Self::Basic(BasicBlock {
                conv1: conv(c_in, width, 3, stride),
                conv2: conv(width, c_out, 3, 1),
                downsample,
            }),
            BlockKind::Bottleneck => Self::Bottleneck(Bottleneck {
                conv1: conv(c_in, width, 1, 1),
                conv2: conv(width, width, 3, stride),
                conv3: conv(width, c_out, 1, 1),
                downsample,
            }),
        }
    }

    /// Elements of the block's batch norms' running statistics.
    fn buffers(&self) -> usize {
        let (convs, downsample) = match self {
            Self::Basic(b) => (b.conv1.buffers() + b.conv2.buffers(), &b.downsample),
            Self::Bottleneck(b) => (
                b.conv1.buffers() + b.conv2.buffers() + b.conv3.buffers(),
                &b.downsample,
            ),
        };
        convs + downsample.as_ref().map_or(0, ConvBn::buffers)
    }
}

impl<B: ModelBackend> Residual<B> {
    /// `relu(branch(x) + identity(x))`; the identity is computed after the branch, as
    /// torchvision does, so its downsampled tensor lives only until the addition.
    ///
    /// # Shapes
    /// `[batch, c_in, h, w]` → `[batch, c_out, h / stride, w / stride]`
    pub fn forward(&self, x: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        let (out, downsample) = match self {
            Self::Basic(b) => {
                let out = b.conv1.forward(x.clone(), cx); // [B, width, h/s, w/s]
                let out = b.conv2.forward_no_relu(out, cx); // [B, c_out, h/s, w/s]
                (out, &b.downsample)
            }
            Self::Bottleneck(b) => {
                let out = b.conv1.forward(x.clone(), cx); // [B, width, h, w]
                let out = b.conv2.forward(out, cx); // [B, width, h/s, w/s]
                let out = b.conv3.forward_no_relu(out, cx); // [B, c_out, h/s, w/s]
                (out, &b.downsample)
            }
        };
        let identity = match downsample {
            Some(d) => d.forward_no_relu(x, cx), // [B, c_out, h/s, w/s]
            None => x,
        };
        layers::relu(out + identity) // [B, c_out, h/s, w/s]
    }
}

/// ResNet: stem, four stages of residual blocks, global average pool, classifier.
#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    stem: ConvBn<B>,
    /// The ImageNet stem's 3×3/2 max-pool after the stem conv.
    max_pool: bool,
    layer1: Vec<Residual<B>>,
    layer2: Vec<Residual<B>>,
    layer3: Vec<Residual<B>>,
    layer4: Vec<Residual<B>>,
    fc: Linear<B>,
    fuse: bool,
}

impl<B: Backend> ResNet<B> {
    /// The four stages, in forward order.
    fn stages(&self) -> [&[Residual<B>]; 4] {
        [&self.layer1, &self.layer2, &self.layer3, &self.layer4]
    }

    /// Trainable parameters, as torchvision's `parameters()` counts them.
    /// Burn's `num_params` also counts the batch norms' running statistics.
    pub fn trainable_params(&self) -> usize {
        let blocks = self.stages().into_iter().flatten();
        let buffers = self.stem.buffers() + blocks.map(Residual::buffers).sum::<usize>();
        self.num_params() - buffers
    }
}

impl<B: ModelBackend> ResNet<B> {
    /// The last block's feature maps, in the policy's compute dtype.
    ///
    /// # Shapes
    /// `[batch, 3, size, size]` → `[batch, 512α·expansion, size/(8r), size/(8r)]`, r = 1 for
    /// the cifar stem and 4 for the imagenet one (rounded up at each stride).
    pub fn features(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        let x = self.stem.forward(images, cx); // [B, 64α, size/s, size/s]
        let x = match self.max_pool {
            true => layers::max_pool2d_padded(cx, x, 3, 2, 1, Boundary("stem pool (inside)")), // [B, 64α, size/r, size/r]
            false => x,
        };
        let mut x = mark(x, Boundary("stem"), cx);
        for (stage, names) in self.stages().into_iter().zip(BLOCK_NAMES) {
            for (block, name) in stage.iter().zip(names) {
                x = mark(block.forward(x, cx), Boundary(name), cx);
            }
        }
        x
    }

    /// Logits for a batch of images.
    ///
    /// # Shapes
    /// `[batch, 3, size, size]` → `[batch, num_classes]`
    pub fn forward(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 2> {
        let x = layers::global_avg_pool(self.features(images, cx)); // [B, 512α·expansion]
        let x = mark(x, Boundary("pool"), cx);
        let x = layers::classifier(cx, &self.fc, x, self.fuse); // [B, classes]
        let x = mark(x, Boundary("fc"), cx);
        cx.precision.output(x)
    }
}
