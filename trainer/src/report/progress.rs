//! The progress bar: step, loss and images/s while training, one line per epoch.
//! indicatif hides the bar when stderr is not a terminal, so logs and tests stay clean.

use indicatif::{ProgressBar, ProgressStyle};

use crate::training::eval::EvalResult;
use crate::training::loss_scale::ScaleNow;
use crate::training::step::Outcome;

/// A bar over the run's optimizer steps.
pub struct Progress {
    bar: ProgressBar,
    /// Tokens per sample, for a language model.
    tokens: Option<usize>,
}

impl Progress {
    /// A bar of `total` steps, `done` of them already taken (when resuming).
    /// A bar for `total` steps, `done` of them already; a sample is `tokens` tokens for a
    /// language model (the rate is then shown in tokens/s).
    pub fn new(total: usize, done: usize, tokens: Option<usize>) -> Self {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] step {pos}/{len} {msg} (eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_position(done as u64);
        Self { bar, tokens }
    }

    /// One window done: the bar advances only when it was an optimizer step.
    pub fn step(
        &mut self,
        outcome: Outcome,
        loss: f64,
        images_per_sec: f64,
        scale: ScaleNow,
        skipped: usize,
    ) {
        let mut msg = match self.tokens {
            Some(t) => format!("loss {loss:.4} | {:.0} tok/s", images_per_sec * t as f64),
            None => format!("loss {loss:.4} | {images_per_sec:.0} img/s"),
        };
        if scale.is_on() {
            msg.push_str(&format!(" | scale {scale} | skipped {skipped}"));
        }
        if let Outcome::Stepped { lr } = outcome {
            msg.push_str(&format!(" | lr {lr:.2e}"));
            self.bar.inc(1);
        }
        self.bar.set_message(msg);
    }

    /// An epoch's end: printed above the bar (to stderr), kept in logs.
    pub fn epoch(&self, epoch: usize, train_loss: f64, eval: EvalResult) {
        let train_loss = match train_loss.is_nan() {
            // NaN here means no step of the run has been taken yet, not a NaN loss.
            true => "n/a (no step taken: every window was skipped)".into(),
            false => format!("{train_loss:.4}"),
        };
        let mut line = format!(
            "epoch {epoch}: train loss {train_loss} | eval loss {:.4} | eval accuracy {:.2}%",
            eval.loss,
            100.0 * eval.accuracy
        );
        if let Some(p) = eval.perplexity {
            line.push_str(&format!(" | perplexity {p:.3}"));
        }
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// Draws nothing from now on (a peer other than rank 0).
    pub fn silence(&mut self) {
        self.bar = ProgressBar::hidden();
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
