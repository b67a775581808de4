//! The learning-rate schedule, indexed by optimizer step (not micro-batch): with gradient
//! accumulation, `k` micro-batches share one step and one learning rate, and a step skipped for
//! overflow does not advance it.

use crate::config::{ScheduleName, TrainSpec};

/// Learning rate as a function of the optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    kind: ScheduleName,
    base: f64,
    min: f64,
    warmup: usize,
    total: usize,
}

impl LrSchedule {
    /// The schedule `train` asks for, sized by the run's `total_steps` optimizer steps.
    pub fn new(train: &TrainSpec, total_steps: usize) -> Self {
        Self {
            kind: train.lr_schedule,
            base: train.lr,
            min: train.min_lr,
            warmup: train.warmup_steps,
            total: total_steps.max(1),
        }
    }

    /// The learning rate of optimizer step `step` (0-based).
    ///
    /// Warmup rises linearly to `lr` over the first `warmup_steps` steps (step 0 already
    /// trains, at `lr / warmup_steps`); cosine then falls from `lr` to `min_lr` at the last step.
    pub fn lr(&self, step: usize) -> f64 {
        match self.kind {
            ScheduleName::Constant => self.base,
            ScheduleName::WarmupCosine => {
                if step < self.warmup {
                    return self.base * (step + 1) as f64 / self.warmup as f64;
                }
                let span = self.total.saturating_sub(self.warmup + 1).max(1);
                let t = ((step - self.warmup) as f64 / span as f64).min(1.0);
                self.min + 0.5 * (self.base - self.min) * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }
}
