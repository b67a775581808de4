//! Max pooling as a graph op that lets the run's probe see inside its backward.
//!
//! The same computation as Burn's own max-pool (the backend's `max_pool2d_with_indices`, or
//! the CPU's own kernel that makes the same output and indices, and the backend's backward;
//! the input and the argmax kept), with one addition: backward reports the
//! moment its input's gradient exists beside its output's gradient and the argmax, to the
//! run's listener ([`RunContext`]), under the name the model gives. That moment is the op's
//! peak and often the step's (SimpleModel's): the layer boundaries on either side see the
//! output's gradient before and the input's after, never both. A probe that keeps its own
//! peak (the CPU heap's) sees nothing new; one that can only sample (CubeCL's) sees the peak.
//!
//! ```text
//! backward  dout ─► dx = unpool(dout, argmax)   ● report(at)   drop x, dout, argmax ─► dx
//! ```

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::ops::{FloatTensor, IntTensor, MaxPool2dWithIndices};

use crate::boundary::{Boundary, Pass};
use crate::composed;
use crate::context::RunContext;
use crate::footprint::{Footprint, Sizes};
use crate::kernels::Kernels;

/// Window size, stride and padding of a 2-d max-pool (no dilation, floor rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolWindow {
    /// Window height and width.
    pub size: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Padding on each side; it never wins a window.
    pub padding: [usize; 2],
}

/// The op for backends without an autodiff graph: the forward's output.
pub(crate) fn max_pool_plain<B: Kernels>(x: FloatTensor<B>, w: PoolWindow) -> FloatTensor<B> {
    B::float_max_pool(x, w)
}

#[derive(Debug)]
struct MaxPoolBackward;

impl<B: Kernels> Backward<B, 1> for MaxPoolBackward {
    type State = (NodeId, IntTensor<B>, PoolWindow, Boundary, RunContext);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [parent] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let (x_id, indices, w, at, cx) = ops.state;
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(x_id);
        if let Some(node) = parent {
            // With a listener, the operands are held until it has read the device: a lazy
            // backend (CubeCL's fusion) releases an operand whose last reference the op takes
            // as the op runs, so a sample after it would miss the moment the kernel held them
            // beside the input's gradient. Without one, the op takes them as Burn's does.
            let held = cx
                .listening()
                .then(|| (x.clone(), dout.clone(), indices.clone()));
            let dx = B::float_max_pool_backward(x, w, dout, indices);
            cx.notify(at, Pass::Backward);
            drop(held);
            grads.register::<B>(node.id, dx);
        }
    }
}

/// Max-pool as one graph op whose backward reports its peak moment as `at` (see the module's
/// text). Kept like Burn's: the input (checkpointed: under activation checkpointing a ReLU
/// before it may be recomputed) and the argmax.
pub(crate) fn max_pool_autodiff<B: Kernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    w: PoolWindow,
    at: Boundary,
    cx: &RunContext,
) -> FloatTensor<Autodiff<B, C>> {
    match MaxPoolBackward
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let x_id = prep.checkpoint(&x);
            let MaxPool2dWithIndices { output, indices } =
                B::float_max_pool_with_indices(x.primitive, w);
            prep.finish((x_id, indices, w, at, cx.clone()), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(max_pool_plain::<B>(x.primitive, w)),
    }
}

/// Max-pool with indices: keeps its input and one `i64` per output (Burn's argmax, which the
/// CPU's kernel makes too). Its backward has the output's gradient, the argmax and the input's
/// gradient alive at once (on the CPU, in bf16 too: its kernel sums a plane at a time in f32,
/// where Flex's converted the input and both gradients to f32). `relu_input`: the input is a
/// ReLU's output, which activation checkpointing may recompute instead of keeping.
pub(crate) fn footprint(s: &Sizes, input: u64, output: u64, relu_input: bool) -> Footprint {
    let kept = s.acts(input);
    Footprint {
        saved: kept + s.batch * output * s.index,
        saved_values: s.batch * (input + output),
        recomputable: composed::recomputable(relu_input, kept),
        backward: s.acts(input + output),
        weight_grad: 0,
        output_grad: s.acts(output),
    }
}
