//! Loss scaling, as PyTorch's `GradScaler` does it.
//!
//! f16 gradients smaller than 6e-8 flush to zero. Multiplying the loss by a large scale before
//! backward lifts them into f16's range; the gradients are divided by it again (once per
//! optimizer step, after the last micro-batch) before the update. Too large a scale overflows
//! instead: then the step is skipped and the scale backs off. After `growth_interval` clean
//! steps in a row it grows again, so it hovers just under the overflow threshold.

use serde::{Deserialize, Serialize};

use crate::config::{LossScaleKind, LossScaleSpec, MAX_SCALE, MIN_SCALE};

/// The scaler's state; saved in checkpoints so a resumed run keeps its scale.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScalerState {
    /// The current scale (1 when scaling is off).
    pub scale: f64,
    /// Clean steps since the scale last changed.
    pub clean_steps: usize,
}

/// Dynamic, fixed or no loss scaling.
#[derive(Debug, Clone)]
pub struct LossScaler {
    spec: LossScaleSpec,
    state: ScalerState,
}

/// What the scaler decided about one optimizer step's gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Finite: take the step.
    Step,
    /// An inf or NaN: skip the step, leave weights and optimizer state untouched.
    Skip,
}

impl LossScaler {
    /// A scaler at its initial scale.
    pub fn new(spec: LossScaleSpec) -> Self {
        let scale = match spec {
            LossScaleSpec::Off => 1.0,
            LossScaleSpec::Fixed(s) => s,
            LossScaleSpec::Dynamic { init_scale, .. } => init_scale,
        };
        Self {
            spec,
            state: ScalerState {
                scale,
                clean_steps: 0,
            },
        }
    }

    /// The factor the loss is multiplied by before backward.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// Whether the loss is scaled at all (and so whether steps are checked for overflow).
    pub fn is_active(&self) -> bool {
        self.spec != LossScaleSpec::Off
    }

    /// The state to checkpoint.
    pub fn state(&self) -> ScalerState {
        self.state
    }

    /// Continues from a checkpointed state.
    pub fn restore(&mut self, state: ScalerState) {
        self.state = state;
    }

    /// Judges a step from the global norm of its unscaled gradients and updates the scale. A
    /// non-finite norm is skipped whether or not the loss is scaled.
    pub fn update(&mut self, grad_norm: f64) -> Verdict {
        let finite = grad_norm.is_finite();
        if let LossScaleSpec::Dynamic {
            growth_factor,
            backoff_factor,
            growth_interval,
            ..
        } = self.spec
        {
            if finite {
                self.state.clean_steps += 1;
                if self.state.clean_steps == growth_interval {
                    // Bounded, so no run of clean steps grows it to infinity.
                    self.state.scale = (self.state.scale * growth_factor).min(MAX_SCALE);
                    self.state.clean_steps = 0;
                }
            } else {
                self.state.scale = (self.state.scale * backoff_factor).max(MIN_SCALE);
                self.state.clean_steps = 0;
            }
        }
        if finite {
            Verdict::Step
        } else {
            Verdict::Skip
        }
    }

    /// The kind of scaling and the current scale, for reports.
    pub fn now(&self) -> ScaleNow {
        ScaleNow {
            kind: self.spec.kind(),
            scale: self.state.scale,
        }
    }

    /// `off`, or the kind and the current scale (`dynamic, 32768`).
    pub fn describe(&self) -> String {
        self.now().to_string()
    }
}

/// The loss scaling of a run at one moment: its kind and its scale. Reports (the progress line,
/// summary.json's `loss_scale`) spell it `off` or `dynamic, 32768`, and read that text back.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct ScaleNow {
    /// Off, fixed or dynamic.
    pub kind: LossScaleKind,
    /// The factor the loss is multiplied by (1 when off).
    pub scale: f64,
}

impl ScaleNow {
    /// Whether the loss is scaled at all.
    pub fn is_on(self) -> bool {
        self.kind != LossScaleKind::Off
    }
}

impl std::fmt::Display for ScaleNow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            LossScaleKind::Off => f.write_str("off"),
            kind => write!(f, "{}, {}", kind.name(), format_scale(self.scale)),
        }
    }
}

/// Text that is not a [`ScaleNow`]'s spelling.
#[derive(Debug, thiserror::Error)]
#[error("loss scale {0:?}: expected \"off\" or a kind and a scale, e.g. \"dynamic, 32768\"")]
pub struct BadScale(String);

impl TryFrom<String> for ScaleNow {
    type Error = BadScale;

    fn try_from(text: String) -> Result<Self, BadScale> {
        if text == LossScaleKind::Off.name() {
            return Ok(Self {
                kind: LossScaleKind::Off,
                scale: 1.0,
            });
        }
        let parsed = text.split_once(", ").and_then(|(kind, scale)| {
            Some(Self {
                kind: LossScaleKind::ALL
                    .into_iter()
                    .find(|k| *k != LossScaleKind::Off && k.name() == kind)?,
                scale: scale.parse().ok()?,
            })
        });
        parsed.ok_or(BadScale(text))
    }
}

impl From<ScaleNow> for String {
    fn from(now: ScaleNow) -> Self {
        now.to_string()
    }
}

/// Scales are powers of two: whole ones print as integers, tiny ones in scientific notation.
fn format_scale(s: f64) -> String {
    if s >= 1.0 && s.fract() == 0.0 && s < 1e15 {
        format!("{s:.0}")
    } else {
        format!("{s:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(interval: usize) -> LossScaler {
        LossScaler::new(LossScaleSpec::Dynamic {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: interval,
        })
    }

    #[test]
    fn overflow_halves_and_clean_steps_grow() {
        let mut s = dynamic(3);
        assert_eq!(s.update(f64::INFINITY), Verdict::Skip);
        assert_eq!(s.scale(), 32768.0);
        assert_eq!(s.update(f64::NAN), Verdict::Skip);
        assert_eq!(s.scale(), 16384.0);
        for _ in 0..2 {
            assert_eq!(s.update(1.0), Verdict::Step);
            assert_eq!(s.scale(), 16384.0);
        }
        s.update(1.0);
        assert_eq!(s.scale(), 32768.0);
        assert_eq!(s.state().clean_steps, 0);
    }

    #[test]
    fn an_overflow_restarts_the_growth_count() {
        let mut s = dynamic(2);
        s.update(1.0);
        s.update(f64::INFINITY);
        s.update(1.0);
        assert_eq!(
            s.scale(),
            32768.0,
            "one clean step after the overflow is not enough"
        );
        s.update(1.0);
        assert_eq!(s.scale(), 65536.0);
    }

    #[test]
    fn fixed_scale_skips_but_never_moves_and_off_skips_without_a_scale() {
        let mut fixed = LossScaler::new(LossScaleSpec::Fixed(128.0));
        assert_eq!(fixed.update(f64::INFINITY), Verdict::Skip);
        assert_eq!(fixed.scale(), 128.0);
        let mut off = LossScaler::new(LossScaleSpec::Off);
        // Without scaling an inf/NaN gradient is still skipped (issue 13: f32 with a huge
        // learning rate wrote non-finite weights), and there is no scale to move.
        assert_eq!(off.update(f64::NAN), Verdict::Skip);
        assert_eq!(off.update(1.0), Verdict::Step);
        assert_eq!((off.scale(), off.describe().as_str()), (1.0, "off"));
    }
}
