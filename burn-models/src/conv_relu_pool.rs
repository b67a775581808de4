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

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor, IntTensor, MaxPool2dWithIndices};
use burn::tensor::{Int, IntDType, Tensor, TensorMetadata, TensorPrimitive};

/// The composed block, for backends without an autodiff graph.
pub(crate) fn conv_relu_pool_plain<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: FloatTensor<B>,
    options: ConvOptions<2>,
    k: usize,
) -> FloatTensor<B> {
    let z = B::relu(B::conv2d(x, weight, Some(bias), options));
    B::max_pool2d(z, [k, k], [k, k], [0, 0], [1, 1], false)
}

fn float<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
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

/// `[n, c, ho, wo]` → `[n, c, ho·k, wo·k]`, each value repeated over its window.
fn spread<B: Backend, K>(t: Tensor<B, 4, K>, k: usize) -> Tensor<B, 4, K>
where
    K: burn::tensor::BasicOps<B>,
{
    let [n, c, ho, wo] = t.dims();
    t.reshape([n, c, ho, 1, wo, 1])
        .expand([n, c, ho, k, wo, k])
        .reshape([n, c, ho * k, wo * k])
}

/// The conv output's gradient: `g` at each window's winning position, zero elsewhere.
fn unpool<B: Backend>(g: Tensor<B, 4>, positions: IntTensor<B>, k: usize) -> Tensor<B, 4> {
    let [n, c, ho, wo] = g.dims();
    let (h, w) = (ho * k, wo * k);
    let device = g.device();
    // Every place's position in its window, `row % k · k + col % k`, for one plane.
    let rows = Tensor::<B, 1, Int>::arange(0..h as i64, &device)
        .remainder_scalar(k as i64)
        .mul_scalar(k as i64)
        .reshape([1, 1, h, 1]);
    let cols = Tensor::<B, 1, Int>::arange(0..w as i64, &device)
        .remainder_scalar(k as i64)
        .reshape([1, 1, 1, w]);
    let place = (rows.expand([1, 1, h, w]) + cols.expand([1, 1, h, w]))
        .cast(IntDType::U8)
        .expand([n, c, h, w]);
    let winner = spread(Tensor::<B, 4, Int>::from_primitive(positions), k).equal(place);
    spread(g, k).mask_fill(winner.bool_not(), 0.0)
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

impl<B: Backend> Backward<B, 3> for ConvReluPoolBackward {
    type State = ([NodeId; 3], Saved<B>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let ([x_id, w_id, b_id], saved) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        let w = ckpt.retrieve_node_output::<FloatTensor<B>>(w_id);
        let b = ckpt.retrieve_node_output::<FloatTensor<B>>(b_id);

        let g = B::relu_backward(saved.out, dout);
        let dz = unpool::<B>(float(g), saved.positions, saved.k)
            .into_primitive()
            .tensor();
        let opts = saved.options;
        if let Some(node) = node_x {
            let dx = B::conv2d_x_backward(x.clone(), w.clone(), dz.clone(), opts.clone());
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = node_b {
            grads.register::<B>(node.id, B::conv2d_bias_backward(x.clone(), b, dz.clone()));
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::conv2d_weight_backward(x, w, dz, opts));
        }
    }
}

/// The block as one autodiff op. The conv output's height and width must be multiples of
/// `k` (the layer falls back to the composed ops otherwise).
pub(crate) fn conv_relu_pool_autodiff<B: Backend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
    options: ConvOptions<2>,
    k: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let z = B::conv2d(
        x.primitive.clone(),
        weight.primitive.clone(),
        Some(bias.primitive.clone()),
        options.clone(),
    );
    let [_, _, _, width] = z.shape().dims();
    let MaxPool2dWithIndices { output, indices } =
        B::max_pool2d_with_indices(z, [k, k], [k, k], [0, 0], [1, 1], false);
    let out = B::relu(output);
    let saved = Saved {
        out: out.clone(),
        positions: window_positions::<B>(indices, width, k),
        options,
        k,
    };
    let parents = [x.node.clone(), weight.node.clone(), bias.node.clone()];
    match ConvReluPoolBackward
        .prepare::<C>(parents)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let ids = [&x, &weight, &bias].map(|t| prep.checkpoint(t));
            prep.finish((ids, saved), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}
