//! Layer boundaries: an identity autodiff op between blocks that reports when the forward pass
//! crosses it and, later, when the backward pass crosses it again.
//!
//! Memory probes listen to these events to sample the device at every layer boundary of both
//! passes: backward's peak (activations still saved, gradients already alive) lies between two
//! of them, where no phase-level sample sees it. With no listener, a boundary is not even put
//! in the graph.
//!
//! ```text
//! forward   x ──► [stem] ─► ● ─► [block1] ─► ● ─► …      ● = notify(layer, Forward)
//! backward  dx ◄── [stem] ◄─ ● ◄─ [block1] ◄─ ● ◄─ …      ● = notify(layer, Backward)
//! ```

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

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

use crate::backend::ModelBackend;

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

/// Called at every boundary crossing, on the thread running the pass.
pub type Listener = Arc<dyn Fn(Boundary, Pass) + Send + Sync>;

static LISTENING: AtomicBool = AtomicBool::new(false);
static LISTENER: RwLock<Option<Listener>> = RwLock::new(None);

/// Installs `listener` for every model in the process (`None` removes it).
pub fn listen(listener: Option<Listener>) {
    let on = listener.is_some();
    // A panic elsewhere while holding the lock leaves a usable value: take it back.
    *LISTENER.write().unwrap_or_else(|e| e.into_inner()) = listener;
    LISTENING.store(on, Ordering::Release);
}

/// Whether a listener is installed.
pub fn listening() -> bool {
    LISTENING.load(Ordering::Acquire)
}

pub(crate) fn notify(at: Boundary, pass: Pass) {
    if !listening() {
        return;
    }
    let listener = LISTENER.read().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(listener) = listener {
        listener(at, pass);
    }
}

/// Marks the end of layer `at` in `x`'s graph: `x` unchanged.
pub fn mark<B: ModelBackend, const D: usize>(x: Tensor<B, D>, at: Boundary) -> Tensor<B, D> {
    if !listening() {
        return x;
    }
    let x = B::boundary(x.into_primitive().tensor(), at);
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

/// The identity as a graph op whose backward reports the crossing and passes the gradient on.
pub(crate) fn boundary_autodiff<B: Backend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    at: Boundary,
) -> FloatTensor<Autodiff<B, C>> {
    notify(at, Pass::Forward);
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
        OpsKind::Tracked(prep) => prep.finish(at, x.primitive),
        OpsKind::UnTracked(prep) => prep.finish(x.primitive),
    }
}

#[derive(Debug)]
struct BoundaryBackward;

impl<B: Backend> Backward<B, 1> for BoundaryBackward {
    type State = Boundary;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        notify(ops.state, Pass::Backward);
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
