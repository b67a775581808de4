//! Layer boundaries: an identity autodiff op between blocks that reports when the forward pass
//! crosses it and, later, when the backward pass crosses it again.
//!
//! Memory probes listen to these events (through the run's [`RunContext`]) to sample the device at
//! every layer boundary of both passes: backward's peak (activations still saved, gradients
//! already alive) lies between two of them, where no phase-level sample sees it. With no
//! listener, a boundary is not even put in the graph.
//!
//! ```text
//! forward   x ──► [stem] ─► ● ─► [block1] ─► ● ─► …      ● = notify(layer, Forward)
//! backward  dx ◄── [stem] ◄─ ● ◄─ [block1] ◄─ ● ◄─ …      ● = notify(layer, Backward)
//! ```

use std::marker::PhantomData;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::retro_forward::RetroForward;
use burn::backend::autodiff::checkpoint::state::BackwardStates;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::context::RunContext;
use crate::model_backend::ModelBackend;

/// The end of a named layer (or block) of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boundary(pub &'static str);

/// Which pass crossed a boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The forward pass, leaving the layer.
    Forward,
    /// The backward pass, entering the layer from above (its output's gradient is alive).
    Backward,
}

/// Marks the end of layer `at` in `x`'s graph for `cx`'s listener: `x` unchanged.
pub fn mark<B: ModelBackend, const D: usize>(
    x: Tensor<B, D>,
    at: Boundary,
    cx: &RunContext,
) -> Tensor<B, D> {
    if !cx.listening() {
        return x;
    }
    let x = B::boundary(x.into_primitive().tensor(), at, cx);
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// The identity as a graph op whose backward reports the crossing and passes the gradient on.
pub(crate) fn boundary_autodiff<B: Backend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    at: Boundary,
    cx: &RunContext,
) -> FloatTensor<Autodiff<B, C>> {
    cx.notify(at, Pass::Forward);
    let retro = RetroIdentity::<B> {
        input: x.node.id,
        backend: PhantomData,
    };
    // Memory-bound: under activation checkpointing the identity is "recomputed" for free
    // instead of pinning its input.
    match BoundaryBackward
        .prepare::<C>([x.node.clone()])
        .memory_bound()
        .retro_forward(retro)
        .parents([&x])
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((at, cx.clone()), x.primitive),
        OpsKind::UnTracked(prep) => prep.finish(x.primitive),
    }
}

#[derive(Debug)]
struct BoundaryBackward;

impl<B: Backend> Backward<B, 1> for BoundaryBackward {
    type State = (Boundary, RunContext);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (at, cx) = ops.state;
        cx.notify(at, Pass::Backward);
        if let Some(node) = parent {
            grads.register::<B>(node.id, grad);
        }
    }
}

/// Recomputes the identity's output from its input when checkpointing dropped it.
#[derive(Debug)]
struct RetroIdentity<B> {
    input: NodeId,
    backend: PhantomData<fn() -> B>,
}

impl<B: Backend> RetroForward for RetroIdentity<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let x = states.get_state::<FloatTensor<B>>(&self.input);
        states.save(out_node, x)
    }
}
