//! The composed conv layer as a graph op whose kernels are the backend's hooks.
//!
//! It keeps what Burn's own conv keeps (its input, its weight and bias as given: the caller's
//! compute-dtype copies) and computes what Burn's computes; what differs is underneath: the
//! forward, both gradients and the bias run through [`Kernels`], so on the CPU the composed
//! layers get the direct convs the fused blocks use (Flex's conv made SimpleModel's composed
//! step five times slower than PyTorch's), and on CubeCL the backend's own conv as before.
//!
//! ```text
//! forward   z = conv(x, w) (+ b)                       keeps x, w (, b)
//! backward  db = Σ dz    dw = dz ⋆ x    dx = dz ⋆ᵀ w    (each only where a parent wants it)
//! ```
//! Results keep the layout the kernels make them in (on the CPU, channels last for the direct
//! depthwise and pointwise convs): the batch norm, ReLU, pooling and conv kernels after them
//! read either layout, and Flex's own ops read any strides.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::TensorMetadata;

use crate::kernels::Kernels;

/// `conv(x, weight) (+ bias)` in `x`'s dtype, handed on as a composed layer's result.
pub(crate) fn conv2d_plain<B: Kernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    options: ConvOptions<2>,
) -> FloatTensor<B> {
    B::float_conv2d_layer(x, weight, bias, options)
}

/// The input and weight gradients of the conv, each where `wanted`: the weight's first (it
/// reads `x`, which the input gradient's hook may drop).
fn grads<B: Kernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    dz: &FloatTensor<B>,
    options: &ConvOptions<2>,
    [want_x, want_w]: [bool; 2],
) -> [Option<FloatTensor<B>>; 2] {
    let dw = want_w.then(|| {
        B::float_conv2d_weight_backward(x.clone(), weight.clone(), dz.clone(), options.clone())
    });
    let dx = want_x.then(|| B::float_conv2d_x_backward(x, weight, dz.clone(), options.clone()));
    [dx, dw]
}

#[derive(Debug)]
struct Conv2dBackward;

impl<B: Kernels> Backward<B, 2> for Conv2dBackward {
    type State = (NodeId, NodeId, ConvOptions<2>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents.map(|p| p.map(|n| n.id));
        let dz = grads.consume::<B>(&ops.node);
        let (x_id, w_id, options) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        let w = ckpt.retrieve_node_output::<FloatTensor<B>>(w_id);
        let wanted = [node_x.is_some(), node_w.is_some()];
        let [dx, dw] = self::grads::<B>(x, w, &dz, &options, wanted);
        drop(dz);
        register::<B, _>(grads, [(node_x, dx), (node_w, dw)]);
    }
}

#[derive(Debug)]
struct Conv2dBiasBackward;

impl<B: Kernels> Backward<B, 3> for Conv2dBiasBackward {
    type State = (NodeId, NodeId, NodeId, ConvOptions<2>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents.map(|p| p.map(|n| n.id));
        let dz = grads.consume::<B>(&ops.node);
        let (x_id, w_id, b_id, options) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        let w = ckpt.retrieve_node_output::<FloatTensor<B>>(w_id);
        let b = ckpt.retrieve_node_output::<FloatTensor<B>>(b_id);
        let db = node_b
            .is_some()
            .then(|| B::float_bias_grad(dz.clone(), b.dtype()));
        drop(b);
        let wanted = [node_x.is_some(), node_w.is_some()];
        let [dx, dw] = self::grads::<B>(x, w, &dz, &options, wanted);
        drop(dz);
        register::<B, _>(grads, [(node_x, dx), (node_w, dw), (node_b, db)]);
    }
}

/// Hands each parent that wants one its gradient.
fn register<B: Kernels, const N: usize>(
    grads: &mut Gradients,
    pairs: [(Option<NodeId>, Option<FloatTensor<B>>); N],
) {
    for (node, grad) in pairs {
        if let (Some(node), Some(grad)) = (node, grad) {
            grads.register::<B>(node, grad);
        }
    }
}

/// The composed conv as one graph op (see the module's text): keeps `x`, `weight` and `bias`
/// as Burn's conv does (checkpointed, so a recomputable input is recomputed, not kept).
pub(crate) fn conv2d_autodiff<B: Kernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    options: ConvOptions<2>,
) -> FloatTensor<Autodiff<B, C>> {
    match bias {
        Some(bias) => match Conv2dBiasBackward
            .prepare::<C>([x.node.clone(), weight.node.clone(), bias.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (
                    prep.checkpoint(&x),
                    prep.checkpoint(&weight),
                    prep.checkpoint(&bias),
                    options.clone(),
                );
                let z =
                    conv2d_plain::<B>(x.primitive, weight.primitive, Some(bias.primitive), options);
                prep.finish(state, z)
            }
            OpsKind::UnTracked(prep) => prep.finish(conv2d_plain::<B>(
                x.primitive,
                weight.primitive,
                Some(bias.primitive),
                options,
            )),
        },
        None => match Conv2dBackward
            .prepare::<C>([x.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (
                    prep.checkpoint(&x),
                    prep.checkpoint(&weight),
                    options.clone(),
                );
                prep.finish(
                    state,
                    conv2d_plain::<B>(x.primitive, weight.primitive, None, options),
                )
            }
            OpsKind::UnTracked(prep) => prep.finish(conv2d_plain::<B>(
                x.primitive,
                weight.primitive,
                None,
                options,
            )),
        },
    }
}
