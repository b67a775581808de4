//! Conv (with bias) → ReLU → k×k max-pool as one autodiff op that keeps no full-resolution
//! tensor.
//!
//! Composed, autodiff keeps the ReLU's input (the conv output) and the max-pool's input (the
//! ReLU output), both at full resolution, plus the pool's argmax as the backend's int (8 bytes
//! per output on Flex). This op keeps the conv input, its own pooled output (which the next
//! layer keeps anyway) and, per output, which of the k² window positions won, as one byte.
//!
//! ```text
//! forward   z = conv(x, w) + b    (p, winner) = maxpool(z)    out = relu(p)
//! backward  g = dout·[out > 0], put at each window's winner → dz → dx, dw, db (conv)
//! ```
//! ReLU and max commute (`max(relu(z)) = relu(max(z))`, and a window whose maximum is not
//! positive gets no gradient either way), so pooling first is the same function and the same
//! gradient as the composed ReLU → max-pool, with a quarter of the ReLU's work.
//!
//! On the CPU, forward is one kernel for the whole batch (flex-kernels' `conv_pool.rs`: conv, bias, pool
//! and winners an image per thread) and, for the first layer, backward reads the weight and
//! bias gradients off the pooled gradient (flex-kernels' `pool_grad.rs`); otherwise the
//! backend's ops run a slice of images at a time on every backend
//! ([`bounded_slices`](crate::slices::bounded_slices)): that is the op's memory saving. A slice
//! is the CPU's cache-sized slice on the CPU, and the pooled output's size for the whole batch
//! on CubeCL (k² slices when k² divides the batch).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor, IntTensor, MaxPool2dWithIndices};
use burn::tensor::{Int, IntDType, Tensor, TensorMetadata};

use crate::cast::{cast_prim, float, prim};
use crate::context::RunContext;
use crate::footprint::{Family, Footprint, Sizes};
use crate::kernels::Kernels;
use crate::slices::{
    accumulate, assign, assign_int, bounded_limit, bounded_slices, int_rows, parameter_grad, rows,
    slice_values,
};

/// The composed block, for backends without an autodiff graph.
pub(crate) fn conv_relu_pool_plain<B: Kernels>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: FloatTensor<B>,
    options: ConvOptions<2>,
    k: usize,
) -> FloatTensor<B> {
    let (weight, bias) = (
        cast_prim::<B>(weight, x.dtype()),
        cast_prim::<B>(bias, x.dtype()),
    );
    let z = B::relu(B::conv2d(x, weight, Some(bias), options));
    B::max_pool2d(z, [k, k], [k, k], [0, 0], [1, 1], false)
}

/// `relu(maxpool_k(z))` (stride `k`, no padding) and, per output, the winner's place in its
/// window as a `u8`: the backend's max-pool with indices, then the indices turned into places.
pub(crate) fn relu_max_pool_plain<B: Backend>(
    z: FloatTensor<B>,
    k: usize,
) -> (FloatTensor<B>, IntTensor<B>) {
    let [_, _, _, width] = z.shape().dims();
    let MaxPool2dWithIndices { output, indices } =
        B::max_pool2d_with_indices(z, [k, k], [k, k], [0, 0], [1, 1], false);
    (B::relu(output), window_positions::<B>(indices, width, k))
}

/// Per output, the winner's place in its k×k window, `row · k + col`, as a `u8`.
fn window_positions<B: Backend>(indices: IntTensor<B>, width: usize, k: usize) -> IntTensor<B> {
    // The backend's argmax is a flat index into the input plane: row · width + col. Windows
    // start at multiples of k (stride k, no padding).
    let idx = Tensor::<B, 4, Int>::from_primitive(indices);
    let (k, width) = (k as i64, width as i64);
    let row = idx.clone().div_scalar(width).remainder_scalar(k);
    let col = idx.remainder_scalar(width).remainder_scalar(k);
    (row.mul_scalar(k) + col)
        .cast(IntDType::U8)
        .into_primitive()
}

/// `[n, c, ho, wo]` → `[n, c, ho, k, wo, k]`, each value repeated over its window: a view
/// (stride 0 on the window axes), nothing copied.
fn spread<B: Backend, K>(t: Tensor<B, 4, K>, k: usize) -> Tensor<B, 6, K>
where
    K: burn::tensor::BasicOps<B>,
{
    let [n, c, ho, wo] = t.dims();
    t.reshape([n, c, ho, 1, wo, 1]).expand([n, c, ho, k, wo, k])
}

/// The conv output's gradient: `g` at each window's winning position, zero elsewhere.
///
/// Worked on `[n, c, ho, k, wo, k]` views, so only the mask (one byte per input place) and the
/// result are allocated; the result's memory order is `[n, c, ho·k, wo·k]`'s.
fn unpool<B: Backend>(g: Tensor<B, 4>, positions: IntTensor<B>, k: usize) -> Tensor<B, 4> {
    let [n, c, ho, wo] = g.dims();
    let device = g.device();
    // Each place's position in its window, `a · k + b`, as a [1, 1, 1, k, 1, k] tensor.
    let rows = Tensor::<B, 1, Int>::arange(0..k as i64, &device)
        .mul_scalar(k as i64)
        .reshape([1, 1, 1, k, 1, 1]);
    let cols = Tensor::<B, 1, Int>::arange(0..k as i64, &device).reshape([1, 1, 1, 1, 1, k]);
    let shape = [n, c, ho, k, wo, k];
    let place = (rows.expand([1, 1, 1, k, 1, k]) + cols.expand([1, 1, 1, k, 1, k]))
        .cast(IntDType::U8)
        .expand(shape);
    let positions = Tensor::<B, 4, Int>::from_primitive(positions);
    let loser = spread(positions, k).not_equal(place);
    spread(g, k)
        .mask_fill(loser, 0.0)
        .reshape([n, c, ho * k, wo * k])
}

/// What backward reads besides the checkpointed x, w and b.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    /// The op's output (relu of the pooled conv output): its sign is the ReLU's mask.
    out: FloatTensor<B>,
    /// [`window_positions`] of the winners.
    positions: IntTensor<B>,
    options: ConvOptions<2>,
    k: usize,
}

#[derive(Debug)]
struct ConvReluPoolBackward;

impl<B: Kernels> Backward<B, 3> for ConvReluPoolBackward {
    type State = ([NodeId; 3], Saved<B>, RunContext);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let ([x_id, w_id, b_id], saved, cx) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        let w = ckpt.retrieve_node_output::<FloatTensor<B>>(w_id);
        let b = ckpt.retrieve_node_output::<FloatTensor<B>>(b_id);
        // The gradients go back in the parameters' dtype (f32 master weights); the conv
        // runs on them cast again to the input's dtype, as forward did.
        let like = (w.dtype(), b.dtype());
        let (w, b) = (cast_prim::<B>(w, x.dtype()), cast_prim::<B>(b, x.dtype()));
        let wanted = [node_x.is_some(), node_w.is_some(), node_b.is_some()];
        let [dx, dw, db] = B::conv_relu_pool_backward(
            &x,
            &w,
            &b,
            &saved.out,
            &dout,
            &saved.positions,
            &saved.options,
            saved.k,
            wanted,
        );
        if let (Some(node), Some(dx)) = (node_x, dx) {
            grads.register::<B>(node.id, dx);
        }
        for (node, g, dtype) in [(node_w, dw, like.0), (node_b, db, like.1)] {
            if let (Some(node), Some(g)) = (node, g) {
                let g = parameter_grad::<B>(g, x.dtype(), dtype);
                cx.register_param::<B>(grads, node.id, g);
            }
        }
    }
}

/// The default of [`Kernels::conv_relu_pool_backward`]: the conv output's gradient exists for
/// one slice of images at a time (on every backend); `dw` and `db` are summed over the slices
/// in f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_sliced<B: Kernels>(
    x: &FloatTensor<B>,
    w: &FloatTensor<B>,
    b: &FloatTensor<B>,
    out: &FloatTensor<B>,
    dout: &FloatTensor<B>,
    positions: &IntTensor<B>,
    options: &ConvOptions<2>,
    k: usize,
    [want_x, want_w, want_b]: [bool; 3],
) -> [Option<FloatTensor<B>>; 3] {
    let [n, c, ho, wo] = dout.shape().dims();
    let (mut dw, mut db, mut dx) = (None, None, None);
    for (start, len) in bounded_slices::<B>(n, c * ho * wo * k * k, k) {
        let g = B::relu_backward(
            rows::<B, 4>(out, start, len),
            rows::<B, 4>(dout, start, len),
        );
        let positions = int_rows::<B>(positions, start, len).into_primitive();
        let dz = prim(unpool::<B>(float(g), positions, k));
        let xs = rows::<B, 4>(x, start, len);
        // The composed conv layer's kernels ([`conv2d`](crate::conv2d)): the same bits
        // per image as the composed layers.
        if want_x {
            let dxs =
                B::float_conv2d_x_backward(xs.clone(), w.clone(), dz.clone(), options.clone());
            dx = Some(assign(dx, n, start, float::<B, 4>(dxs)));
        }
        if want_b {
            let dbs = B::float_bias_grad(dz.clone(), b.dtype());
            db = Some(accumulate::<B>(db, dbs));
        }
        if want_w {
            let dws = B::float_conv2d_weight_backward(xs, w.clone(), dz, options.clone());
            dw = Some(accumulate::<B>(dw, dws));
        }
    }
    [dx.map(prim), dw, db]
}

/// The default of [`Kernels::conv_relu_pool_forward`], a slice of images at a time (on every
/// backend): the output, and the winners' window positions.
pub(crate) fn forward_sliced<B: Kernels>(
    x: &FloatTensor<B>,
    weight: &FloatTensor<B>,
    bias: &FloatTensor<B>,
    options: &ConvOptions<2>,
    k: usize,
) -> (FloatTensor<B>, IntTensor<B>) {
    let [n, _, h, w] = x.shape().dims();
    let [c_out, _, _, _] = weight.shape().dims();
    // Each slice is written into one output allocated at the first slice: collecting the
    // slices and concatenating them would hold the pooled output twice at the end.
    let (mut all_out, mut all_pos) = (None, None);
    // The full-resolution conv output exists for one slice at a time (backward's slices).
    for (start, len) in bounded_slices::<B>(n, c_out * h * w, k) {
        let z = B::float_conv2d_layer(
            rows::<B, 4>(x, start, len),
            weight.clone(),
            Some(bias.clone()),
            options.clone(),
        );
        let (out, pos) = B::relu_max_pool(z, k);
        let out = float::<B, 4>(out);
        let pos = Tensor::<B, 4, Int>::from_primitive(pos);
        all_out = Some(assign(all_out, n, start, out));
        all_pos = Some(assign_int(all_pos, n, start, pos));
    }
    let out = all_out.expect("a batch has at least one image, so one slice");
    let pos = all_pos.expect("a batch has at least one image, so one slice");
    (prim(out), pos.into_primitive())
}

/// The block as one autodiff op. The conv output's height and width must be multiples of
/// `k` (the layer falls back to the composed ops otherwise). With nothing to differentiate,
/// the composed forward: no positions to keep.
pub(crate) fn conv_relu_pool_autodiff<B: Kernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
    options: ConvOptions<2>,
    k: usize,
    cx: &RunContext,
) -> FloatTensor<Autodiff<B, C>> {
    let parents = [x.node.clone(), weight.node.clone(), bias.node.clone()];
    match ConvReluPoolBackward
        .prepare::<C>(parents)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let dtype = x.primitive.dtype();
            let w = cast_prim::<B>(weight.primitive.clone(), dtype);
            let b = cast_prim::<B>(bias.primitive.clone(), dtype);
            let (out, positions) = B::conv_relu_pool_forward(&x.primitive, &w, &b, &options, k);
            let saved = Saved {
                out: out.clone(),
                positions,
                options,
                k,
            };
            let ids = [&x, &weight, &bias].map(|t| prep.checkpoint(t));
            prep.finish((ids, saved, cx.clone()), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(conv_relu_pool_plain::<B>(
            x.primitive,
            weight.primitive,
            bias.primitive,
            options,
            k,
        )),
    }
}

/// What the block holds at `sizes` for `input` values per image, a `conv` output of that many
/// values and `output` pooled ones: it keeps its input, its output and one byte per output.
/// Its backward has the output's gradient (and the input's, unless it is the first layer) and,
/// where the default runs, per slice of images the conv output's gradient, the conv weight
/// gradient's scratch (about twice that), the winners' mask and the output gradient's slice:
/// 3.5 slices of [`bounded_limit`]'s size. The CPU reads the first block's weight gradient off
/// the pooled gradient: no slice.
pub(crate) fn footprint(
    s: &Sizes,
    input: u64,
    conv: u64,
    output: u64,
    input_grad: bool,
) -> Footprint {
    let slice = match s.family {
        Family::Cpu if !input_grad => 0,
        _ => {
            let limit = bounded_limit(s.family.slice_values(), (s.batch * output) as usize);
            7 * slice_values(Some(limit), s.batch, conv) / 2
        }
    };
    let dx = if input_grad { input } else { 0 };
    Footprint {
        saved: s.acts(input + output) + s.batch * output,
        saved_values: s.batch * (input + 2 * output),
        recomputable: 0,
        backward: s.acts(output + dx) + slice * s.compute,
        weight_grad: 0,
        output_grad: s.acts(output),
    }
}
