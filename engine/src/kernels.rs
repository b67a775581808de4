//! The kernel hooks: the pieces oomlab's ops are made of, each with a default composed from
//! Burn's ops (beside the op that uses it) and overridden where a backend has a leaner way.
//! Only the CPU backend overrides them ([`cpu`](crate::cpu)); CUDA and wgpu run the defaults.
//! CPU tuning (slices sized to a cache, per-channel copies laid out for SIMD) lives in those
//! overrides; the defaults run each op on the whole batch, as a GPU wants it.
//!
//! The graph ops that call them are [`ModelBackend`](crate::ModelBackend)'s: the hooks run on
//! the inner backend of `Autodiff`, never on an autodiff one.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor, IntTensor, MaxPool2dWithIndices};
use burn::tensor::{DType, Slice, TensorMetadata};

use crate::batch_norm;
use crate::cast::{cast_prim, float, prim};
use crate::conv_relu_pool;
use crate::max_pool::PoolWindow;
use crate::sliced_linear;

/// A plain (non-autodiff) backend's kernels for oomlab's ops. Every hook returns its result;
/// a backend that overrides one and meets operands it does not handle calls the default.
pub trait Kernels: Backend {
    /// `whole` with rows `start..` of its first axis replaced by `part`: how the fused ops
    /// fill a batch-sized result slice by slice. In place where the backend can.
    fn float_write_rows(
        whole: FloatTensor<Self>,
        start: usize,
        part: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let len = part.shape().dims::<1>()[0];
        Self::float_slice_assign(whole, &[Slice::from(start..start + len)], part)
    }

    /// Values per slice of a batch that the fused ops hand the other hooks ([`slices`](crate::slices)),
    /// or `None` for the whole batch at once. The default (CubeCL) runs each op batched: one
    /// kernel launch per op. The CPU backend slices to its cache size, where its kernels make
    /// scratch in proportion to the batch they get.
    fn slice_values() -> Option<usize> {
        None
    }

    /// A per-channel operand `v` (`[1, channels, 1, 1]`) of an elementwise op over `batch`
    /// images, as batch norm hands it over. The default returns it as it is: it broadcasts.
    /// The CPU backend copies it to `[batch, channels, 1, 1]`, the layout its SIMD broadcast
    /// takes (see [`cpu`](crate::cpu)).
    fn per_channel_rows(v: FloatTensor<Self>, _batch: usize) -> FloatTensor<Self> {
        v
    }

    /// `conv2d(x, weight)` without a bias, in the dtype of `x`, as the fused ops call it:
    /// `weight` may be the (wider) master copy, which is cast to that dtype first. The CPU
    /// backend runs depthwise and pointwise convs directly (in f32, on channels-last
    /// activations, which it also returns: see flex-kernels' `channels_last.rs`) and rounds a master
    /// weight as it reads it, making no half copy of it.
    fn float_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let weight = cast_prim::<Self>(weight, x.dtype());
        Self::conv2d(x, weight, None, options)
    }

    /// The input gradient, in the dtype of `x`, of [`float_conv2d`](Self::float_conv2d)
    /// computed in that dtype with `weight` (its master copy, possibly wider) cast to it, for
    /// the output gradient `dz`. The CPU backend runs depthwise and pointwise convs directly,
    /// rounds the master weight as it reads it (backward makes no half copy of it) and drops
    /// `x`, of which it reads only the shape, before it makes the gradient.
    fn float_conv2d_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dz: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv2d_x_backward_cast::<Self>(x, weight, dz, options)
    }

    /// The weight gradient of the same conv, as that conv makes it (in the dtype of `x`), then
    /// stored in the dtype of `weight`. The CPU backend runs depthwise and pointwise convs
    /// directly, summing in f32 and rounding once.
    fn float_conv2d_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dz: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv2d_weight_backward_cast::<Self>(x, weight, dz, options)
    }

    /// The [composed conv layer](crate::conv2d)'s forward: `conv2d(x, weight) (+ bias)` in
    /// the dtype of `x`, which `weight` and `bias` have. The default is the backend's own
    /// conv; the CPU backend runs the direct convs, in the layout each makes (a dense conv's
    /// output channels first with the bias added, the others channels last: the batch norm,
    /// ReLU and convs after them read either).
    fn float_conv2d_layer(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d(x, weight, bias, options)
    }

    /// Max-pool of `x` over `window` with each output's argmax, as the backend's
    /// `max_pool2d_with_indices` makes them (its backward reads the indices): the [max-pool
    /// op](crate::max_pool)'s forward. The CPU backend pools channels-first planes directly
    /// (the same winners and indices as Flex's op).
    fn float_max_pool_with_indices(
        x: FloatTensor<Self>,
        window: PoolWindow,
    ) -> MaxPool2dWithIndices<Self> {
        let w = window;
        Self::max_pool2d_with_indices(x, w.size, w.stride, w.padding, [1, 1], false)
    }

    /// The same max-pool without indices (evaluation).
    fn float_max_pool(x: FloatTensor<Self>, window: PoolWindow) -> FloatTensor<Self> {
        let w = window;
        Self::max_pool2d(x, w.size, w.stride, w.padding, [1, 1], false)
    }

    /// The input gradient of [`float_max_pool_with_indices`](Self::float_max_pool_with_indices)
    /// for the output gradient `dout`. The CPU backend scatters a plane per thread, reading
    /// only `x`'s shape.
    fn float_max_pool_backward(
        x: FloatTensor<Self>,
        window: PoolWindow,
        dout: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let w = window;
        Self::max_pool2d_with_indices_backward(
            x,
            w.size,
            w.stride,
            w.padding,
            [1, 1],
            false,
            dout,
            indices,
        )
        .x_grad
    }

    /// `max(x, 0)`: the [ReLU op](crate::relu)'s forward. The CPU backend works in `x`'s own
    /// layout, in place when it can, on half values as bits.
    fn float_relu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::relu(x)
    }

    /// The ReLU's input gradient: `dout` where `x > 0`, else 0.
    fn float_relu_backward(x: FloatTensor<Self>, dout: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::relu_backward(x, dout)
    }

    /// Each channel's sum of `dz` (`[batch, channels, h, w]`), as `[channels]` in `dtype`: a
    /// conv bias's gradient. The CPU backend sums in f32 in `dz`'s layout.
    fn float_bias_grad(dz: FloatTensor<Self>, dtype: DType) -> FloatTensor<Self> {
        let channels = dz.shape().dims::<4>()[1];
        let sum = float::<Self, 4>(dz).sum_dim(0).sum_dim(2).sum_dim(3);
        cast_prim::<Self>(prim(sum.reshape([channels])), dtype)
    }

    /// Evaluation-mode batch norm of `x` with the running `[gamma, beta, mean, var]`
    /// (`[channels]` each), computed in `work`, in `x`'s dtype. The CPU backend runs its
    /// batch-norm kernel's second pass (f32 work) in the activation's layout.
    fn batch_norm_inference(
        x: FloatTensor<Self>,
        params: [FloatTensor<Self>; 4],
        work: DType,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        batch_norm::inference_composed::<Self>(x, params, work, epsilon)
    }

    /// Training-mode batch norm of `x` computed in `work`: `[output, mean, var, rstd]` as
    /// [`bn_relu_forward`](Self::bn_relu_forward) makes them, without the ReLU: the [batch
    /// norm op](crate::batch_norm)'s forward. The CPU backend runs its two-pass kernel (batch
    /// norm in f32, in the activation's layout).
    fn batch_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> [FloatTensor<Self>; 4] {
        let f = batch_norm::forward::<Self>(x, gamma, beta, work, epsilon);
        [f.output, f.mean, f.var, f.rstd]
    }

    /// The gradients `[dx, dγ, dβ]` of that batch norm from its input `x`, `gamma`, the saved
    /// statistics (`mean`, `rstd` in `work`) and the output's gradient `dout`.
    fn batch_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        [mean, rstd]: [FloatTensor<Self>; 2],
        work: DType,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let stats = batch_norm::SavedStats { mean, rstd, work };
        batch_norm::backward::<Self>(x, gamma, &stats, dout)
    }

    /// Training-mode batch norm of `z` (computed in `work`) followed by a ReLU, as the [fused
    /// block](crate::conv_bn_relu) runs it: `[output, mean, var, rstd]`, the output in `z`'s
    /// dtype and the `[channels]` statistics in `work` (`var` biased, `rstd` = 1/√(var + ε)).
    /// Its output must be what [`bn_relu_backward`](Self::bn_relu_backward) recomputes for
    /// the ReLU's mask. The CPU backend runs it in two passes over `z` for batch norm in f32
    /// (statistics, then the output).
    fn bn_relu_forward(
        z: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> [FloatTensor<Self>; 4] {
        batch_norm::forward_relu::<Self>(z, gamma, beta, work, epsilon)
    }

    /// The gradients `[dz, dγ, dβ]` of training-mode batch norm followed by a ReLU, from batch
    /// norm's input `z`, its `[channels]` parameters and saved statistics (`mean`, `rstd` in
    /// `work`) and the ReLU output's gradient `dout`, as the [fused
    /// block](crate::conv_bn_relu) needs them. The CPU backend runs batch norm in f32 in two
    /// passes over `z` that widen (half precision) a plane at a time.
    #[allow(clippy::too_many_arguments)]
    fn bn_relu_backward(
        z: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        work: DType,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        batch_norm::relu_backward::<Self>(z, gamma, beta, [mean, rstd], work, dout)
    }

    /// `t` converted to the float `dtype` (which differs from its own): how the fused ops cast
    /// the master weights and their gradients. The CPU backend converts directly, where its
    /// generic cast stages every value in f64 (a weight's cast made 8 bytes per weight).
    fn float_convert(t: FloatTensor<Self>, dtype: DType) -> FloatTensor<Self> {
        Self::float_cast(t, dtype.into())
    }

    /// `sum + lhs · rhs` in f32, where `sum` (`[m, n]`, f32) may not exist yet and `lhs`
    /// (`[m, k]`) and `rhs` (`[k, n]`) share a float dtype: how the fused ops sum a weight
    /// gradient over slices without rounding it to half precision at every slice. Here the
    /// product is made in the operands' dtype and added in f32; the CPU backend widens the
    /// operands (a slice's worth) and has gemm add the product into `sum` in place.
    fn float_add_matmul(
        sum: Option<FloatTensor<Self>>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let product = prim(float::<Self, 2>(lhs).matmul(float::<Self, 2>(rhs)));
        let product = cast_prim::<Self>(product, DType::F32);
        match sum {
            Some(sum) => Self::float_add(sum, product),
            None => product,
        }
    }

    /// `x · W + b` with `weight` (`[in, out]`) and `bias` cast to the dtype of `x`: the forward
    /// of the [sliced linear layer](crate::sliced_linear). The CPU backend makes it in f32
    /// from half operands without a half copy of the weight.
    fn linear_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        sliced_linear::linear_plain::<Self>(x, weight, bias)
    }

    /// The [sliced linear layer](crate::sliced_linear)'s input gradient `dy · cast(W)ᵀ` for
    /// `dy [batch, out]` and the f32 master `weight [in, out]` (`in = features`), in the dtype
    /// of `dy`, made a slice of rows at a time ([`slice_values`](Self::slice_values)). The CPU backend makes it in bf16 without a bf16
    /// copy of the weight or its f64-staged widening.
    fn linear_input_grad(
        dy: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        features: usize,
    ) -> FloatTensor<Self> {
        sliced_linear::input_grad_sliced::<Self>(dy, weight, features)
    }

    /// [`float_write_rows`](Self::float_write_rows) for int tensors.
    fn int_write_rows(
        whole: IntTensor<Self>,
        start: usize,
        part: IntTensor<Self>,
    ) -> IntTensor<Self> {
        let len = part.shape().dims::<1>()[0];
        Self::int_slice_assign(whole, &[Slice::from(start..start + len)], part)
    }

    /// The forward of the [conv → ReLU → max-pool block](crate::conv_relu_pool) with `weight`
    /// and `bias` in `x`'s dtype: the output and each window's winner as `row · k + col` (u8).
    /// The default runs the backend's conv, then [`relu_max_pool`](Self::relu_max_pool), a
    /// slice of images at a time (the full-resolution conv output exists for one slice, on
    /// every backend: the block's memory saving); the
    /// CPU backend runs its own kernel an image per thread where it can.
    fn conv_relu_pool_forward(
        x: &FloatTensor<Self>,
        weight: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
        options: &ConvOptions<2>,
        k: usize,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        conv_relu_pool::forward_sliced::<Self>(x, weight, bias, options, k)
    }

    /// The gradients `[dx, dw, db]` of the same block (those `wanted`, in the order of
    /// `wanted`), from its input `x`, `weight` and `bias` (in `x`'s dtype), its output `out`,
    /// that output's gradient `dout` and the winners' `positions`; `dw` and `db` in f32. The
    /// default unpools the gradient and runs the backend's conv backward a slice of images at
    /// a time; the CPU backend reads `dw` and `db` straight off the pooled gradient, without
    /// any full-resolution tensor, when `dx` is not wanted.
    #[allow(clippy::too_many_arguments)]
    fn conv_relu_pool_backward(
        x: &FloatTensor<Self>,
        weight: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
        out: &FloatTensor<Self>,
        dout: &FloatTensor<Self>,
        positions: &IntTensor<Self>,
        options: &ConvOptions<2>,
        k: usize,
        wanted: [bool; 3],
    ) -> [Option<FloatTensor<Self>>; 3] {
        conv_relu_pool::backward_sliced::<Self>(
            x, weight, bias, out, dout, positions, options, k, wanted,
        )
    }

    /// `relu(maxpool_k(z))` (stride `k`, no padding) and each window's winner as `row · k +
    /// col` (u8): the forward of [`conv_relu_pool`](crate::ModelBackend::conv_relu_pool) after its conv. The
    /// CPU backend does it in one pass; the default is the backend's max-pool with indices,
    /// its ReLU and int ops on the indices.
    fn relu_max_pool(z: FloatTensor<Self>, k: usize) -> (FloatTensor<Self>, IntTensor<Self>) {
        conv_relu_pool::relu_max_pool_plain::<Self>(z, k)
    }
}

/// Burn's conv input gradient with `weight` cast to the dtype of `x` first.
pub(crate) fn conv2d_x_backward_cast<B: Kernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    dz: FloatTensor<B>,
    options: ConvOptions<2>,
) -> FloatTensor<B> {
    let weight = cast_prim::<B>(weight, x.dtype());
    B::conv2d_x_backward(x, weight, dz, options)
}

/// Burn's conv weight gradient with `weight` cast to the dtype of `x` first, and the gradient
/// cast back to the weight's dtype.
pub(crate) fn conv2d_weight_backward_cast<B: Kernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    dz: FloatTensor<B>,
    options: ConvOptions<2>,
) -> FloatTensor<B> {
    let master = weight.dtype();
    let weight = cast_prim::<B>(weight, x.dtype());
    cast_prim::<B>(B::conv2d_weight_backward(x, weight, dz, options), master)
}

impl Kernels for burn::backend::Cuda {}
impl Kernels for burn::backend::Wgpu {}
