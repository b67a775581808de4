//! `memory.free_cache`: giving the allocator's cached blocks back to the device, Burn's
//! `memory_cleanup`, the analogue of `torch.cuda.empty_cache()`. It lowers *reserved* memory,
//! never the peak in use: the next step allocates the same tensors again.

use burn::tensor::backend::Backend;

use crate::config::FreeCache;

impl FreeCache {
    /// After an optimizer step: cleans up when the switch says `step`, else nothing.
    pub fn after_step<B: Backend>(self, device: &B::Device) {
        if self == Self::Step {
            B::memory_cleanup(device);
        }
    }

    /// After an epoch (before evaluation): cleans up when the switch says `epoch`.
    pub fn after_epoch<B: Backend>(self, device: &B::Device) {
        if self == Self::Epoch {
            B::memory_cleanup(device);
        }
    }
}
