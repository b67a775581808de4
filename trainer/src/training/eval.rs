//! Evaluation on the eval split, on the inner backend: no autodiff graph, no saved activations.
//! (`[mistakes] eval_with_autograd` passes the autodiff model instead, to measure the cost.)

use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use oomlab_engine::{ModelBackend, RunContext};

use crate::data::{Split, Splits};
use crate::model::Network;
use crate::training::mistakes::KeptLosses;

/// Mean loss and accuracy over a split.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct EvalResult {
    /// Mean cross-entropy per prediction (per image, or per token).
    pub loss: f64,
    /// Fraction of correct predictions, in [0, 1].
    pub accuracy: f64,
    /// A language model's perplexity, `exp(loss)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<f64>,
    /// Predictions per second of wall time (images, or a language model's tokens).
    pub per_sec: f64,
}

/// Evaluates `model` on the eval split of `splits`: normally `valid()`, so batch norm uses its running statistics
/// and no graph is built. With `keep_losses` (the mistake), every batch's loss tensor is kept
/// in a running sum until the end.
pub fn evaluate<B: ModelBackend>(
    model: &Network<B>,
    splits: &Splits,
    batch_size: usize,
    cx: &RunContext,
    device: &B::Device,
    keep_losses: bool,
) -> EvalResult {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut loss_sum, mut correct, mut predictions) = (0.0, 0usize, 0usize);
    let mut kept = KeptLosses::<B>::new(keep_losses);
    let indices: Vec<usize> = (0..splits.len(Split::Eval)).collect();
    let started = std::time::Instant::now();
    for chunk in indices.chunks(batch_size) {
        let (logits, labels) = model.predict(splits.batch::<B>(Split::Eval, chunk, device), cx);
        let n = labels.dims()[0];
        let loss = loss_fn.forward(logits.clone(), labels.clone());
        kept.add(&loss);
        let loss: f64 = loss.into_scalar().elem();
        loss_sum += loss * n as f64;
        predictions += n;
        let hits: i64 = logits
            .argmax(1)
            .squeeze_dim::<1>(1)
            .equal(labels)
            .int()
            .sum()
            .into_scalar()
            .elem();
        correct += hits as usize;
    }
    let n = predictions.max(1) as f64;
    let loss = loss_sum / n;
    EvalResult {
        loss,
        accuracy: correct as f64 / n,
        perplexity: model.is_language_model().then(|| loss.exp()),
        per_sec: predictions as f64 / started.elapsed().as_secs_f64().max(1e-9),
    }
}
