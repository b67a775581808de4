//! The training loop. It reads like the seed article's PyTorch loop:
//!
//! ```text
//! for images, labels in loader:            for chunk in order.chunks(batch):
//!     outputs = model(images)                  logits = model.forward(images, &precision)
//!     loss = criterion(outputs, labels)        loss = loss_fn.forward(logits, labels)
//!     optimizer.zero_grad(); loss.backward()   grads = loss.backward()  (fresh every step)
//!     optimizer.step()                         model = optim.step(lr, model, grads)
//! ```

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_models::Precision;

use crate::checkpoint::{self, LoopState};
use crate::config::Settings;
use crate::data::{self, shuffled, Batcher};
use crate::eval::{evaluate, EvalResult};
use crate::model::Classifier;
use crate::optim::Optim;
use crate::progress::Progress;
use crate::summary::Summary;

/// How many of the last step losses the summary's "final train loss" averages.
const LOSS_WINDOW: usize = 20;

/// Trains the model `settings` describes on `device`; `resume` continues from a checkpoint.
pub fn train<B: AutodiffBackend>(
    settings: &Settings,
    device: B::Device,
    backend: &str,
    resume: Option<&Path>,
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let t = &settings.train;
    B::seed(&device, t.seed);
    let precision = Precision::F32;

    let splits = data::load(&settings.data, settings.input_size)?;
    let batcher = Batcher::fit(&splits.train);
    let mut model: Classifier<B> = Classifier::init(&settings.model, &device)?;
    let mut optim = Optim::new(t);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    let mut state = LoopState {
        step: 0,
        epoch: 0,
        model: settings.model.name(),
        optimizer: format!("{:?}", t.optimizer).to_lowercase(),
        config: settings.toml.clone(),
    };
    if let Some(dir) = resume {
        (model, optim, state) = checkpoint::load(dir, model, optim, &state, &device)?;
        state.config = settings.toml.clone();
    }

    let n = splits.train.len();
    let steps_per_epoch = n.div_ceil(t.batch_size);
    let total_steps = t.max_steps.unwrap_or(t.epochs * steps_per_epoch);
    let checkpoint_dir = checkpoint::dir(&t.output_dir);
    let mut progress = Progress::new(total_steps, state.step);
    let mut losses: Vec<f64> = Vec::new();
    let (mut train_seconds, mut images_seen) = (0.0, 0usize);
    let mut eval: Option<EvalResult> = None;

    while state.step < total_steps {
        let order = shuffled(n, t.seed, state.epoch as u64);
        // Resuming mid-epoch (after a max_steps run) skips the batches already trained on.
        let done_in_epoch = state.step - state.epoch * steps_per_epoch;
        for chunk in order.chunks(t.batch_size).skip(done_in_epoch) {
            if state.step >= total_steps {
                break;
            }
            let tick = Instant::now();
            let (images, labels) = batcher.batch::<B>(&splits.train, chunk, &device);
            let logits = model.forward(images, &precision);
            let loss = loss_fn.forward(logits, labels);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(t.lr, model, grads);
            let loss: f64 = loss.into_scalar().elem();
            train_seconds += tick.elapsed().as_secs_f64();
            images_seen += chunk.len();
            state.step += 1;
            losses.push(loss);
            progress.step(loss, images_seen as f64 / train_seconds.max(1e-9));
        }
        if state.step == (state.epoch + 1) * steps_per_epoch {
            state.epoch += 1;
            let result = evaluate(
                &model.valid(),
                &splits.eval,
                &batcher,
                t.batch_size,
                &precision,
                &device,
            );
            progress.epoch(state.epoch, mean_tail(&losses), result);
            eval = Some(result);
            checkpoint::save(&checkpoint_dir, &model, &optim, &state)
                .with_context(|| format!("saving checkpoint after epoch {}", state.epoch))?;
        }
    }
    progress.finish();
    // A run stopped by max_steps mid-epoch is still evaluated and checkpointed at its end.
    let eval = match eval {
        Some(e) if state.step.is_multiple_of(steps_per_epoch) => e,
        _ => {
            checkpoint::save(&checkpoint_dir, &model, &optim, &state)
                .context("saving final checkpoint")?;
            evaluate(
                &model.valid(),
                &splits.eval,
                &batcher,
                t.batch_size,
                &precision,
                &device,
            )
        }
    };

    Ok(Summary {
        config: settings.path.display().to_string(),
        model: settings.model.name(),
        parameters: model.trainable_params(),
        backend: backend.to_string(),
        precision: "f32".into(),
        optimizer: state.optimizer.clone(),
        batch_size: t.batch_size,
        steps: state.step,
        epochs: state.epoch,
        images_per_sec: images_seen as f64 / train_seconds.max(1e-9),
        final_train_loss: mean_tail(&losses),
        eval_loss: eval.loss,
        eval_accuracy: eval.accuracy,
        wall_seconds: started.elapsed().as_secs_f64(),
        checkpoint: checkpoint_dir.display().to_string(),
    })
}

/// Mean of the last [`LOSS_WINDOW`] losses (NaN before the first step).
fn mean_tail(losses: &[f64]) -> f64 {
    let tail = &losses[losses.len().saturating_sub(LOSS_WINDOW)..];
    tail.iter().sum::<f64>() / tail.len() as f64
}
