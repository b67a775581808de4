//! Gradient accumulation inside backward, as PyTorch's `param.grad +=` does it.
//!
//! Summing after backward (Burn's `GradientsAccumulator`) keeps every fresh parameter gradient
//! of a micro-batch beside the window's sum until backward ends: at backward's worst instant
//! (deep in the first layers, activations still saved) SimpleModel's classifier gradient
//! existed twice. Here the training loop lends each parameter's window sum before backward
//! ([`lend`]); the project's ops add their fresh parameter gradient into it the moment they make
//! it, so the fresh one is freed at once. A sum no op took (a parameter reached through Burn's
//! own ops: a composed layer's cast) is handed back by [`reclaim`] and added after backward.
//!
//! ```text
//! before backward   lend(param → Σ earlier micro-batches)
//! in an op          grad(param) = Σ + fresh        (fresh freed here, not at backward's end)
//! after backward    reclaim(param) → Σ untaken: grad(param) = Σ + fresh
//! ```
//! The sums are keyed by the parameter tensor's autodiff node ([`ModelBackend::grad_sum_key`]),
//! which is unique in the process, so concurrent trainings never see each other's sums. The
//! addition is the one Burn's accumulator makes: the summed gradients are the same bits.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Mutex;

use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::NodeId;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

type Store = HashMap<u64, Box<dyn Any + Send>>;

static LENT: Mutex<Option<Store>> = Mutex::new(None);

fn with_store<R>(f: impl FnOnce(&mut Store) -> R) -> R {
    // A panic elsewhere while holding the lock leaves a usable map: take it back.
    let mut guard = LENT.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// Lends `sum`, the running sum of the parameter whose autodiff node is `key`
/// ([`ModelBackend::grad_sum_key`]), to the ops of the next backward pass. A sum lent twice
/// replaces the first.
///
/// [`ModelBackend::grad_sum_key`]: crate::ModelBackend::grad_sum_key
pub fn lend<B: Backend>(key: u64, sum: FloatTensor<B>) {
    with_store(|s| s.insert(key, Box::new(sum)));
}

/// Takes back the sum lent under `key` if no op added into it (`None` when one did, or when
/// none was lent). A sum of another backend's type is left in place.
pub fn reclaim<B: Backend>(key: u64) -> Option<FloatTensor<B>> {
    with_store(|s| {
        if !s.get(&key)?.is::<FloatTensor<B>>() {
            return None;
        }
        let sum = s.remove(&key)?;
        sum.downcast::<FloatTensor<B>>().ok().map(|b| *b)
    })
}

/// Drops whatever is still lent under `keys`: a backward pass that did not finish must not
/// leave its sums behind.
pub fn forget(keys: &[u64]) {
    with_store(|s| keys.iter().for_each(|k| drop(s.remove(k))));
}

/// Registers `grad` as the gradient of the parameter node `node`, plus the window's sum when
/// one was lent for it: the op's fresh gradient lives no longer than this call.
pub(crate) fn register_param<B: Backend>(
    grads: &mut Gradients,
    node: NodeId,
    grad: FloatTensor<B>,
) {
    let grad = match reclaim::<B>(node.value) {
        Some(sum) => B::float_add(sum, grad),
        None => grad,
    };
    grads.register::<B>(node, grad);
}
