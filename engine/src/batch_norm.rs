//! Training-mode batch norm as one autodiff op that computes in a chosen dtype and saves only
//! what its backward needs: its input (in the dtype it arrived in, f16 under mixed precision)
//! and two per-channel vectors (mean and 1/σ).
//!
//! Composing batch norm from tensor ops (as `burn::nn::BatchNorm` does) makes autodiff keep
//! every intermediate: under mixed precision, with BN "kept in f32" by casting its input, that
//! is an f32 copy of every BN input and of the normalised result. cuDNN's fused batch norm, which
//! PyTorch autocast uses, saves only the input and the statistics; this op does the same.
//!
//! ```text
//! forward  x̂ = (x − μ)·r,  r = 1/√(σ² + ε),  y = γ·x̂ + β       (μ, σ² over N, H, W; biased σ²)
//! backward dβ = Σ dy,  dγ = Σ dy·x̂,  dx = γ·r·(dy − mean(dy) − x̂·mean(dy·x̂))
//! ```
//! Both passes compute in the working dtype and return results in the dtypes of their inputs.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

use crate::cast::{convert as cast, float, prim};
use crate::context::RunContext;
use crate::footprint::{Footprint, Sizes};
use crate::kernels::Kernels;

/// What a training-mode batch norm returns: the output, in the input's dtype, and the batch
/// statistics, `[channels]` in the working dtype, for the running averages.
pub struct BatchNormOutput<B: Backend> {
    /// Normalised, scaled and shifted input.
    pub output: FloatTensor<B>,
    /// Per-channel batch mean.
    pub mean: FloatTensor<B>,
    /// Per-channel biased batch variance.
    pub var: FloatTensor<B>,
}

/// The composed batch norm, for backends without an autodiff graph to save into.
pub(crate) fn batch_norm_plain<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    work: DType,
    epsilon: f64,
) -> BatchNormOutput<B> {
    let [output, mean, var, _] = B::batch_norm_forward(x, gamma, beta, work, epsilon);
    BatchNormOutput { output, mean, var }
}

/// Evaluation-mode batch norm composed from tensor ops: `x` normalised with the running
/// `mean` and `var` (`[channels]`), scaled and shifted, computed in `work` and returned in
/// `x`'s dtype. Backends without kernel hooks run it; the CPU kernels are tested against it.
pub fn inference_composed<B: Backend>(
    x: FloatTensor<B>,
    [gamma, beta, mean, var]: [FloatTensor<B>; 4],
    work: DType,
    epsilon: f64,
) -> FloatTensor<B> {
    let x: Tensor<B, 4> = float(x);
    let (dtype, channels) = (x.dtype(), x.dims()[1]);
    let per_channel = |v: FloatTensor<B>| {
        let v: Tensor<B, 1> = float(v);
        crate::cast::cast(v, work).reshape([1, channels, 1, 1])
    };
    let rstd = per_channel(var).add_scalar(epsilon).sqrt().recip();
    let scale = rstd * per_channel(gamma);
    let y = (crate::cast::cast(x, work) - per_channel(mean)) * scale + per_channel(beta);
    prim(crate::cast::cast(y, dtype))
}

/// Everything the forward pass computes; the autodiff op keeps `mean` and `rstd`.
pub struct Forward<B: Backend> {
    /// Normalised, scaled and shifted input, in its dtype.
    pub output: FloatTensor<B>,
    /// Per-channel batch mean, in the working dtype.
    pub mean: FloatTensor<B>,
    /// Per-channel biased batch variance, in the working dtype.
    pub var: FloatTensor<B>,
    /// Per-channel 1/√(var + ε), in the working dtype.
    pub rstd: FloatTensor<B>,
}

/// Mean over batch, height and width, one axis at a time: the partial sums stay small, so a
/// half-precision working dtype does not overflow on large batches.
fn channel_mean<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    x.mean_dim(0).mean_dim(2).mean_dim(3)
}

/// `[channels]` → `[batch, channels, 1, 1]`, cast to `dtype`.
fn per_channel<B: Kernels>(v: FloatTensor<B>, dtype: DType, batch: usize) -> Tensor<B, 4> {
    let v: Tensor<B, 1> = cast(float(v), dtype);
    let c = v.dims()[0];
    rows(v.reshape([1, c, 1, 1]), batch)
}

/// `[1, channels, 1, 1]` as the per-channel operand over `batch` images:
/// [`Kernels::per_channel_rows`] (broadcast as it is, or copied where the backend wants rows).
fn rows<B: Kernels>(v: Tensor<B, 4>, batch: usize) -> Tensor<B, 4> {
    float(B::per_channel_rows(prim(v), batch))
}

fn flat<B: Backend>(v: Tensor<B, 4>) -> FloatTensor<B> {
    let c = v.dims()[1];
    prim(v.reshape([c]))
}

/// Training-mode batch norm composed from tensor ops, computed in `work`: what backends without
/// kernel hooks run, and the reference the CPU kernels are tested against.
pub fn forward<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    work: DType,
    epsilon: f64,
) -> Forward<B> {
    let x: Tensor<B, 4> = float(x);
    let dtype = x.dtype();
    let n = x.dims()[0];
    let xw = cast(x, work);
    let mean = channel_mean(xw.clone());
    let centered = xw - rows(mean.clone(), n);
    let var = channel_mean(centered.clone().square());
    let rstd = var.clone().add_scalar(epsilon).sqrt().recip();
    let y = scale_shift(centered, rows(rstd.clone(), n), gamma, beta, work);
    Forward {
        output: prim(cast(y, dtype)),
        mean: flat(mean),
        var: flat(var),
        rstd: flat(rstd),
    }
}

/// [`forward`] followed by a ReLU, as `[output, mean, var, rstd]`: the composed form of
/// [`Kernels::bn_relu_forward`].
pub(crate) fn forward_relu<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    work: DType,
    epsilon: f64,
) -> [FloatTensor<B>; 4] {
    let f = forward::<B>(x, gamma, beta, work, epsilon);
    [B::relu(f.output), f.mean, f.var, f.rstd]
}

/// `centered · (r·γ) + β`, the last step of the forward pass. One function, so a fused op
/// that recomputes the output in backward (to rebuild a ReLU's mask) gets the very same bits.
fn scale_shift<B: Kernels>(
    centered: Tensor<B, 4>,
    rstd_rows: Tensor<B, 4>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    work: DType,
) -> Tensor<B, 4> {
    let n = centered.dims()[0];
    let scale = rstd_rows * per_channel(gamma, work, n);
    centered * scale + per_channel(beta, work, n)
}

/// The forward output again, in `x`'s dtype, from the saved input and statistics: what
/// [`forward`] returned, bit for bit.
pub(crate) fn recompute<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    stats: &SavedStats<B>,
) -> FloatTensor<B> {
    let x: Tensor<B, 4> = float(x);
    let (dtype, n, work) = (x.dtype(), x.dims()[0], stats.work);
    let centered = cast(x, work) - per_channel(stats.mean.clone(), work, n);
    let rstd = per_channel(stats.rstd.clone(), work, n);
    prim(cast(scale_shift(centered, rstd, gamma, beta, work), dtype))
}

/// Gradients `[dx, dγ, dβ]` of [`forward`] from the saved input and statistics, composed from
/// tensor ops in the statistics' working dtype (`dx` in `x`'s dtype, dγ and dβ in γ's).
pub fn backward<B: Kernels>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    state: &SavedStats<B>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 3] {
    let x: Tensor<B, 4> = float(x);
    let [n, _, h, w] = x.dims();
    let count = (n * h * w) as f64;
    let (x_dtype, param_dtype) = (x.dtype(), float::<B, 1>(gamma.clone()).dtype());
    let work = state.work;
    let xhat = (cast(x, work) - per_channel(state.mean.clone(), work, n))
        * per_channel(state.rstd.clone(), work, n);
    let dy = cast(float::<B, 4>(grad), work);
    let mean_dy = channel_mean(dy.clone());
    let mean_dy_xhat = channel_mean(dy.clone() * xhat.clone());
    let scale = per_channel(gamma, work, n) * per_channel(state.rstd.clone(), work, n);
    let dx = (dy - rows(mean_dy.clone(), n) - xhat * rows(mean_dy_xhat.clone(), n)) * scale;
    // Σ = mean · count, scaled in f32 so a half working dtype cannot overflow here.
    let sum = |m: Tensor<B, 4>| {
        let m: Tensor<B, 1> = float(flat(m));
        prim(cast(cast(m, DType::F32).mul_scalar(count), param_dtype))
    };
    [prim(cast(dx, x_dtype)), sum(mean_dy_xhat), sum(mean_dy)]
}

/// The gradients `[dz, dγ, dβ]` of batch norm followed by a ReLU, from batch norm's saved input
/// `z`, its statistics (`[mean, rstd]` in `work`) and the ReLU output's gradient `dout`: the
/// ReLU's mask is rebuilt from the recomputed output, then [`backward`] runs on the masked
/// gradient.
pub(crate) fn relu_backward<B: Kernels>(
    z: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    [mean, rstd]: [FloatTensor<B>; 2],
    work: DType,
    dout: FloatTensor<B>,
) -> [FloatTensor<B>; 3] {
    let stats = SavedStats { mean, rstd, work };
    let y = recompute::<B>(z.clone(), gamma.clone(), beta, &stats);
    let dy = B::relu_backward(y, dout);
    backward::<B>(z, gamma, &stats, dy)
}

/// Per-channel statistics the backward pass needs, in the working dtype.
#[derive(Clone, Debug)]
pub struct SavedStats<B: Backend> {
    /// Per-channel batch mean.
    pub mean: FloatTensor<B>,
    /// Per-channel 1/√(var + ε).
    pub rstd: FloatTensor<B>,
    /// The dtype batch norm computes in.
    pub work: DType,
}

#[derive(Debug)]
struct BatchNormBackward;

impl<B: Kernels> Backward<B, 3> for BatchNormBackward {
    type State = (NodeId, NodeId, SavedStats<B>, RunContext);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x_id, gamma_id, stats, cx) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        let gamma = ckpt.retrieve_node_output::<FloatTensor<B>>(gamma_id);
        let [dx, dgamma, dbeta] =
            B::batch_norm_backward(x, gamma, [stats.mean, stats.rstd], stats.work, grad);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, dx);
        }
        for (node, g) in [(node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                cx.register_param::<B>(grads, node.id, g);
            }
        }
    }
}

/// Batch norm as one autodiff op: the graph keeps `x`, `gamma` and the per-channel statistics.
pub(crate) fn batch_norm_autodiff<B: Kernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    beta: FloatTensor<Autodiff<B, C>>,
    work: DType,
    epsilon: f64,
    cx: &RunContext,
) -> BatchNormOutput<Autodiff<B, C>> {
    let [output, f_mean, f_var, rstd] = B::batch_norm_forward(
        x.primitive.clone(),
        gamma.primitive.clone(),
        beta.primitive.clone(),
        work,
        epsilon,
    );
    let inner = <Autodiff<B, C> as AutodiffBackend>::from_inner;
    let (mean, var) = (inner(f_mean.clone()), inner(f_var));
    let stats = SavedStats {
        mean: f_mean,
        rstd,
        work,
    };
    let output = match BatchNormBackward
        .prepare::<C>([x.node.clone(), gamma.node.clone(), beta.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let x_id = prep.checkpoint(&x);
            let gamma_id = prep.checkpoint(&gamma);
            prep.finish((x_id, gamma_id, stats, cx.clone()), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    };
    BatchNormOutput { output, mean, var }
}

/// What the op holds at `sizes` over `elements` values per image: it keeps its input (and two
/// per-channel vectors, left out); its backward has the output's and the input's gradients.
pub(crate) fn footprint(s: &Sizes, elements: u64) -> Footprint {
    Footprint::keeps_input(s, elements)
}
