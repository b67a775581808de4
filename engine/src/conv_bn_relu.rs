//! Conv → batch norm → ReLU as one autodiff op that keeps two tensors where the composed ops
//! keep three.
//!
//! Composed, autodiff keeps the conv's input, the batch norm's input (the conv output) *and*
//! the ReLU's input (the batch-norm output). This op keeps the conv input (the previous
//! block's output, which that block's op shares), the batch-norm input in the dtype it was
//! computed in, and per-channel statistics; in backward it recomputes the batch-norm output
//! from them, bit for bit, for the ReLU's mask. The idea is In-Place Activated BatchNorm's
//! (Rota Bulò et al., CVPR 2018), which recomputes instead of keeping.
//!
//! ```text
//! forward   z = conv(x, w)     y = BN(z)     out = relu(y)        keeps x, z, μ, 1/σ
//! backward  y = BN(z) again → dy = dout·[y > 0] → dz, dγ, dβ (BN) → dx, dw (conv)
//! ```
//! The conv computes in the input's dtype; the weight may come as the f32 master copy and is
//! cast inside the op (forward, and in backward by the backend's conv gradients, which on the
//! CPU round it as they read it), so no half copy of it is kept.
//! Everything is written over backend primitives, so it runs on Flex, CUDA and wgpu alike.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::DType;

use crate::batch_norm::{BatchNormOutput, SavedStats};
use crate::context::RunContext;
use crate::footprint::{Footprint, Sizes};
use crate::kernels::Kernels;

/// The composed block, for backends without an autodiff graph.
pub(crate) fn conv_bn_relu_plain<B: Kernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    options: ConvOptions<2>,
    work: DType,
    epsilon: f64,
) -> BatchNormOutput<B> {
    let z = B::float_conv2d(x, weight, options);
    let [output, mean, var, _] = B::bn_relu_forward(z, gamma, beta, work, epsilon);
    BatchNormOutput { output, mean, var }
}

/// What backward reads besides the graph's own tensors.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    /// The batch-norm input (the conv output), in the dtype the conv computed it in.
    z: FloatTensor<B>,
    stats: SavedStats<B>,
    options: ConvOptions<2>,
}

#[derive(Debug)]
struct ConvBnReluBackward;

impl<B: Kernels> Backward<B, 4> for ConvBnReluBackward {
    /// The checkpointed x, w, γ, β, then the rest.
    type State = ([NodeId; 4], Saved<B>, RunContext);

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [node_x, node_w, node_gamma, node_beta] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let ([x_id, w_id, gamma_id, beta_id], saved, cx) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        let w = ckpt.retrieve_node_output::<FloatTensor<B>>(w_id);
        let gamma = ckpt.retrieve_node_output::<FloatTensor<B>>(gamma_id);
        let beta = ckpt.retrieve_node_output::<FloatTensor<B>>(beta_id);

        // The ReLU's mask, from the batch-norm output recomputed exactly as forward made it.
        let stats = saved.stats;
        let [dz, dgamma, dbeta] = B::bn_relu_backward(
            saved.z, gamma, beta, stats.mean, stats.rstd, stats.work, dout,
        );

        // The conv's gradients from the master weight, which the backend casts (or rounds as
        // it reads) as forward did: no half copy of it is kept or made here.
        // The weight's first: it is the last reader of x's values, which can then go before
        // the input gradient is made.
        if let Some(node) = node_w {
            let dw = B::float_conv2d_weight_backward(
                x.clone(),
                w.clone(),
                dz.clone(),
                saved.options.clone(),
            );
            cx.register_param::<B>(grads, node.id, dw);
        }
        if let Some(node) = node_x {
            let dx = B::float_conv2d_x_backward(x, w, dz, saved.options);
            grads.register::<B>(node.id, dx);
        }
        for (node, g) in [(node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                cx.register_param::<B>(grads, node.id, g);
            }
        }
    }
}

/// The block as one autodiff op. Returns the ReLU output and the batch statistics (for the
/// running averages), as [`batch_norm::batch_norm_autodiff`] does for batch norm alone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_bn_relu_autodiff<B: Kernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    beta: FloatTensor<Autodiff<B, C>>,
    options: ConvOptions<2>,
    work: DType,
    epsilon: f64,
    cx: &RunContext,
) -> BatchNormOutput<Autodiff<B, C>> {
    // The master weight: the backend casts it (or rounds it as it reads it).
    let z = B::float_conv2d(
        x.primitive.clone(),
        weight.primitive.clone(),
        options.clone(),
    );
    let [output, mean, var, rstd] = B::bn_relu_forward(
        z.clone(),
        gamma.primitive.clone(),
        beta.primitive.clone(),
        work,
        epsilon,
    );
    let inner = <Autodiff<B, C> as AutodiffBackend>::from_inner;
    let saved = Saved {
        z,
        stats: SavedStats {
            mean: mean.clone(),
            rstd,
            work,
        },
        options,
    };
    let (mean, var) = (inner(mean), inner(var));
    let parents = [
        x.node.clone(),
        weight.node.clone(),
        gamma.node.clone(),
        beta.node.clone(),
    ];
    let output = match ConvBnReluBackward
        .prepare::<C>(parents)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let ids = [&x, &weight, &gamma, &beta].map(|t| prep.checkpoint(t));
            prep.finish((ids, saved, cx.clone()), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(output),
    };
    BatchNormOutput { output, mean, var }
}

/// What the block holds at `sizes` for `input` → `output` values per image: it keeps its input
/// and the batch-norm input (the conv output, as large as its output); its backward makes the
/// recomputed BN output, the masked gradient and the BN input's gradient beside the output's
/// and the input's. On the CPU in bf16 the conv's gradients convert the input and the conv
/// output's gradient to f32 (each twice).
pub(crate) fn footprint(s: &Sizes, input: u64, output: u64) -> Footprint {
    Footprint {
        saved: s.acts(input + output),
        saved_values: s.batch * (input + output),
        recomputable: 0,
        backward: s.acts(input + 4 * output) + s.cpu_bf16_f32(2 * (input + output)),
        weight_grad: 0,
        output_grad: s.acts(output),
    }
}
