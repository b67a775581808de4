//! The graph ops the models call: oomlab's own autodiff ops (the composed [conv](crate::conv2d)
//! and [ReLU](crate::relu) layers, [batch norm](crate::batch_norm),
//! [conv → BN → ReLU](crate::conv_bn_relu), [conv → ReLU → max-pool](crate::conv_relu_pool),
//! the [sliced linear layer](crate::sliced_linear), [max-pool](crate::max_pool)) and [layer
//! boundaries](crate::boundary).
//!
//! Two implementations, nothing else: a plain backend (no graph: inference) runs each op
//! composed from its [kernel hooks](crate::Kernels); [`Autodiff`] over such a backend runs each
//! as one graph op whose backward is written out and which keeps only what that backward
//! reads. Which kernels run underneath is the inner backend's business, not the graph's.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::DType;

use crate::attention;
use crate::batch_norm::{self, BatchNormOutput};
use crate::boundary::{self, Boundary};
use crate::context::RunContext;
use crate::conv2d;
use crate::conv_bn_relu;
use crate::conv_relu_pool;
use crate::kernels::Kernels;
use crate::max_pool::{self, PoolWindow};
use crate::relu;
use crate::sliced_linear;

/// A backend the models run on: every [`Kernels`] backend, and [`Autodiff`] over one.
pub trait ModelBackend: Backend {
    /// Training-mode batch norm over a `[batch, channels, h, w]` input, with `gamma` and `beta`
    /// of shape `[channels]`, computed in `work`.
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
        cx: &RunContext,
    ) -> BatchNormOutput<Self>;

    /// `conv2d(x, weight) (+ bias)` in the dtype of `x`, whose `weight` and `bias` already
    /// have it: the composed conv layer. Under autodiff, one graph op that keeps what Burn's
    /// conv keeps and runs the backend's kernel hooks ([`conv2d`](crate::conv2d)).
    fn conv2d_layer(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self>;

    /// `max(x, 0)`: the composed ReLU layer. Under autodiff, one graph op that keeps what
    /// Burn's ReLU keeps and runs the backend's kernel hooks ([`relu`](crate::relu)).
    fn relu_layer(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// Evaluation-mode batch norm of `x` with the running statistics: `[gamma, beta, mean,
    /// var]`, `[channels]` each, computed in `work`, returned in `x`'s dtype.
    fn batch_norm_eval(
        x: FloatTensor<Self>,
        params: [FloatTensor<Self>; 4],
        work: DType,
        epsilon: f64,
    ) -> FloatTensor<Self>;

    /// Training-mode conv (no bias) → batch norm → ReLU: the ReLU output and the batch
    /// statistics. The conv computes in the dtype of `x` (`weight` is cast to it), batch norm
    /// in `work`.
    #[allow(clippy::too_many_arguments)]
    fn conv_bn_relu_train(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        options: ConvOptions<2>,
        work: DType,
        epsilon: f64,
        cx: &RunContext,
    ) -> BatchNormOutput<Self>;

    /// Conv with bias → ReLU → `k`×`k` max-pool (stride `k`), in the dtype of `x` (`weight`
    /// and `bias` are cast to it).
    fn conv_relu_pool(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        options: ConvOptions<2>,
        k: usize,
        cx: &RunContext,
    ) -> FloatTensor<Self>;

    /// `x · W + b`, with `weight` (`[in, out]`) and `bias` cast to the dtype of `x`. Under
    /// autodiff, one op that keeps no half copy of the weight and makes the input gradient a
    /// slice of rows at a time.
    fn sliced_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        cx: &RunContext,
    ) -> FloatTensor<Self>;

    /// Max-pool over `window` (no dilation, floor rounding), Burn's computation. Under
    /// autodiff, `cx`'s listener hears backward at its peak moment as `at` ([`max_pool`]).
    fn max_pool(
        x: FloatTensor<Self>,
        window: PoolWindow,
        at: Boundary,
        cx: &RunContext,
    ) -> FloatTensor<Self>;

    /// Causal attention of `q`, `k`, `v` (`[batch, heads, seq, head_dim]`, one dtype), equal
    /// to [`attention::naive`] within rounding. Under autodiff, one graph op that keeps its
    /// inputs, its output and one f32 log-sum-exp per row, and recomputes the scores in
    /// backward ([`attention`]).
    fn memory_efficient_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `x` unchanged. Under autodiff, `cx`'s listener hears the forward pass cross `at` and,
    /// later, the backward pass; a plain backend (inference) has no backward to pair with and
    /// reports nothing.
    fn boundary(x: FloatTensor<Self>, at: Boundary, cx: &RunContext) -> FloatTensor<Self>;

    /// The key under which a parameter's window sum is [lent](RunContext::lend) to the ops of a
    /// backward pass: the parameter tensor's autodiff node. `None` on a plain backend (no
    /// backward pass).
    fn grad_sum_key(param: &FloatTensor<Self>) -> Option<u64>;
}

/// A plain backend: each op composed from the kernel hooks, nothing kept.
impl<B: Kernels> ModelBackend for B {
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
        _: &RunContext,
    ) -> BatchNormOutput<Self> {
        batch_norm::batch_norm_plain::<B>(x, gamma, beta, work, epsilon)
    }

    fn conv2d_layer(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv2d::conv2d_plain::<B>(x, weight, bias, options)
    }

    fn relu_layer(x: FloatTensor<Self>) -> FloatTensor<Self> {
        B::float_relu(x)
    }

    fn batch_norm_eval(
        x: FloatTensor<Self>,
        params: [FloatTensor<Self>; 4],
        work: DType,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        B::batch_norm_inference(x, params, work, epsilon)
    }

    fn conv_bn_relu_train(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        options: ConvOptions<2>,
        work: DType,
        epsilon: f64,
        _: &RunContext,
    ) -> BatchNormOutput<Self> {
        conv_bn_relu::conv_bn_relu_plain::<B>(x, weight, gamma, beta, options, work, epsilon)
    }

    fn conv_relu_pool(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        options: ConvOptions<2>,
        k: usize,
        _: &RunContext,
    ) -> FloatTensor<Self> {
        conv_relu_pool::conv_relu_pool_plain::<B>(x, weight, bias, options, k)
    }

    fn sliced_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        _: &RunContext,
    ) -> FloatTensor<Self> {
        B::linear_forward(x, weight, bias)
    }

    fn max_pool(
        x: FloatTensor<Self>,
        window: PoolWindow,
        _: Boundary,
        _: &RunContext,
    ) -> FloatTensor<Self> {
        max_pool::max_pool_plain::<B>(x, window)
    }

    fn memory_efficient_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        attention::memory_efficient_plain::<B>(q, k, v)
    }

    fn boundary(x: FloatTensor<Self>, _: Boundary, _: &RunContext) -> FloatTensor<Self> {
        x
    }

    fn grad_sum_key(_: &FloatTensor<Self>) -> Option<u64> {
        None
    }
}

/// Autodiff over a plain backend: each op one graph op (see each op's module).
impl<B: Kernels, C: CheckpointStrategy> ModelBackend for Autodiff<B, C> {
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
        cx: &RunContext,
    ) -> BatchNormOutput<Self> {
        batch_norm::batch_norm_autodiff::<B, C>(x, gamma, beta, work, epsilon, cx)
    }

    fn conv2d_layer(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv2d::conv2d_autodiff::<B, C>(x, weight, bias, options)
    }

    fn relu_layer(x: FloatTensor<Self>) -> FloatTensor<Self> {
        relu::relu_autodiff::<B, C>(x)
    }

    /// Composed from tensor ops (differentiable; evaluation runs on the plain backend).
    fn batch_norm_eval(
        x: FloatTensor<Self>,
        params: [FloatTensor<Self>; 4],
        work: DType,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        batch_norm::inference_composed::<Self>(x, params, work, epsilon)
    }

    fn conv_bn_relu_train(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        options: ConvOptions<2>,
        work: DType,
        epsilon: f64,
        cx: &RunContext,
    ) -> BatchNormOutput<Self> {
        let (w, g) = (weight, gamma);
        conv_bn_relu::conv_bn_relu_autodiff::<B, C>(x, w, g, beta, options, work, epsilon, cx)
    }

    fn conv_relu_pool(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        options: ConvOptions<2>,
        k: usize,
        cx: &RunContext,
    ) -> FloatTensor<Self> {
        conv_relu_pool::conv_relu_pool_autodiff::<B, C>(x, weight, bias, options, k, cx)
    }

    fn sliced_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        cx: &RunContext,
    ) -> FloatTensor<Self> {
        sliced_linear::linear_autodiff::<B, C>(x, weight, bias, cx)
    }

    fn max_pool(
        x: FloatTensor<Self>,
        window: PoolWindow,
        at: Boundary,
        cx: &RunContext,
    ) -> FloatTensor<Self> {
        max_pool::max_pool_autodiff::<B, C>(x, window, at, cx)
    }

    fn memory_efficient_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        attention::memory_efficient_autodiff::<B, C>(q, k, v)
    }

    fn boundary(x: FloatTensor<Self>, at: Boundary, cx: &RunContext) -> FloatTensor<Self> {
        boundary::boundary_autodiff::<B, C>(x, at, cx)
    }

    fn grad_sum_key(param: &FloatTensor<Self>) -> Option<u64> {
        Some(param.node.id.value)
    }
}
