//! The backends the models run on: any Burn backend that can run oomlab's own autodiff ops:
//! [batch norm](crate::batch_norm), the fused blocks ([conv → BN → ReLU](crate::conv_bn_relu),
//! [conv → ReLU → max-pool](crate::conv_relu_pool)), the [sliced linear
//! layer](crate::sliced_linear) and [layer boundaries](crate::boundary).
//!
//! Plain backends (Flex, CUDA, wgpu) get the composed defaults; [`Autodiff`] overrides them
//! with single graph ops whose backward is written out.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor, IntTensor};
use burn::tensor::{DType, Slice, TensorMetadata};

use crate::batch_norm::{self, float, prim, BatchNormOutput};
use crate::boundary::{self, Boundary};
use crate::conv_bn_relu;
use crate::conv_relu_pool;
use crate::flex;
use crate::precision::cast_prim;
use crate::sliced_linear;

/// A backend for [`SimpleModel`](crate::SimpleModel) and [`MobileNet`](crate::MobileNet).
pub trait ModelBackend: Backend {
    /// Training-mode batch norm over a `[batch, channels, h, w]` input, with `gamma` and `beta`
    /// of shape `[channels]`, computed in `work`.
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> BatchNormOutput<Self> {
        batch_norm::batch_norm_plain::<Self>(x, gamma, beta, work, epsilon)
    }

    /// Training-mode conv (no bias) → batch norm → ReLU: the ReLU output and the batch
    /// statistics. The conv computes in the dtype of `x` and `weight`, batch norm in `work`.
    #[allow(clippy::too_many_arguments)]
    fn conv_bn_relu_train(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        options: ConvOptions<2>,
        work: DType,
        epsilon: f64,
    ) -> BatchNormOutput<Self> {
        conv_bn_relu::conv_bn_relu_plain::<Self>(x, weight, gamma, beta, options, work, epsilon)
    }

    /// Conv with bias → ReLU → `k`×`k` max-pool (stride `k`), in the dtype of the inputs.
    fn conv_relu_pool(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        options: ConvOptions<2>,
        k: usize,
    ) -> FloatTensor<Self> {
        conv_relu_pool::conv_relu_pool_plain::<Self>(x, weight, bias, options, k)
    }

    /// `x · W + b`, with `weight` (`[in, out]`) and `bias` cast to the dtype of `x`. Under
    /// autodiff, one op ([`sliced_linear`](crate::sliced_linear)) that keeps no half copy of
    /// the weight and makes the input gradient a slice of rows at a time.
    fn sliced_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        sliced_linear::linear_plain::<Self>(x, weight, bias)
    }

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

    /// `conv2d(x, weight)` without a bias, in the dtype of `x`, as the fused ops call it:
    /// `weight` may be the (wider) master copy, which is cast to that dtype first. The CPU
    /// backend runs depthwise and pointwise convs directly (in f32, on channels-last
    /// activations, which it also returns: see `flex/channels_last.rs`) and rounds a master
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

    /// The [sliced linear layer](crate::sliced_linear)'s input gradient `dy · cast(W)ᵀ` for
    /// `dy [batch, out]` and the f32 master `weight [in, out]` (`in = features`), in the dtype
    /// of `dy`, made a slice of rows at a time. The CPU backend makes it in bf16 without a bf16
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

    /// The weight and bias gradients (f32) of [`conv_relu_pool`](Self::conv_relu_pool)
    /// straight from its output `out`, that output's gradient `dout` and the winners'
    /// `positions` in their windows, for a block whose input needs no gradient; `kernel` is the
    /// weight's shape. `None` (the default) has the block unpool the gradient and run the
    /// backend's conv backward; the CPU backend reads the gradients off the pooled output
    /// without any full-resolution tensor.
    #[allow(clippy::too_many_arguments)]
    fn conv_relu_pool_param_grads(
        _x: &FloatTensor<Self>,
        _out: &FloatTensor<Self>,
        _dout: &FloatTensor<Self>,
        _positions: &IntTensor<Self>,
        _kernel: [usize; 4],
        _options: &ConvOptions<2>,
        _k: usize,
    ) -> Option<[FloatTensor<Self>; 2]> {
        None
    }

    /// The forward of [`conv_relu_pool`](Self::conv_relu_pool) for the whole batch at once:
    /// the output and each window's winner as `row · k + col` (u8), with `weight` and `bias`
    /// in `x`'s dtype. `None` (the default) has the block run the backend's conv a slice of
    /// images at a time; the CPU backend runs it an image per thread, keeping one image's
    /// conv output per thread.
    fn conv_relu_pool_forward(
        _x: &FloatTensor<Self>,
        _weight: &FloatTensor<Self>,
        _bias: &FloatTensor<Self>,
        _options: &ConvOptions<2>,
        _k: usize,
    ) -> Option<(FloatTensor<Self>, IntTensor<Self>)> {
        None
    }

    /// `relu(maxpool_k(z))` (stride `k`, no padding) and each window's winner as `row · k +
    /// col` (u8): the forward of [`conv_relu_pool`](Self::conv_relu_pool) after its conv. The
    /// CPU backend does it in one pass; the default is the backend's max-pool with indices,
    /// its ReLU and int ops on the indices.
    fn relu_max_pool(z: FloatTensor<Self>, k: usize) -> (FloatTensor<Self>, IntTensor<Self>) {
        conv_relu_pool::relu_max_pool_plain::<Self>(z, k)
    }

    /// `x` unchanged. Under autodiff, the [boundary listener](crate::boundary::listen) hears
    /// the forward pass cross `at` and, later, the backward pass; a plain backend (inference)
    /// has no backward to pair with and reports nothing.
    fn boundary(x: FloatTensor<Self>, _at: Boundary) -> FloatTensor<Self> {
        x
    }

    /// The key under which a parameter's window sum is [lent](crate::grad_sum::lend) to the
    /// ops of a backward pass: the parameter tensor's autodiff node. `None` on a plain backend
    /// (no backward pass).
    fn grad_sum_key(_param: &FloatTensor<Self>) -> Option<u64> {
        None
    }
}

/// Burn's conv input gradient with `weight` cast to the dtype of `x` first.
fn conv2d_x_backward_cast<B: ModelBackend>(
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
fn conv2d_weight_backward_cast<B: ModelBackend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    dz: FloatTensor<B>,
    options: ConvOptions<2>,
) -> FloatTensor<B> {
    let master = weight.dtype();
    let weight = cast_prim::<B>(weight, x.dtype());
    cast_prim::<B>(B::conv2d_weight_backward(x, weight, dz, options), master)
}

impl ModelBackend for burn::backend::Flex {
    fn float_write_rows(
        whole: FloatTensor<Self>,
        start: usize,
        part: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        flex::write_rows(whole, start, part)
    }

    fn float_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let direct = flex::pointwise_conv(&x, &weight, &options)
            .or_else(|| flex::depthwise_conv(&x, &weight, &options))
            .or_else(|| flex::dense_conv(&x, &weight, &options));
        // Flex's conv for the rest (dilated or grouped), its output made channels last like
        // the direct convs' (the layout the fused blocks hand on, and that backward saves).
        direct.unwrap_or_else(|| {
            flex::channels_last(&flex::in_f32([flex::channels_first(x), weight], |[x, w]| {
                <Self as burn::tensor::ops::ModuleOps<Self>>::conv2d(x, w, None, options)
            }))
        })
    }

    fn float_conv2d_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dz: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let direct = flex::pointwise_x_backward(x, &weight, &dz, &options)
            .or_else(|x| flex::depthwise_x_backward(x, &weight, &dz, &options));
        match direct {
            Ok(dx) => dx,
            // Flex's ops copy strided tensors value by value: channels-last ones are
            // transposed here.
            Err(x) => {
                let (x, dz) = (flex::channels_first(x), flex::channels_first(dz));
                flex::in_f32([x, weight, dz], |[x, weight, dz]| {
                    conv2d_x_backward_cast::<Self>(x, weight, dz, options)
                })
            }
        }
    }

    fn float_conv2d_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        dz: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        let direct = flex::pointwise_weight_backward(&x, &weight, &dz, &options)
            .or_else(|| flex::depthwise_weight_backward(&x, &weight, &dz, &options))
            .or_else(|| flex::dense_weight_backward(&x, &weight, &dz, &options));
        match direct {
            Some(dw) => dw,
            None => {
                let master = weight.dtype();
                let (x, dz) = (flex::channels_first(x), flex::channels_first(dz));
                let dw = flex::in_f32([x, weight, dz], |[x, weight, dz]| {
                    <Self as burn::tensor::ops::ModuleOps<Self>>::conv2d_weight_backward(
                        x, weight, dz, options,
                    )
                });
                flex::convert(dw, master)
            }
        }
    }

    fn bn_relu_forward(
        z: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> [FloatTensor<Self>; 4] {
        let direct = match work {
            DType::F32 => flex::bn_relu_forward(&z, &gamma, &beta, epsilon),
            _ => None,
        };
        direct.unwrap_or_else(|| batch_norm::forward_relu::<Self>(z, gamma, beta, work, epsilon))
    }

    fn bn_relu_backward(
        z: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        work: DType,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let direct = match work {
            DType::F32 => flex::bn_relu_backward(&z, &dout, [&gamma, &beta, &mean, &rstd]),
            _ => None,
        };
        direct.unwrap_or_else(|| {
            batch_norm::relu_backward::<Self>(z, gamma, beta, [mean, rstd], work, dout)
        })
    }

    fn float_convert(t: FloatTensor<Self>, dtype: DType) -> FloatTensor<Self> {
        flex::convert(t, dtype)
    }

    fn float_add_matmul(
        sum: Option<FloatTensor<Self>>,
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        flex::add_matmul(sum, lhs, rhs)
    }

    fn int_write_rows(
        whole: IntTensor<Self>,
        start: usize,
        part: IntTensor<Self>,
    ) -> IntTensor<Self> {
        flex::write_rows(whole, start, part)
    }

    fn sliced_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match flex::linear_forward_half(&x, &weight, &bias) {
            Some(out) => out,
            None => sliced_linear::linear_plain::<Self>(x, weight, bias),
        }
    }

    fn linear_input_grad(
        dy: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        features: usize,
    ) -> FloatTensor<Self> {
        match flex::linear_input_grad_half(&dy, &weight) {
            Some(dx) => dx,
            None => sliced_linear::input_grad_sliced::<Self>(dy, weight, features),
        }
    }

    fn conv_relu_pool_param_grads(
        x: &FloatTensor<Self>,
        out: &FloatTensor<Self>,
        dout: &FloatTensor<Self>,
        positions: &IntTensor<Self>,
        kernel: [usize; 4],
        options: &ConvOptions<2>,
        k: usize,
    ) -> Option<[FloatTensor<Self>; 2]> {
        flex::conv_relu_pool_param_grads(x, out, dout, positions, kernel, options, k)
    }

    fn conv_relu_pool_forward(
        x: &FloatTensor<Self>,
        weight: &FloatTensor<Self>,
        bias: &FloatTensor<Self>,
        options: &ConvOptions<2>,
        k: usize,
    ) -> Option<(FloatTensor<Self>, IntTensor<Self>)> {
        flex::conv_relu_pool_forward(x, weight, bias, options, k)
    }

    fn relu_max_pool(z: FloatTensor<Self>, k: usize) -> (FloatTensor<Self>, IntTensor<Self>) {
        match flex::relu_max_pool(&z, k) {
            Some(pooled) => pooled,
            None => conv_relu_pool::relu_max_pool_plain::<Self>(z, k),
        }
    }
}
impl ModelBackend for burn::backend::Cuda {}
impl ModelBackend for burn::backend::Wgpu {}

impl<B: ModelBackend, C: CheckpointStrategy> ModelBackend for Autodiff<B, C> {
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> BatchNormOutput<Self> {
        batch_norm::batch_norm_autodiff::<B, C>(x, gamma, beta, work, epsilon)
    }

    fn conv_bn_relu_train(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        options: ConvOptions<2>,
        work: DType,
        epsilon: f64,
    ) -> BatchNormOutput<Self> {
        conv_bn_relu::conv_bn_relu_autodiff::<B, C>(x, weight, gamma, beta, options, work, epsilon)
    }

    fn conv_relu_pool(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        options: ConvOptions<2>,
        k: usize,
    ) -> FloatTensor<Self> {
        conv_relu_pool::conv_relu_pool_autodiff::<B, C>(x, weight, bias, options, k)
    }

    fn sliced_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        sliced_linear::linear_autodiff::<B, C>(x, weight, bias)
    }

    fn boundary(x: FloatTensor<Self>, at: Boundary) -> FloatTensor<Self> {
        boundary::boundary_autodiff::<B, C>(x, at)
    }

    fn grad_sum_key(param: &FloatTensor<Self>) -> Option<u64> {
        Some(param.node.id.value)
    }
}
