//! Evaluation on the eval split, on the inner backend: no autodiff graph, no saved activations.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use burn_models::{ModelBackend, Precision};

use crate::data::{Batcher, ImageSet};
use crate::model::Classifier;

/// Mean loss and accuracy over a split.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct EvalResult {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction of correct predictions, in [0, 1].
    pub accuracy: f64,
}

/// Evaluates `model` (already `valid()`, so batch norm uses its running statistics) on `set`.
pub fn evaluate<B: ModelBackend>(
    model: &Classifier<B>,
    set: &ImageSet,
    batcher: &Batcher,
    batch_size: usize,
    precision: &Precision,
    device: &B::Device,
) -> EvalResult {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut loss_sum, mut correct) = (0.0, 0usize);
    let indices: Vec<usize> = (0..set.len()).collect();
    for chunk in indices.chunks(batch_size) {
        let (images, labels) = batcher.batch::<B>(set, chunk, device);
        let logits = model.forward(images, precision);
        let loss: f64 = loss_fn
            .forward(logits.clone(), labels.clone())
            .into_scalar()
            .elem();
        loss_sum += loss * chunk.len() as f64;
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
    let n = set.len().max(1) as f64;
    EvalResult {
        loss: loss_sum / n,
        accuracy: correct as f64 / n,
    }
}
