//! Evaluation on the eval split, on the inner backend: no autodiff graph, no saved activations.
//! (`[mistakes] eval_with_autograd` passes the autodiff model instead, to measure the cost.)

use burn::nn::loss::CrossEntropyLossConfig;
use burn::prelude::*;
use oomlab_engine::{ModelBackend, RunContext};

use crate::data::{Batcher, ImageSet};
use crate::model::Classifier;
use crate::training::mistakes::KeptLosses;

/// Mean loss and accuracy over a split.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct EvalResult {
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction of correct predictions, in [0, 1].
    pub accuracy: f64,
}

/// Evaluates `model` on `set`: normally `valid()`, so batch norm uses its running statistics
/// and no graph is built. With `keep_losses` (the mistake), every batch's loss tensor is kept
/// in a running sum until the end.
pub fn evaluate<B: ModelBackend>(
    model: &Classifier<B>,
    set: &ImageSet,
    batcher: &Batcher,
    batch_size: usize,
    cx: &RunContext,
    device: &B::Device,
    keep_losses: bool,
) -> EvalResult {
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let (mut loss_sum, mut correct) = (0.0, 0usize);
    let mut kept = KeptLosses::<B>::new(keep_losses);
    let indices: Vec<usize> = (0..set.len()).collect();
    for chunk in indices.chunks(batch_size) {
        let (images, labels) = batcher.batch::<B>(set, chunk, device);
        let logits = model.forward(images, cx);
        let loss = loss_fn.forward(logits.clone(), labels.clone());
        kept.add(&loss);
        let loss: f64 = loss.into_scalar().elem();
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
