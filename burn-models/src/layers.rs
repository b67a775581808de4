//! Layer calls under a [`Precision`] policy.
//!
//! Burn's nn modules use their f32 weights directly, and there is no implicit dtype promotion,
//! so a policy-aware layer casts the input *and* `weight.val()` and calls the functional op in
//! `burn::tensor::module`. The modules themselves stay plain `burn::nn` types, so records and
//! optimizers see ordinary f32 parameters.

use burn::nn::conv::Conv2d;
use burn::nn::{BatchNorm, Linear, PaddingConfig2d};
use burn::tensor::module;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{activation, backend::Backend, Tensor};

use crate::precision::{cast, Precision};

/// A 2D convolution computed in the policy's compute dtype.
///
/// # Shapes
/// `[batch, c_in, h, w]` → `[batch, c_out, h_out, w_out]`
pub fn conv2d<B: Backend>(p: &Precision, layer: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    let padding = match layer.padding {
        PaddingConfig2d::Explicit(top, left, bottom, right) if top == bottom && left == right => {
            [top, left]
        }
        PaddingConfig2d::Valid => [0, 0],
        // Our models only build symmetric explicit padding.
        ref other => unreachable!("unsupported conv padding {other:?}"),
    };
    let options = ConvOptions::new(layer.stride, padding, layer.dilation, layer.groups);
    module::conv2d(
        p.compute(x),
        p.compute(layer.weight.val()),
        layer.bias.as_ref().map(|b| p.compute(b.val())),
        options,
    )
}

/// A linear layer computed in the policy's compute dtype.
pub fn linear<B: Backend>(p: &Precision, layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    module::linear(
        p.compute(x),
        p.compute(layer.weight.val()),
        layer.bias.as_ref().map(|b| p.compute(b.val())),
    )
}

/// Batch norm computed in the policy's batch-norm dtype; the result returns in the dtype it
/// came in, so the next layer sees what it expects.
pub fn batch_norm<B: Backend>(
    p: &Precision,
    layer: &BatchNorm<B>,
    x: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let dtype = x.dtype();
    cast(layer.forward(p.batch_norm(x)), dtype)
}

/// ReLU in whatever dtype its input has.
pub fn relu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    activation::relu(x)
}

/// Non-overlapping max pooling with a square window.
pub fn max_pool2d<B: Backend>(x: Tensor<B, 4>, size: usize) -> Tensor<B, 4> {
    module::max_pool2d(x, [size, size], [size, size], [0, 0], [1, 1], false)
}

/// Global average pooling to `[batch, channels]`.
pub fn global_avg_pool<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 2> {
    let [batch, channels, _, _] = x.dims();
    module::adaptive_avg_pool2d(x, [1, 1]).reshape([batch, channels])
}
