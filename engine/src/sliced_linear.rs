//! A linear layer as one autodiff op whose backward makes its input gradient a slice of rows at
//! a time, and which keeps no half copy of its weight.
//!
//! Composed, backward computes `dx = dy · Wᵀ` for the whole batch in one matmul. SimpleModel's
//! classifier reads 16,384 features per image, so `dx` is as large as the pooled feature maps,
//! and the CPU backend's matmul copies its output once more to realign it: the input gradient
//! existed twice at the worst instant of backward. Here each slice's `dx` is written into one
//! tensor allocated at the first slice, after the weight gradient, which is summed over the
//! slices in f32 ([`Kernels::float_add_matmul`]: on the CPU, gemm adds each slice's
//! product into the one f32 sum, so no product, realigning copy or widened operand larger
//! than a slice exists beside it).
//!
//! ```text
//! forward   out = x · cast(W) + cast(b)                     keeps x, W (the f32 master), b
//! backward  dW = Σᵢ xᵢᵀ · dyᵢ      db = Σ dy      then per slice: dxᵢ = dyᵢ · cast(W)ᵀ
//! ```
//! Written over backend primitives: the same on Flex, CUDA and wgpu. The slices are
//! [`Kernels::slice_values`]'s: on CubeCL one slice is the whole batch (one matmul each way).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorMetadata};

use crate::cast::{cast_prim, float, prim};
use crate::context::RunContext;
use crate::footprint::{Family, Footprint, Sizes};
use crate::kernels::Kernels;
use crate::slices::{assign, parameter_grad, rows, slice_values, slices};

/// `x · W + b` with `W` and `b` cast to the dtype of `x`, a slice of rows at a time
/// ([`Kernels::slice_values`]: the CPU backend's half-precision matmul works on an f32 copy of
/// its operand, a slice's, then; CubeCL takes the whole batch).
///
/// # Shapes
/// `x [batch, in]`, `weight [in, out]`, `bias [out]` → `[batch, out]`
pub(crate) fn linear_plain<B: Kernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: FloatTensor<B>,
) -> FloatTensor<B> {
    let dtype = x.dtype();
    let w = float::<B, 2>(cast_prim::<B>(weight, dtype));
    let b = float::<B, 1>(cast_prim::<B>(bias, dtype)).unsqueeze::<2>();
    let [n, features] = x.shape().dims();
    let mut out = None;
    for (start, len) in slices::<B>(n, features) {
        let xs = float::<B, 2>(rows::<B, 2>(&x, start, len));
        out = Some(assign(out, n, start, xs.matmul(w.clone()) + b.clone()));
    }
    prim(out.expect("a batch has at least one row, so one slice"))
}

/// `dy · cast(W)ᵀ` (`dy [batch, out]`, the f32 master `W [in, out]`) in the dtype of `dy`, a
/// slice of rows at a time ([`Kernels::slice_values`]): the weight as forward used it, cast again from the master copy,
/// not kept.
pub fn input_grad_sliced<B: Kernels>(
    dout: FloatTensor<B>,
    weight: FloatTensor<B>,
    features: usize,
) -> FloatTensor<B> {
    let wt = float::<B, 2>(cast_prim::<B>(weight, dout.dtype())).transpose();
    let [n, _] = dout.shape().dims();
    let mut dx = None;
    for (start, len) in slices::<B>(n, features) {
        let dy = float::<B, 2>(rows::<B, 2>(&dout, start, len));
        dx = Some(assign(dx, n, start, dy.matmul(wt.clone())));
    }
    prim(dx.expect("a batch has at least one row, so one slice"))
}

#[derive(Debug)]
struct LinearBackward;

impl<B: Kernels> Backward<B, 3> for LinearBackward {
    type State = ([NodeId; 3], RunContext);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let ([x_id, w_id, b_id], cx) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        let w = ckpt.retrieve_node_output::<FloatTensor<B>>(w_id);
        let b = ckpt.retrieve_node_output::<FloatTensor<B>>(b_id);
        let (like_w, like_b) = (w.dtype(), b.dtype());

        let [n, features] = x.shape().dims();
        // The weight gradient first, while the input gradient does not exist yet: a slice of
        // the batch at a time, xᵢᵀ · dyᵢ, summed in f32.
        if let Some(node) = node_w {
            let mut dw = None;
            for (start, len) in slices::<B>(n, features) {
                let xt = prim(float::<B, 2>(rows::<B, 2>(&x, start, len)).transpose());
                let dy = rows::<B, 2>(&dout, start, len);
                dw = Some(B::float_add_matmul(dw, xt, dy));
            }
            let dw = dw.expect("a batch has at least one row, so one slice");
            cx.register_param::<B>(grads, node.id, parameter_grad::<B>(dw, x.dtype(), like_w));
        }
        if let Some(node) = node_x {
            let dx = B::linear_input_grad(dout.clone(), w, features);
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = node_b {
            // Summed in f32: a half-precision sum over a large batch loses digits.
            let compute = dout.dtype();
            let dy = float::<B, 2>(cast_prim::<B>(dout, DType::F32));
            let db = prim(dy.sum_dim(0).squeeze::<1>());
            cx.register_param::<B>(grads, node.id, parameter_grad::<B>(db, compute, like_b));
        }
    }
}

/// The layer as one autodiff op (see the module's text).
pub(crate) fn linear_autodiff<B: Kernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
    cx: &RunContext,
) -> FloatTensor<Autodiff<B, C>> {
    let out = B::linear_forward(
        x.primitive.clone(),
        weight.primitive.clone(),
        bias.primitive.clone(),
    );
    let parents = [x.node.clone(), weight.node.clone(), bias.node.clone()];
    match LinearBackward
        .prepare::<C>(parents)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let ids = [&x, &weight, &bias].map(|t| prep.checkpoint(t));
            prep.finish((ids, cx.clone()), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// What the layer holds at `sizes` for `input` → `output` values per image and a `weight` of
/// that many elements: it keeps its input (unless the op before keeps it: `shared_input`).
/// Its backward sums the weight gradient over slices in f32 first — on the CPU gemm adds each
/// slice's product into the one sum (in half precision rounded through the compute dtype at
/// the end: 6 bytes a weight), on CubeCL the sum and the add's result beside a slice's product
/// —, then makes the input gradient a slice at a time: a slice's realigning copy and product
/// (two slices of the input; on CubeCL no realigning copy, and one slice is the whole batch:
/// the product is the input gradient) beside the output's and the input's gradients. The weight
/// gradient stays in the graph's gradients until backward ends.
pub(crate) fn footprint(
    s: &Sizes,
    input: u64,
    output: u64,
    weight: u64,
    shared_input: bool,
) -> Footprint {
    let each = match (s.family, s.compute) {
        (Family::Cpu, 2) => 6,
        (Family::Cpu, _) => 4,
        (Family::CubeCl, c) => 8 + c,
    };
    let slice = slice_values(s.family.slice_values(), s.batch, input);
    let scratch = match s.family {
        // A slice's product and its realigning copy.
        Family::Cpu => 2 * slice,
        // The product; one slice's product is the input gradient itself.
        Family::CubeCl if slice == s.batch * input => 0,
        Family::CubeCl => slice,
    };
    let input_grad = s.acts(input + output) + scratch * s.compute;
    let weight_sum = s.acts(output) + weight * each;
    Footprint {
        saved: if shared_input { 0 } else { s.acts(input) },
        saved_values: if shared_input { 0 } else { s.batch * input },
        recomputable: 0,
        backward: input_grad.max(weight_sum),
        weight_grad: weight,
        output_grad: s.acts(output),
    }
}
