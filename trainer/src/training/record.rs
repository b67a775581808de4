//! Everything a run keeps about itself besides the model: the progress bar, the per-window
//! step log, the losses and images/s, the lost-update fractions of pure f16, the last
//! evaluation, and the divergence check. The training loop hands it each window's outcome
//! and stays the article's loop.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use super::checkpoint;
use super::eval::EvalResult;
use super::interrupt::Interrupted;
use super::lost_updates::Before;
use super::step::{Outcome, Stepper};
use crate::config::{LossScaleSpec, Settings};
use crate::memory::probe::Reading;
use crate::report::progress::Progress;
use crate::report::step_log::StepLog;

/// What to change when a run diverges, with the learning rate it had.
fn remedy(lr: f64) -> String {
    format!("lower train.lr (now {lr:.3e}) or set train.grad_clip_norm")
}

/// How many of the last step losses the summary's "final train loss" averages.
const LOSS_WINDOW: usize = 20;

/// Windows at the start of each process timed as warm-up, not training: CubeCL compiles and
/// autotunes every kernel the first time it meets a shape, and all allocators grow their pools.
pub const WARMUP_WINDOWS: usize = 1;

/// The warm-up of a run, reported on its own.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Warmup {
    /// Seconds the warm-up windows took.
    pub seconds: f64,
    /// Windows timed as warm-up.
    pub steps: usize,
    /// Whether images/s leaves them out (false when no window followed them).
    pub excluded: bool,
}

/// What a run has done so far.
pub struct Record {
    progress: Progress,
    /// Every window, loaded from the checkpoint on resume: the losses come from here.
    log: StepLog,
    /// Time in training windows after the warm-up (evaluation and checkpoints excluded).
    train_seconds: f64,
    images: usize,
    /// The first [`WARMUP_WINDOWS`] windows of this process: time and images.
    warmup: (f64, usize),
    windows_timed: usize,
    /// The largest window trained: the real samples per step when the split is smaller
    /// than the configured window.
    largest_window: usize,
    /// Pure f16 only: the fraction of weights each step left unchanged.
    unchanged: Option<Vec<f64>>,
    started: Instant,
    /// When the current window started, its step counter and its loss scale.
    window: (Instant, usize, f64),
    eval: Option<EvalResult>,
    output_dir: PathBuf,
    scaled: bool,
    /// Another peer writes the run's files: this one writes none.
    silent: bool,
}

impl Record {
    /// A record for a run of `settings` over `total_steps` steps, `done` of them already
    /// taken, continuing `log` (empty for a fresh run), which began at `started`.
    pub fn new(
        settings: &Settings,
        total_steps: usize,
        done: usize,
        log: StepLog,
        started: Instant,
    ) -> Self {
        Self {
            progress: Progress::new(total_steps, done, settings.model.tokens_per_sample()),
            log,
            train_seconds: 0.0,
            images: 0,
            warmup: (0.0, 0),
            windows_timed: 0,
            largest_window: 0,
            // Pure f16 has no master weights; how many updates round away is what it teaches.
            unchanged: (!settings.precision.mode.master_weights()).then(Vec::new),
            started,
            window: (started, done, 1.0),
            eval: None,
            output_dir: settings.train.output_dir.clone(),
            scaled: settings.precision.loss_scale != LossScaleSpec::Off,
            silent: false,
        }
    }

    /// Shows no progress (a data-parallel peer other than rank 0: rank 0's bar is the run's).
    pub fn silence(&mut self) {
        self.progress.silence();
        self.silent = true;
    }

    /// A window begins: its time, step counter and loss scale are noted.
    pub fn start<M: AutodiffModule<B>, B: AutodiffBackend>(&mut self, stepper: &Stepper<M, B>) {
        self.window = (Instant::now(), stepper.step, stepper.scaler.scale());
    }

    /// The memory after the window's step, as the probe read it, for the step log.
    pub fn memory(&mut self, after_step: Option<Reading>) {
        let (in_use, reserved) = after_step.map_or((None, None), |r| (Some(r.in_use), r.reserved));
        self.log.set_memory(in_use, reserved);
    }

    /// The weights before the step, when lost updates are tracked (pure f16).
    pub fn before_step<M: AutodiffModule<B>, B: AutodiffBackend>(
        &self,
        model: &M,
    ) -> Option<Before<B>> {
        self.unchanged.is_some().then(|| Before::of(model))
    }

    /// A window of `samples` images ended with mean `loss` and `outcome`; `model` is the
    /// model after it. An error when the run has diverged.
    pub fn window<M: AutodiffModule<B>, B: AutodiffBackend>(
        &mut self,
        samples: usize,
        loss: f64,
        outcome: Outcome,
        stepper: &Stepper<M, B>,
        model: &M,
        before: Option<Before<B>>,
    ) -> anyhow::Result<()> {
        let (tick, step, scale) = self.window;
        self.log.push(step, loss, scale, outcome);
        if let (Some(unchanged), Some(before), Outcome::Stepped { .. }) =
            (&mut self.unchanged, before, outcome)
        {
            unchanged.push(before.unchanged_fraction(model));
        }
        let seconds = tick.elapsed().as_secs_f64();
        self.windows_timed += 1;
        if self.windows_timed <= WARMUP_WINDOWS {
            self.warmup.0 += seconds;
            self.warmup.1 += samples;
        } else {
            self.train_seconds += seconds;
            self.images += samples;
        }
        self.largest_window = self.largest_window.max(samples);
        let scale = stepper.scaler.now();
        let rate = self.images_per_sec();
        self.progress
            .step(outcome, loss, rate, scale, stepper.skipped);
        if stepper.diverged() {
            self.progress.finish();
            // The log of what led up to it is the most useful thing to keep.
            self.write_log()?;
            let cause = if stepper.scaler.is_active() {
                format!(
                    "the loss scale backed off to {scale} without one finite step, so the \
                     loss or the weights themselves are inf/NaN"
                )
            } else {
                "with loss scaling off, the inf/NaN comes from the model".into()
            };
            anyhow::bail!(
                "training diverged: the last {} optimizer steps all had inf/NaN gradients (last \
                 loss {loss}) and were skipped, so the weights were not updated by them; {cause}: \
                 {}; {}",
                stepper.max_skips(),
                remedy(stepper.lr()),
                checkpoint::describe(&checkpoint::dir(&self.output_dir))
            );
        }
        Ok(())
    }

    /// The error for weights that an update made inf/NaN (found before checkpointing them).
    pub fn diverged_weights<M: AutodiffModule<B>, B: AutodiffBackend>(
        &self,
        stepper: &Stepper<M, B>,
    ) -> anyhow::Error {
        self.progress.finish();
        anyhow::anyhow!(
            "training diverged: after step {} the weights are no longer finite (an update too \
             large for f32); {}; they were not checkpointed: {}",
            stepper.step,
            remedy(stepper.lr()),
            checkpoint::describe(&checkpoint::dir(&self.output_dir))
        )
    }

    /// The error for a run stopped by `signal` after checkpointing into `dir`.
    pub fn interrupted<M: AutodiffModule<B>, B: AutodiffBackend>(
        &self,
        signal: i32,
        stepper: &Stepper<M, B>,
        dir: &std::path::Path,
    ) -> anyhow::Error {
        self.progress.finish();
        Interrupted {
            signal,
            step: stepper.step,
            checkpoint: dir.to_path_buf(),
        }
        .into()
    }

    /// An evaluation after `epoch` epochs; printed above the bar when it ends an epoch.
    pub fn evaluated(&mut self, epoch: usize, epoch_end: bool, eval: EvalResult) {
        if epoch_end {
            self.progress.epoch(epoch, self.final_train_loss(), eval);
        }
        self.eval = Some(eval);
    }

    /// The step log so far, as CSV (saved with every checkpoint).
    pub fn log_csv(&self) -> String {
        self.log.csv()
    }

    /// Writes steps.csv (and loss_scale.svg with scaling on) into the output folder.
    pub fn write_log(&self) -> anyhow::Result<()> {
        if self.silent {
            return Ok(());
        }
        self.log.write(&self.output_dir, self.scaled)
    }

    /// Removes the progress bar.
    pub fn finish(&self) {
        self.progress.finish();
    }

    /// Images per second of training windows after the warm-up; of the warm-up itself when
    /// no window followed it.
    pub fn images_per_sec(&self) -> f64 {
        match self.images {
            0 => self.warmup.1 as f64 / self.warmup.0.max(1e-9),
            n => n as f64 / self.train_seconds.max(1e-9),
        }
    }

    /// Seconds and windows of the warm-up, and whether images/s excludes it.
    pub fn warmup(&self) -> Warmup {
        Warmup {
            seconds: self.warmup.0,
            steps: self.windows_timed.min(WARMUP_WINDOWS),
            excluded: self.images > 0,
        }
    }

    /// Mean of the last [`LOSS_WINDOW`] step losses (NaN before the first step).
    pub fn final_train_loss(&self) -> f64 {
        let losses: Vec<f64> = self.log.step_losses().collect();
        let tail = &losses[losses.len().saturating_sub(LOSS_WINDOW)..];
        tail.iter().sum::<f64>() / tail.len() as f64
    }

    /// Pure f16: the mean fraction of weights a step left unchanged.
    pub fn updates_lost(&self) -> Option<f64> {
        self.unchanged
            .as_ref()
            .map(|u| u.iter().sum::<f64>() / u.len().max(1) as f64)
    }

    /// The last evaluation, if any (a trial has none).
    pub fn eval(&self) -> Option<EvalResult> {
        self.eval
    }

    /// The most samples a window of this run held (`None` before the first window).
    pub fn largest_window(&self) -> Option<usize> {
        (self.largest_window > 0).then_some(self.largest_window)
    }

    /// Seconds since the run began.
    pub fn wall_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}
