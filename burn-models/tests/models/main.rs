//! The models, and the engine's ops and CPU kernels under them, on the CPU backend: one test
//! binary (each one links Burn).
//!
//! Table of contents:
/// Memory-efficient attention against naive attention, values and gradients, f32 and f16, and
/// what each keeps (counted by this binary's allocator).
mod attention;
/// oomlab's batch-norm autodiff op against Burn's BatchNorm, in f32 and f16.
mod batch_norm;
/// Layer boundaries: identity ops heard in both passes, checkpointing included.
mod boundary;
/// The engine's composed conv and ReLU layers against Burn's, values and gradients.
mod composed;
/// The CPU backend's own conversions and in-place gemm sum against Flex's generic ops.
mod flex;
/// The fused blocks against the composed layers: the same bits forward and backward.
mod fused;
/// The GPT-2-style model: parameter count, bad configs, causality, both attentions, learning.
mod gpt;
/// The engine's max-pool against Burn's; its backward heard between its boundaries.
mod pool;
/// Parameter counts against the article, the paper, Keras and torchvision; output shapes; bad
/// configs.
mod shapes;
/// The fused block's slices: by its output on CubeCL, by the cache size on the CPU.
mod slices;

use burn_models::{Precision, RunContext};

/// A fresh context (no listener, nothing lent) computing under `p`.
fn cx(p: &Precision) -> RunContext {
    RunContext::new(*p)
}

/// The largest difference between `a` and `b`, relative to `b`'s largest magnitude; both must
/// be finite (a NaN would slip through `max`).
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    assert!(
        a.iter().chain(b).all(|v| v.is_finite()),
        "a value not finite"
    );
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}
