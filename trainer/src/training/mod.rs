//! The training loop. It reads like the seed article's PyTorch AMP loop:
//!
//! ```text
//! for i, (images, labels) in enumerate(loader):   for window in epoch's windows:
//!     with autocast():                                for micro in window.chunks(batch):
//!         loss = criterion(model(images), labels)         loss = ce(model.forward(x, &policy), y)
//!     scaler.scale(loss / k).backward()                   grads += (loss · share · scale)'
//!     if (i + 1) % k == 0:                            unscale; skip on inf/NaN; clip
//!         scaler.step(optimizer); scaler.update()     model = optim.step(lr(step), model, grads)
//!         optimizer.zero_grad()                       (grads are fresh for every window)
//! ```
//! `share` is the micro-batch's fraction of the window's samples: with a short last window
//! that is what `loss / k` gets wrong.


pub mod accumulate;
pub mod checkpoint;
pub mod eval;
pub mod grads;
pub mod loss_scale;
pub mod lost_updates;
pub mod optim;
pub mod schedule;
pub mod step;

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn_models::{cast_params, dtype_name, BatchNormBackend, PrecisionMode};

use accumulate::{window_gradients, Windows};
use checkpoint::LoopState;
use crate::config::{unsupported_dtype, FreeCache, Settings};
use crate::data::{self, shuffled, Batcher};
use eval::{evaluate, EvalResult};
use loss_scale::LossScaler;
use crate::memory::estimate::estimate;
use crate::memory::{MemoryProbe, Phase};
use crate::model::Classifier;
use optim::Optim;
use crate::report::progress::Progress;
use schedule::LrSchedule;
use step::{Outcome, Stepper, MAX_CONSECUTIVE_SKIPS};
use crate::report::step_log::StepLog;
use crate::report::summary::Summary;
use lost_updates::Before;

/// How many of the last step losses the summary's "final train loss" averages.
const LOSS_WINDOW: usize = 20;

/// How a run starts and ends, beyond its config.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions<'a> {
    /// Continue from this checkpoint folder.
    pub resume: Option<&'a Path>,
    /// A measuring trial (`find-batch-size`): no evaluation, no checkpoint.
    pub trial: bool,
}

/// Trains the model `settings` describes on `device`; `probe` measures memory over the
/// training steps.
pub fn train<B>(
    settings: &Settings,
    device: B::Device,
    backend: &str,
    options: RunOptions,
    probe: &mut dyn MemoryProbe,
) -> anyhow::Result<Summary>
where
    B: AutodiffBackend + BatchNormBackend,
    B::InnerBackend: BatchNormBackend,
{
    let started = Instant::now();
    let (t, p) = (&settings.train, &settings.precision);
    if let Some(half) = p.mode.half() {
        if !B::supports_dtype(&device, half) {
            return Err(unsupported_dtype(p.mode, backend).into());
        }
    }
    B::seed(&device, t.seed);
    let policy = p.policy();

    let splits = data::load(&settings.data, settings.input_size)?;
    let batcher = Batcher::fit(&splits.train);
    let mut model: Classifier<B> = Classifier::init(&settings.model, &device)?;
    let mut optim = Optim::new(t);

    let windows = Windows {
        batch_size: t.batch_size,
        accum_steps: t.accum_steps,
    };
    let n = splits.train.len();
    let per_epoch = windows.per_epoch(n);
    let total_steps = t.max_steps.unwrap_or(t.epochs * per_epoch);
    let mut state = LoopState {
        step: 0,
        epoch: 0,
        window: 0,
        skipped: 0,
        scaler: None,
        model: settings.model.name(),
        optimizer: format!("{:?}", t.optimizer).to_lowercase(),
        config: settings.toml.clone(),
    };
    if let Some(dir) = options.resume {
        if p.mode == PrecisionMode::F16 {
            anyhow::bail!(
                "--resume is not available with precision.mode = \"f16\": checkpoints store \
                 f32 weights, and this mode has none to return to"
            );
        }
        (model, optim, state) = checkpoint::load(dir, model, optim, &state, &device)?;
        state.config = settings.toml.clone();
    }
    if p.mode == PrecisionMode::F16 {
        // No master weights: the parameters themselves become f16.
        model = cast_params(model, p.mode.parameter_dtype());
    }
    let mut stepper = Stepper {
        optim,
        scaler: LossScaler::new(p.loss_scale),
        schedule: LrSchedule::new(t, total_steps),
        clip_norm: t.grad_clip_norm,
        step: state.step,
        skipped: state.skipped,
        consecutive_skips: 0,
    };
    if let Some(saved) = state.scaler {
        stepper.scaler.restore(saved);
    }

    let checkpoint_dir = checkpoint::dir(&t.output_dir);
    let mut progress = Progress::new(total_steps, state.step);
    let mut losses: Vec<f64> = Vec::new();
    let (mut train_seconds, mut images_seen) = (0.0, 0usize);
    let mut eval: Option<EvalResult> = None;
    // Pure f16 has no master weights; how many updates round away is what it teaches.
    let track_updates = !p.mode.master_weights();
    let mut unchanged: Vec<f64> = Vec::new();
    let mut log = StepLog::default();
    let scaled = stepper.scaler.is_active();
    let done = |s: &Stepper<_, _>, epoch: usize| match t.max_steps {
        Some(max) => s.step >= max,
        None => epoch >= t.epochs,
    };

    while !done(&stepper, state.epoch) {
        let order = shuffled(n, t.seed, state.epoch as u64);
        // Resuming mid-epoch skips the windows already trained on.
        for window in windows.split(&order).skip(state.window) {
            if done(&stepper, state.epoch) {
                break;
            }
            let tick = Instant::now();
            probe.sample(Phase::WindowStart);
            let w = window_gradients(
                &model,
                window,
                t.batch_size,
                &policy,
                stepper.scaler.scale(),
                probe,
                |idx| batcher.batch::<B>(&splits.train, idx, &device),
            );
            let before = track_updates.then(|| Before::<B>::of(&model));
            let (step, scale) = (stepper.step, stepper.scaler.scale());
            let outcome;
            (model, outcome) = stepper.apply(model, w.grads);
            log.push(step, w.loss, scale, outcome);
            if settings.memory.free_cache == FreeCache::Step {
                B::memory_cleanup(&device);
            }
            probe.sample(Phase::AfterStep);
            if let (Some(before), Outcome::Stepped { .. }) = (before, outcome) {
                unchanged.push(before.unchanged_fraction(&model));
            }
            train_seconds += tick.elapsed().as_secs_f64();
            images_seen += window.len();
            state.window += 1;
            if let Outcome::Stepped { .. } = outcome {
                losses.push(w.loss);
            }
            progress.step(
                outcome,
                w.loss,
                images_seen as f64 / train_seconds.max(1e-9),
                &stepper.scaler.describe(),
                stepper.skipped,
            );
            if stepper.diverged() {
                progress.finish();
                // The log of what led up to it is the most useful thing to keep.
                log.write(&t.output_dir, scaled)?;
                anyhow::bail!(
                    "training diverged: the last {MAX_CONSECUTIVE_SKIPS} optimizer steps all had \
                     inf/NaN gradients (loss scale now {}, last loss {}); the weights were not \
                     updated by them; {}",
                    stepper.scaler.describe(),
                    w.loss,
                    checkpoint::describe(&checkpoint_dir)
                );
            }
        }
        sync_state(&mut state, &stepper);
        if state.window == per_epoch {
            state.epoch += 1;
            state.window = 0;
            if settings.memory.free_cache == FreeCache::Epoch {
                B::memory_cleanup(&device);
            }
            if options.trial {
                continue;
            }
            let result = evaluate(
                &model.valid(),
                &splits.eval,
                &batcher,
                t.batch_size,
                &policy,
                &device,
            );
            progress.epoch(state.epoch, mean_tail(&losses), result);
            eval = Some(result);
            checkpoint::save(&checkpoint_dir, &model, &stepper.optim, &state)
                .with_context(|| format!("saving checkpoint after epoch {}", state.epoch))?;
            log.write(&t.output_dir, scaled)?;
        }
    }
    progress.finish();
    // A run stopped by max_steps mid-epoch is still evaluated, checkpointed and logged at its
    // end (at an epoch's end all three were done above).
    let eval = match eval {
        _ if options.trial => EvalResult {
            loss: f64::NAN,
            accuracy: f64::NAN,
        },
        Some(e) if state.window == 0 => e,
        _ => {
            checkpoint::save(&checkpoint_dir, &model, &stepper.optim, &state)
                .context("saving final checkpoint")?;
            log.write(&t.output_dir, scaled)?;
            evaluate(
                &model.valid(),
                &splits.eval,
                &batcher,
                t.batch_size,
                &policy,
                &device,
            )
        }
    };

    let memory = probe.report();
    let predicted = estimate(settings, backend == "cpu").predicted_peak(backend == "cpu");
    Ok(Summary {
        config: settings.path.display().to_string(),
        model: settings.model.name(),
        parameters: model.trainable_params(),
        backend: backend.to_string(),
        precision: p.mode.name().into(),
        batch_norm: model
            .has_batch_norm()
            .then(|| dtype_name(policy.batch_norm).to_string()),
        loss_scale: stepper.scaler.describe(),
        skipped_steps: stepper.skipped,
        updates_lost: track_updates
            .then(|| unchanged.iter().sum::<f64>() / unchanged.len().max(1) as f64),
        optimizer: state.optimizer.clone(),
        batch_size: t.batch_size,
        accum_steps: t.accum_steps,
        effective_batch: t.effective_batch(),
        lr_schedule: format!("{:?}", t.lr_schedule).to_lowercase(),
        free_cache: settings.memory.free_cache.name().into(),
        checkpointing: settings.memory.checkpointing.name().into(),
        final_lr: stepper.lr(),
        steps: state.step,
        epochs: state.epoch,
        images_per_sec: images_seen as f64 / train_seconds.max(1e-9),
        final_train_loss: mean_tail(&losses),
        eval_loss: eval.loss,
        eval_accuracy: eval.accuracy,
        wall_seconds: started.elapsed().as_secs_f64(),
        checkpoint: checkpoint_dir.display().to_string(),
        predicted_peak_bytes: predicted,
        prediction_error: memory
            .peak_bytes
            .map(|m| m as f64 / predicted.max(1) as f64 - 1.0),
        memory,
    })
}

/// Copies the stepper's counters into the state a checkpoint records.
fn sync_state<M: AutodiffModule<B>, B: AutodiffBackend>(s: &mut LoopState, st: &Stepper<M, B>) {
    s.step = st.step;
    s.skipped = st.skipped;
    s.scaler = st.scaler.is_active().then(|| st.scaler.state());
}

/// Mean of the last [`LOSS_WINDOW`] losses (NaN before the first step).
fn mean_tail(losses: &[f64]) -> f64 {
    let tail = &losses[losses.len().saturating_sub(LOSS_WINDOW)..];
    tail.iter().sum::<f64>() / tail.len() as f64
}
