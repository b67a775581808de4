//! One optimizer step from a window's gradients: unscale once, check for overflow, clip,
//! update at the scheduled learning rate. A skipped step leaves weights, optimizer state, the
//! step counter and so the learning rate exactly as they were.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::grads;
use super::loss_scale::{LossScaler, ScalerState, Verdict};
use super::optim::Optim;
use super::schedule::LrSchedule;
use crate::config::{LossScaleSpec, Settings};

/// What happened to one window's gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// The weights were updated at learning rate `lr`.
    Stepped {
        /// The learning rate used.
        lr: f64,
    },
    /// An inf or NaN gradient: nothing was updated.
    Skipped,
}

impl Outcome {
    /// Whether the weights were updated.
    pub fn stepped(self) -> bool {
        matches!(self, Self::Stepped { .. })
    }
}

/// What a stepper carries across a checkpoint: its counters and the loss scaler's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepCounters {
    /// Optimizer steps taken.
    pub step: usize,
    /// Steps skipped for gradient overflow so far.
    #[serde(default)]
    pub skipped: usize,
    /// The loss scaler's scale and growth count (absent when scaling is off).
    #[serde(default)]
    pub scaler: Option<ScalerState>,
}

/// The optimizer together with everything that decides whether and how far it steps.
pub struct Stepper<M: AutodiffModule<B>, B: AutodiffBackend> {
    /// Adam or SGD and its state.
    pub optim: Optim<M, B>,
    /// Loss scale and overflow check.
    pub scaler: LossScaler,
    /// Learning rate per optimizer step.
    pub schedule: LrSchedule,
    /// Clip the global gradient norm to this, after unscaling.
    pub clip_norm: Option<f64>,
    /// Optimizer steps taken (skipped ones not counted).
    pub step: usize,
    /// Steps skipped for overflow.
    pub skipped: usize,
    /// Skips since the last step taken.
    consecutive_skips: usize,
}

/// Skipped steps in a row after which a run with loss scaling is declared diverged: the scale
/// has backed off by 2⁶⁴ (or to its floor), so the overflow is not the scale's doing.
pub const MAX_CONSECUTIVE_SKIPS: usize = 64;

/// The same without loss scaling: nothing changes between skipped windows but the batch, so
/// a few in a row already mean the weights or the learning rate are at fault.
pub const MAX_CONSECUTIVE_SKIPS_UNSCALED: usize = 8;

impl<M: AutodiffModule<B>, B: AutodiffBackend> Stepper<M, B> {
    /// The stepper `settings` describe for a run of `total_steps` optimizer steps, driving
    /// `optim`, continuing from `saved` (all zero for a fresh run).
    pub fn new(
        settings: &Settings,
        total_steps: usize,
        optim: Optim<M, B>,
        saved: &StepCounters,
    ) -> Self {
        let t = &settings.train;
        let spec = settings.precision.loss_scale;
        let mut scaler = LossScaler::new(spec);
        // The new config's scaling wins: a saved dynamic scale continues only into dynamic
        // scaling; a fixed scale or none starts as configured.
        if let (Some(state), LossScaleSpec::Dynamic { .. }) = (saved.scaler, spec) {
            scaler.restore(state);
        }
        Self {
            optim,
            scaler,
            schedule: LrSchedule::new(t, total_steps),
            clip_norm: t.grad_clip_norm,
            step: saved.step,
            skipped: saved.skipped,
            consecutive_skips: 0,
        }
    }

    /// The counters a checkpoint records.
    pub fn counters(&self) -> StepCounters {
        StepCounters {
            step: self.step,
            skipped: self.skipped,
            scaler: self.scaler.is_active().then(|| self.scaler.state()),
        }
    }

    /// Whether the last [`max_skips`](Self::max_skips) windows all overflowed.
    pub fn diverged(&self) -> bool {
        self.consecutive_skips >= self.max_skips()
    }

    /// Skipped windows in a row that mean the run has diverged.
    pub fn max_skips(&self) -> usize {
        if self.scaler.is_active() {
            MAX_CONSECUTIVE_SKIPS
        } else {
            MAX_CONSECUTIVE_SKIPS_UNSCALED
        }
    }

    /// The learning rate the next step will use.
    pub fn lr(&self) -> f64 {
        self.schedule.lr(self.step)
    }

    /// Applies `grads` (computed with the loss multiplied by the scaler's current scale).
    pub fn apply(&mut self, model: M, grads: GradientsParams) -> (M, Outcome) {
        let grads = grads::scale(&model, grads, 1.0 / self.scaler.scale());
        let norm = grads::global_norm(&model, &grads);
        self.apply_unscaled(model, grads, norm)
    }

    /// [`apply`](Self::apply) for gradients whose L2 norm (still scaled) is `norm`: a sharded
    /// peer holds only its own parameters' gradients, and the norm is over every peer's.
    pub fn apply_with_norm(&mut self, model: M, grads: GradientsParams, norm: f64) -> (M, Outcome) {
        let scale = self.scaler.scale();
        let grads = grads::scale(&model, grads, 1.0 / scale);
        self.apply_unscaled(model, grads, norm / scale)
    }

    fn apply_unscaled(&mut self, model: M, grads: GradientsParams, norm: f64) -> (M, Outcome) {
        // Every mode checks: an inf or NaN gradient never reaches the weights.
        if self.scaler.update(norm) == Verdict::Skip {
            self.skipped += 1;
            self.consecutive_skips += 1;
            return (model, Outcome::Skipped);
        }
        let grads = match self.clip_norm {
            Some(max) if norm > max => grads::scale(&model, grads, max / (norm + 1e-6)),
            _ => grads,
        };
        let lr = self.lr();
        let model = self.optim.step(lr, model, grads);
        self.step += 1;
        self.consecutive_skips = 0;
        (model, Outcome::Stepped { lr })
    }
}
