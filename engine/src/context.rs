//! What one run owns and its ops reach: the precision policy, the layer-boundary listener and
//! the window sums lent to a backward pass.
//!
//! A run makes one [`RunContext`] and passes it to every forward; an op that needs it in backward
//! keeps a clone (an `Arc`), so a backward pass reaches the context of the forward that built
//! its graph. Two runs in one process (two threads, two devices) each have their own: neither
//! hears the other's boundaries nor takes the other's sums.
//!
//! Lent sums ([`RunContext::lend`]) implement gradient accumulation inside backward, as PyTorch's
//! `param.grad +=` does it. Summing after backward (Burn's `GradientsAccumulator`) keeps every
//! fresh parameter gradient of a micro-batch beside the window's sum until backward ends: at
//! backward's worst instant (deep in the first layers, activations still saved) SimpleModel's
//! classifier gradient existed twice. Here the training loop lends each parameter's window sum
//! before backward; the project's ops add their fresh parameter gradient into it the moment
//! they make it, so the fresh one is freed at once. A sum no op took (a parameter reached
//! through Burn's own ops: a composed layer's cast) is handed back by [`RunContext::reclaim`] and
//! added after backward.
//!
//! ```text
//! before backward   cx.lend(param → Σ earlier micro-batches)
//! in an op          grad(param) = Σ + fresh        (fresh freed here, not at backward's end)
//! after backward    cx.reclaim(param) → Σ untaken: grad(param) = Σ + fresh
//! ```
//! The sums are keyed by the parameter tensor's autodiff node
//! ([`ModelBackend::grad_sum_key`](crate::ModelBackend::grad_sum_key)). The addition is the one
//! Burn's accumulator makes: the summed gradients are the same bits.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};

use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::NodeId;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::boundary::{Boundary, Pass};
use crate::precision::Precision;

/// Called at every boundary crossing, on the thread running the pass.
pub type Listener = Arc<dyn Fn(Boundary, Pass) + Send + Sync>;

/// A run's policy and state (see the module's text). Cloning it shares the state.
#[derive(Clone)]
pub struct RunContext {
    /// Where each layer family computes.
    pub precision: Precision,
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    listener: RwLock<Option<Listener>>,
    lent: Mutex<HashMap<u64, Box<dyn Any + Send>>>,
}

impl RunContext {
    /// A context computing under `precision`, with no listener and nothing lent.
    pub fn new(precision: Precision) -> Self {
        Self {
            precision,
            state: Arc::default(),
        }
    }

    /// Installs `listener` for this run's boundaries (`None` removes it).
    pub fn listen(&self, listener: Option<Listener>) {
        // A panic elsewhere while holding the lock leaves a usable value: take it back.
        *self
            .state
            .listener
            .write()
            .unwrap_or_else(|e| e.into_inner()) = listener;
    }

    /// Whether a listener is installed (with none, boundaries are not put in the graph).
    pub fn listening(&self) -> bool {
        self.listener().is_some()
    }

    fn listener(&self) -> Option<Listener> {
        self.state
            .listener
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn notify(&self, at: Boundary, pass: Pass) {
        if let Some(listener) = self.listener() {
            listener(at, pass);
        }
    }

    fn with_lent<R>(&self, f: impl FnOnce(&mut HashMap<u64, Box<dyn Any + Send>>) -> R) -> R {
        f(&mut self.state.lent.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Lends `sum`, the running sum of the parameter whose autodiff node is `key`, to the ops
    /// of the next backward pass. A sum lent twice replaces the first.
    pub fn lend<B: Backend>(&self, key: u64, sum: FloatTensor<B>) {
        self.with_lent(|s| s.insert(key, Box::new(sum)));
    }

    /// Takes back the sum lent under `key` if no op added into it (`None` when one did, or
    /// when none was lent). A sum of another backend's type is left in place.
    pub fn reclaim<B: Backend>(&self, key: u64) -> Option<FloatTensor<B>> {
        self.with_lent(|s| {
            if !s.get(&key)?.is::<FloatTensor<B>>() {
                return None;
            }
            let sum = s.remove(&key)?;
            sum.downcast::<FloatTensor<B>>().ok().map(|b| *b)
        })
    }

    /// Drops whatever is still lent under `keys`: a backward pass that did not finish must not
    /// leave its sums behind.
    pub fn forget(&self, keys: &[u64]) {
        self.with_lent(|s| keys.iter().for_each(|k| drop(s.remove(k))));
    }

    /// Registers `grad` as the gradient of the parameter node `node`, plus the window's sum
    /// when one was lent for it: the op's fresh gradient lives no longer than this call.
    pub(crate) fn register_param<B: Backend>(
        &self,
        grads: &mut Gradients,
        node: NodeId,
        grad: FloatTensor<B>,
    ) {
        let grad = match self.reclaim::<B>(node.value) {
            Some(sum) => B::float_add(sum, grad),
            None => grad,
        };
        grads.register::<B>(node, grad);
    }
}

impl Default for RunContext {
    /// The f32 policy.
    fn default() -> Self {
        Self::new(Precision::F32)
    }
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lent = self.with_lent(|s| s.len());
        f.debug_struct("RunContext")
            .field("precision", &self.precision)
            .field("listening", &self.listening())
            .field("lent", &lent)
            .finish()
    }
}
