//! The seed article's SimpleModel: the smallest CNN that still shows every memory term.
//!
//! ```text
//! [B,3,32,32] → Conv2d 3→64 k3 p1 → ReLU → MaxPool 2×2 → flatten → Linear 64·16·16 → 10
//!               └──────── one op when fused (conv_relu_pool) ────────┘           └──── one op ────┘
//! ```
//! Fused, the classifier is one op too ([`sliced_linear`](oomlab_engine::sliced_linear)).

use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::prelude::*;

use oomlab_engine::{mark, Boundary, Layer, ModelBackend, Plan, RunContext};

use crate::layers;

/// Configuration of [`SimpleModel`]. The defaults are the article's.
#[derive(Config, Debug)]
pub struct SimpleModelConfig {
    /// Output classes.
    #[config(default = 10)]
    pub num_classes: usize,
    /// Conv → ReLU → max-pool as one op that keeps no full-resolution tensor for backward
    /// ([`conv_relu_pool`](oomlab_engine::conv_relu_pool)), and the classifier as
    /// [`sliced_linear`](oomlab_engine::sliced_linear); same function, same gradients.
    #[config(default = false)]
    pub fuse: bool,
}

/// Conv → ReLU → MaxPool → Linear, on 32×32 RGB input.
#[derive(Module, Debug)]
pub struct SimpleModel<B: Backend> {
    conv: Conv2d<B>,
    fc: Linear<B>,
    fuse: bool,
}

/// Side length of the input images the model is built for.
pub const SIMPLE_INPUT_SIZE: usize = 32;
/// Channels of the conv (and so of the pooled feature maps the linear layer reads).
pub const CHANNELS: usize = 64;

impl SimpleModelConfig {
    /// The forward pass as the memory estimate reads it: the ops `init` builds and `forward`
    /// runs, with their per-image sizes.
    pub fn plan(&self) -> Plan {
        let (s, c, k) = (
            SIMPLE_INPUT_SIZE as u64,
            CHANNELS as u64,
            self.num_classes as u64,
        );
        let (images, conv, pooled) = (3 * s * s, c * s * s, c * (s / 2) * (s / 2));
        let (weight, bias) = (3 * c * 9, c);
        let mut plan = Plan::default();
        if self.fuse {
            plan.push(
                "conv+ReLU+max-pool (keeps the images, its output, 1 byte per output)",
                Layer::ConvReluPool {
                    input: images,
                    conv,
                    output: pooled,
                    weight,
                    bias,
                },
            );
            plan.push(
                "linear (keeps its input: the block's output, counted above)",
                Layer::SlicedLinear {
                    input: pooled,
                    output: k,
                    weight: pooled * k,
                    bias: k,
                },
            );
            return plan;
        }
        let input = images;
        plan.push(
            "conv (keeps its input, the images)",
            Layer::Conv {
                input,
                output: conv,
                weight,
                bias,
            },
        );
        plan.push(
            "ReLU (keeps its input, the conv output)",
            Layer::Relu { elements: conv },
        );
        plan.push(
            "max-pool (keeps its input and argmax indices)",
            Layer::MaxPool {
                input: conv,
                output: pooled,
            },
        );
        plan.push(
            "linear (keeps its input)",
            Layer::Linear {
                input: pooled,
                output: k,
                weight: pooled * k,
                bias: k,
            },
        );
        plan
    }

    /// Builds the model on `device` with Burn's default initialisers.
    pub fn init<B: Backend>(&self, device: &B::Device) -> SimpleModel<B> {
        let pooled = SIMPLE_INPUT_SIZE / 2;
        SimpleModel {
            conv: Conv2dConfig::new([3, CHANNELS], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device),
            fc: LinearConfig::new(CHANNELS * pooled * pooled, self.num_classes).init(device),
            fuse: self.fuse,
        }
    }
}

impl<B: Backend> SimpleModel<B> {
    /// Trainable parameters (the model has no buffers, so this is `num_params`).
    pub fn trainable_params(&self) -> usize {
        self.num_params()
    }
}

impl<B: ModelBackend> SimpleModel<B> {
    /// The pooled feature maps the classifier reads, in the policy's compute dtype: under
    /// mixed precision these (and every activation before them) are half precision.
    ///
    /// # Shapes
    /// `[batch, 3, 32, 32]` → `[batch, 64, 16, 16]`
    pub fn features(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        if self.fuse {
            let x = layers::conv_relu_pool(cx, &self.conv, images, 2); // [B, 64, 16, 16]
            return mark(x, Boundary("conv+relu+pool"), cx);
        }
        let x = mark(layers::conv2d(cx, &self.conv, images), Boundary("conv"), cx); // [B, 64, 32, 32]
        let x = mark(layers::relu(x), Boundary("relu"), cx);
        let x = layers::max_pool2d(cx, x, 2, Boundary("pool (inside)"));
        mark(x, Boundary("pool"), cx) // [B, 64, 16, 16]
    }

    /// Logits for a batch of images.
    ///
    /// # Shapes
    /// `[batch, 3, 32, 32]` → `[batch, num_classes]`
    pub fn forward(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 2> {
        let x = self.features(images, cx).flatten(1, 3); // [B, 16384]
        let x = match self.fuse {
            true => layers::linear_fused(cx, &self.fc, x),
            false => layers::linear(cx, &self.fc, x),
        };
        let x = mark(x, Boundary("fc"), cx); // [B, classes]
        cx.precision.output(x)
    }
}
