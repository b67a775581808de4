//! Causal multi-head attention, two ways: [`naive`], composed from tensor ops, and the
//! memory-efficient graph op ([`ModelBackend::memory_efficient_attention`]).
//!
//! Both compute `softmax(q·kᵀ/√d + causal mask) · v` as autocast does: the matmuls in the
//! inputs' dtype, the scores, the softmax and its statistics in f32.
//!
//! What each keeps for backward, per layer, besides `q`, `k` and `v`:
//! - [`naive`]: autodiff keeps the `batch × heads × seq × seq` probabilities (in f32, and in
//!   the inputs' dtype for the second matmul when that is a half type), and the tensors
//!   Burn's composed softmax keeps: memory quadratic in the sequence.
//! - the memory-efficient op (the FlashAttention algorithm, written for clarity): the output
//!   and one f32 log-sum-exp per row. Forward walks the keys in blocks of [`KEY_BLOCK`] with a
//!   running maximum and sum (the online softmax); backward recomputes each block's scores
//!   from `q`, `k` and the log-sum-exp. While it runs it holds an f32 accumulator the size of
//!   its output (forward's weighted sum, backward's `dq`), the finished blocks of `dk` and `dv`
//!   (joined at the end, so briefly twice), and a few buffers of one block's scores, `batch ×
//!   heads × seq × KEY_BLOCK` values each: memory linear in the sequence, never quadratic.
//!
//! Both scale `q` by `1/√head_dim` before `q·kᵀ`, as PyTorch does, so a half-precision score
//! overflows only where the scaled score itself would.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, DType, Int, Tensor};

use crate::cast::{cast, float, prim};
use crate::footprint::{Footprint, Sizes};
use crate::kernels::Kernels;

/// Keys per block of the memory-efficient op: each of its score buffers holds `batch × heads ×
/// seq × KEY_BLOCK` values.
pub const KEY_BLOCK: usize = 64;

/// Causal attention composed from tensor ops: `q`, `k`, `v` are `[batch, heads, seq, head_dim]`
/// in one dtype, as is the output. Under autodiff each op keeps what it keeps; the softmax's
/// output, `[batch, heads, seq, seq]`, among them.
pub fn naive<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, heads, seq, head_dim] = q.dims();
    let dtype = q.dtype();
    let scores = cast((q * scale(head_dim)).matmul(k.swap_dims(2, 3)), DType::F32);
    let mask = future(seq, 0, seq, &v.device()).expand([batch, heads, seq, seq]);
    let scores = scores.mask_fill(mask, f32::NEG_INFINITY);
    cast(softmax(scores, 3), dtype).matmul(v)
}

/// `1/√head_dim`, the scores' scale.
fn scale(head_dim: usize) -> f64 {
    1.0 / (head_dim as f64).sqrt()
}

/// The causal mask of the keys `start..end` against all `seq` queries, `[1, 1, seq, end -
/// start]`: true where the key comes after the query.
fn future<B: Backend>(
    seq: usize,
    start: usize,
    end: usize,
    device: &B::Device,
) -> Tensor<B, 4, Bool> {
    let queries = Tensor::<B, 1, Int>::arange(0..seq as i64, device).reshape([1, 1, seq, 1]);
    let keys = Tensor::<B, 1, Int>::arange(start as i64..end as i64, device).reshape([
        1,
        1,
        1,
        end - start,
    ]);
    keys.greater(queries)
}

/// One key block's masked scores, `[batch, heads, seq, end - start]` in f32, from the scaled
/// queries `qs`, and the block's keys and values.
fn block_scores<B: Backend>(
    qs: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    start: usize,
    end: usize,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let [batch, heads, seq, head_dim] = qs.dims();
    let block = |t: &Tensor<B, 4>| {
        t.clone()
            .slice([0..batch, 0..heads, start..end, 0..head_dim])
    };
    let (kj, vj) = (block(k), block(v));
    let scores = cast(qs.clone().matmul(kj.clone().swap_dims(2, 3)), DType::F32);
    let mask = future(seq, start, end, &qs.device()).expand([batch, heads, seq, end - start]);
    (scores.mask_fill(mask, f32::NEG_INFINITY), kj, vj)
}

/// The key blocks' ranges.
fn blocks(seq: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..seq)
        .step_by(KEY_BLOCK)
        .map(move |s| (s, (s + KEY_BLOCK).min(seq)))
}

/// Forward with the online softmax: the output (in the inputs' dtype) and each row's f32
/// log-sum-exp, `[batch, heads, seq, 1]`.
fn forward<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let [batch, heads, seq, head_dim] = q.dims();
    let (dtype, device) = (q.dtype(), q.device());
    let f32s = (&device, DType::F32);
    let mut max = Tensor::<B, 4>::full([batch, heads, seq, 1], f32::NEG_INFINITY, f32s);
    let mut sum = Tensor::<B, 4>::zeros([batch, heads, seq, 1], f32s);
    let mut acc = Tensor::<B, 4>::zeros([batch, heads, seq, head_dim], f32s);
    let qs = q.clone() * scale(head_dim);
    // The first block holds key 0, which every query sees: from then on `max` is finite, and a
    // key a query may not see adds exp(-inf) = 0.
    for (start, end) in blocks(seq) {
        let (scores, _, vj) = block_scores(&qs, k, v, start, end);
        let new_max = max.clone().max_pair(scores.clone().max_dim(3));
        let p = (scores - new_max.clone()).exp();
        let rescale = (max - new_max.clone()).exp();
        sum = sum * rescale.clone() + p.clone().sum_dim(3);
        acc = acc * rescale + cast(cast(p, dtype).matmul(vj), DType::F32);
        max = new_max;
    }
    let out = cast(acc / sum.clone(), dtype);
    (out, max + sum.log())
}

/// `(dq, dk, dv)` from the output gradient, recomputing each block's probabilities from the
/// log-sum-exp.
fn backward<B: Backend>(
    [q, k, v]: [Tensor<B, 4>; 3],
    out: Tensor<B, 4>,
    lse: Tensor<B, 4>,
    dout: Tensor<B, 4>,
) -> [Tensor<B, 4>; 3] {
    let [batch, heads, seq, head_dim] = q.dims();
    let (dtype, device) = (q.dtype(), q.device());
    // Row i's Σ_j p_ij·dp_ij, which the softmax's backward subtracts: dO_i · O_i.
    let delta = (cast(dout.clone(), DType::F32) * cast(out, DType::F32)).sum_dim(3);
    let mut dq = Tensor::<B, 4>::zeros([batch, heads, seq, head_dim], (&device, DType::F32));
    let qs = q.clone() * scale(head_dim);
    let (mut dk, mut dv) = (Vec::new(), Vec::new());
    for (start, end) in blocks(seq) {
        let (scores, kj, vj) = block_scores(&qs, &k, &v, start, end);
        let p = (scores - lse.clone()).exp();
        dv.push(cast(p.clone(), dtype).swap_dims(2, 3).matmul(dout.clone()));
        let dp = cast(dout.clone().matmul(vj.swap_dims(2, 3)), DType::F32);
        let ds = cast(p * (dp - delta.clone()) * scale(head_dim), dtype);
        dq = dq + cast(ds.clone().matmul(kj), DType::F32);
        dk.push(ds.swap_dims(2, 3).matmul(q.clone()));
    }
    [cast(dq, dtype), Tensor::cat(dk, 2), Tensor::cat(dv, 2)]
}

/// On a plain backend: the forward alone.
pub(crate) fn memory_efficient_plain<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
) -> FloatTensor<B> {
    prim(forward::<B>(&float(q), &float(k), &float(v)).0)
}

#[derive(Debug)]
struct AttentionBackward;

impl<B: Kernels> Backward<B, 3> for AttentionBackward {
    /// `q`, `k`, `v` (their nodes), the output and the log-sum-exp.
    type State = ([NodeId; 3], FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let nodes = ops.parents.map(|p| p.map(|n| n.id));
        let dout = float::<B, 4>(grads.consume::<B>(&ops.node));
        let (ids, out, lse) = ops.state;
        let qkv = ids.map(|id| float::<B, 4>(ckpt.retrieve_node_output::<FloatTensor<B>>(id)));
        let dqkv = backward::<B>(qkv, float(out), float(lse), dout);
        for (node, grad) in nodes.into_iter().zip(dqkv) {
            if let Some(node) = node {
                grads.register::<B>(node, prim(grad));
            }
        }
    }
}

/// The memory-efficient attention as one graph op (see the module's text).
pub(crate) fn memory_efficient_autodiff<B: Kernels, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    match AttentionBackward
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let ids = [
                prep.checkpoint(&q),
                prep.checkpoint(&k),
                prep.checkpoint(&v),
            ];
            let (out, lse) = forward::<B>(
                &float(q.primitive),
                &float(k.primitive),
                &float(v.primitive),
            );
            let out = prim(out);
            prep.finish((ids, out.clone(), prim(lse)), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(memory_efficient_plain::<B>(
            q.primitive,
            k.primitive,
            v.primitive,
        )),
    }
}

/// What attention over `seq` tokens of `width` in `heads` heads keeps per sample (see the
/// module's text), naive or memory-efficient, and what its backward has alive.
///
/// The heads' `q`, `k` and `v` are views of the block's fused projection, so whatever keeps one
/// keeps all three (`3 · seq · width` values). Naive keeps besides them the scaled queries and,
/// per score, three f32 values (the masked scores, which Burn's `exp` keeps as its input; the
/// exponentials; the probabilities, cast to the compute dtype when that is a half type) and
/// each row's sum. Its backward holds the probabilities' gradient in the compute dtype and two
/// f32 score-sized gradients. Memory-efficient keeps the projection, the output and the f32
/// log-sum-exp; its backward holds the f32 `dq` accumulator, the scaled queries, the blocks of
/// `dk` and `dv` and their joined copies, the cast `dq`, the output's gradient and about five
/// buffers of one key block's scores.
pub(crate) fn footprint(
    s: &Sizes,
    seq: u64,
    width: u64,
    heads: u64,
    memory_efficient: bool,
) -> Footprint {
    let tokens = seq * width;
    let scores = heads * seq * seq;
    let (saved, saved_values, backward) = match memory_efficient {
        false => (
            s.acts(4 * tokens + scores) + s.f32s(2 * scores + heads * seq),
            4 * tokens + 3 * scores + heads * seq,
            s.acts(scores + 3 * tokens) + s.f32s(2 * scores),
        ),
        true => {
            let block = heads * seq * (KEY_BLOCK as u64).min(seq);
            (
                s.acts(4 * tokens) + s.f32s(heads * seq),
                4 * tokens + heads * seq,
                s.acts(7 * tokens) + s.f32s(tokens + 5 * block),
            )
        }
    };
    Footprint {
        saved,
        saved_values: s.batch * saved_values,
        recomputable: 0,
        backward,
        weight_grad: 0,
        output_grad: s.acts(tokens),
    }
}
