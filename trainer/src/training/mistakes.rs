//! `[mistakes] keep_losses`: the `total_loss += loss` mistake, made on purpose so that its
//! cost can be measured. The right way, which the loop takes otherwise, is to keep the loss's
//! *number* (`into_scalar`) and let the tensor drop.

use burn::prelude::*;

/// A running sum of loss tensors, autodiff graph and all, kept until it is dropped; empty
/// (and free) when the switch is off.
pub struct KeptLosses<B: Backend> {
    on: bool,
    total: Option<Tensor<B, 1>>,
}

impl<B: Backend> KeptLosses<B> {
    /// A sum that keeps what it is given when `on`, and nothing otherwise.
    pub fn new(on: bool) -> Self {
        Self { on, total: None }
    }

    /// `total_loss += loss`: the sum now refers to `loss`, and through it to every tensor its
    /// graph still holds.
    pub fn add(&mut self, loss: &Tensor<B, 1>) {
        if self.on {
            self.total = Some(match self.total.take() {
                Some(total) => total + loss.clone(),
                None => loss.clone(),
            });
        }
    }
}
