//! The composed ReLU layer as a graph op whose kernels are the backend's hooks.
//!
//! Burn's own ReLU, op for op: it keeps its input (memory-bound: under activation
//! checkpointing its output is recomputed from that input instead of kept), and backward passes
//! the output gradient where the input is positive. What differs is underneath: forward and
//! backward run [`Kernels::float_relu`] and [`Kernels::float_relu_backward`], which on the CPU
//! work in the tensor's own layout and on half-precision values as bits.

use std::marker::PhantomData;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::retro_forward::RetroForward;
use burn::backend::autodiff::checkpoint::state::BackwardStates;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::ops::FloatTensor;

use crate::kernels::Kernels;

#[derive(Debug)]
struct ReluBackward;

impl<B: Kernels> Backward<B, 1> for ReluBackward {
    type State = NodeId;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, ckpt: &mut Checkpointer) {
        let [parent] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let x = ckpt.retrieve_node_output::<FloatTensor<B>>(ops.state);
        if let Some(node) = parent {
            grads.register::<B>(node.id, B::float_relu_backward(x, dout));
        }
    }
}

/// Recomputes the ReLU's output from its input, for activation checkpointing.
#[derive(Debug)]
struct RetroRelu<B> {
    input: NodeId,
    _backend: PhantomData<B>,
}

impl<B: Kernels> RetroForward for RetroRelu<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let x = states.get_state::<FloatTensor<B>>(&self.input);
        states.save(out_node, B::float_relu(x));
    }
}

/// The ReLU as one graph op (see the module's text).
pub(crate) fn relu_autodiff<B: Kernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let retro = RetroRelu::<B> {
        input: x.node.id,
        _backend: PhantomData,
    };
    match ReluBackward
        .prepare::<C>([x.node.clone()])
        .memory_bound()
        .retro_forward(retro)
        .parents([&x])
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let state = prep.checkpoint(&x);
            prep.finish(state, B::float_relu(x.primitive))
        }
        OpsKind::UnTracked(prep) => prep.finish(B::float_relu(x.primitive)),
    }
}
