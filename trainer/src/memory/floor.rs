//! The analytic floor: the least memory a training step of this model can peak at with the
//! layers oomlab has, whatever the allocator and the scheduling.
//!
//! ```text
//! floor = parameters + optimizer state (+ BN buffers)
//!       + max( gradients                                   at the optimizer step,
//!              saved activations + one activation gradient at backward's worst instant )
//! ```
//! Walking backward, a layer's output gradient is alive beside everything that layer and the
//! layers before it saved; the worst such instant is the activation term. Nothing else is
//! counted: no input gradient, no kernel scratch, no parameter gradient before the step, so a
//! measured peak cannot be below the floor, and the distance to it is what the allocator,
//! the kernels and the schedule add.
//!
//! The saved activations are the fused blocks' (the least of any layer set here): each
//! block's input and, for conv → BN → ReLU, the batch-norm input and per-channel statistics;
//! for conv → ReLU → max-pool, the pooled output and one byte per output. The floor is
//! computed from that tape even for a config that does not fuse.

use serde::Serialize;

/// The floor's terms, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Floor {
    /// Parameters, BN buffers, optimizer state (and, with accumulation, the window's summed
    /// gradients): alive all through the step. No half weight copies: the fused ops cast the
    /// f32 weights themselves and keep none.
    pub model_state: u64,
    /// One set of parameter gradients, alive at the optimizer step.
    pub gradients: u64,
    /// At backward's worst instant: the fused blocks' saved activations still alive.
    pub saved: u64,
    /// At that instant: the output gradient of the layer being differentiated.
    pub gradient: u64,
}

impl Floor {
    /// The floor: model state and the larger of the two instants.
    pub fn total(&self) -> u64 {
        self.model_state + self.gradients.max(self.saved + self.gradient)
    }

    /// How many times the floor `bytes` is (0 when the floor is 0).
    pub fn ratio(&self, bytes: u64) -> f64 {
        match self.total() {
            0 => 0.0,
            t => bytes as f64 / t as f64,
        }
    }
}
