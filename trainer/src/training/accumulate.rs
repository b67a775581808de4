//! Gradient accumulation: `accum_steps` micro-batches of `batch_size` make one optimizer step.
//!
//! Each micro-batch's mean loss is weighted by its share of the window's samples, so the summed
//! gradient is the gradient of the window's mean loss, exactly what one batch of the window's
//! size would give (for models without batch norm: BN normalises each micro-batch with its own
//! statistics). An epoch's last window may be shorter; it is weighted by its real size and
//! never borrows samples from the next epoch.

use burn::module::{ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::TensorPrimitive;
use oomlab_engine::{ModelBackend, RunContext};
use serde::{Deserialize, Serialize};

use crate::data::Batch;
use crate::memory::{MemoryProbe, Phase};
use crate::model::Network;
use crate::training::mistakes::KeptLosses;

/// Samples per optimizer step, and how they split into micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// Samples per micro-batch (one forward/backward).
    pub batch_size: usize,
    /// Micro-batches per optimizer step.
    pub accum_steps: usize,
    /// Data-parallel peers, each taking its micro-batches of every window (1 on one device).
    pub peers: usize,
}

impl Windows {
    /// Samples in a full window, over all peers.
    pub fn window_size(&self) -> usize {
        self.batch_size * self.accum_steps * self.peers
    }

    /// Optimizer steps in an epoch of `n` samples; the last may be short.
    pub fn per_epoch(&self, n: usize) -> usize {
        n.div_ceil(self.window_size())
    }

    /// An epoch's sample order cut into windows.
    pub fn split<'a>(&self, order: &'a [usize]) -> std::slice::Chunks<'a, usize> {
        order.chunks(self.window_size())
    }
}

/// Where a run stands in its data order: checkpoints are written between windows, so no
/// partial gradient is ever pending.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer windows done in the current epoch.
    #[serde(default)]
    pub window: usize,
}

impl Position {
    /// The start of the next epoch.
    pub fn next_epoch(&mut self) {
        self.epoch += 1;
        self.window = 0;
    }
}

/// The summed gradient of one window and the window's mean loss (unscaled).
pub struct WindowGrads {
    /// Gradients of `loss_scale × mean loss` with respect to every parameter.
    pub grads: GradientsParams,
    /// Mean cross-entropy over the window's samples.
    pub loss: f64,
}

/// Runs forward and backward over `window` in micro-batches of `batch_size` and sums the
/// gradients, each micro-batch's loss weighted by its share of the window's `total` samples
/// (more than `window` holds when it is one peer's slice) and multiplied by `loss_scale`. `load` turns sample indices into a batch (images, or token windows whose every
/// position is a prediction: the mean is over positions, the share over windows); `probe` is sampled after each
/// forward and backward; `kept` keeps each loss tensor when the `keep_losses` mistake is on.
// Each argument is one input of the seed's loop body; a struct around them would hide that.
#[allow(clippy::too_many_arguments)]
pub fn window_gradients<B>(
    model: &Network<B>,
    window: &[usize],
    total: usize,
    batch_size: usize,
    cx: &RunContext,
    loss_scale: f64,
    probe: &mut dyn MemoryProbe,
    kept: &mut KeptLosses<B>,
    mut load: impl FnMut(&[usize]) -> Batch<B>,
) -> WindowGrads
where
    B: AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
    let mut sum: Option<GradientsParams> = None;
    let total = total as f64;
    let mut loss_sum = 0.0;
    for micro in window.chunks(batch_size) {
        let share = micro.len() as f64 / total;
        // The ops add their fresh gradients into the lent sums during backward.
        let lent = sum.map(|sum| Lent::new(model, sum, cx));
        // loss = ce(model(x), y); (loss · share · scale).backward(), the probe sampled between.
        let after_forward = || probe.sample(Phase::AfterForward);
        let (loss, mut fresh) =
            model.loss_and_grads(load(micro), cx, share * loss_scale, after_forward);
        if let Some(lent) = lent {
            lent.reclaim(model, &mut fresh);
        }
        sum = Some(fresh);
        probe.sample(Phase::AfterBackward);
        kept.add(&loss);
        loss_sum += share * loss.into_scalar().elem::<f64>();
    }
    WindowGrads {
        grads: sum.unwrap_or_default(),
        loss: loss_sum,
    }
}

/// A window's summed gradients lent to the next backward pass ([`RunContext::lend`]): each op adds its
/// fresh parameter gradient into the sum as it makes it, instead of keeping it beside the sum
/// until backward ends. What no op took is added after backward, as Burn's accumulator does;
/// both make the same additions, so the sums are the same bits.
struct Lent<'a> {
    /// The run's context, which holds the sums.
    cx: &'a RunContext,
    /// Autodiff keys of the sums lent.
    keys: Vec<u64>,
    /// Sums of parameters without a key (none under autodiff): kept here, added after.
    kept: GradientsParams,
}

impl<'a> Lent<'a> {
    /// Lends every parameter's sum in `sum` to `cx`.
    fn new<B: AutodiffBackend + ModelBackend, M: Module<B>>(
        model: &M,
        sum: GradientsParams,
        cx: &'a RunContext,
    ) -> Self {
        let mut visitor = LendVisitor {
            cx,
            sum,
            keys: Vec::new(),
        };
        model.visit(&mut visitor);
        Self {
            cx,
            keys: visitor.keys,
            kept: visitor.sum,
        }
    }

    /// Adds every sum no op took into `fresh`, the micro-batch's gradients.
    fn reclaim<B: AutodiffBackend + ModelBackend, M: Module<B>>(
        mut self,
        model: &M,
        fresh: &mut GradientsParams,
    ) {
        model.visit(&mut ReclaimVisitor {
            cx: self.cx,
            kept: &mut self.kept,
            fresh,
        });
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        // After `reclaim` nothing is left; after a panic in backward, the sums are dropped.
        self.cx.forget(&self.keys);
    }
}

struct LendVisitor<'a> {
    cx: &'a RunContext,
    sum: GradientsParams,
    keys: Vec<u64>,
}

impl<B: AutodiffBackend + ModelBackend> ModuleVisitor<B> for LendVisitor<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(key) = B::grad_sum_key(&param.val().into_primitive().tensor()) else {
            return;
        };
        if let Some(sum) = self.sum.remove::<B::InnerBackend, D>(param.id) {
            self.cx
                .lend::<B::InnerBackend>(key, sum.into_primitive().tensor());
            self.keys.push(key);
        }
    }
}

struct ReclaimVisitor<'a> {
    cx: &'a RunContext,
    kept: &'a mut GradientsParams,
    fresh: &'a mut GradientsParams,
}

impl<B: AutodiffBackend + ModelBackend> ModuleVisitor<B> for ReclaimVisitor<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let untaken = B::grad_sum_key(&param.val().into_primitive().tensor())
            .and_then(|key| self.cx.reclaim::<B::InnerBackend>(key))
            .map(|sum| Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(sum)));
        let Some(sum) = untaken.or_else(|| self.kept.remove::<B::InnerBackend, D>(param.id)) else {
            return; // an op added it in already (or the parameter has no gradient)
        };
        let total = match self.fresh.remove::<B::InnerBackend, D>(param.id) {
            Some(fresh) => sum.add(fresh),
            None => sum,
        };
        self.fresh.register::<B::InnerBackend, D>(param.id, total);
    }
}
