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

/// Bytes each thread has allocated and not freed (a free counts against the thread that
/// frees). The kept-memory tests run their ops on one thread of their own, so its count is
/// theirs.
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<i64> = const { Cell::new(0) };
        static PEAK: Cell<i64> = const { Cell::new(0) };
    }

    pub struct Counting;

    fn add(bytes: i64) {
        // `try_with`: a thread's allocations after its locals are gone go uncounted.
        let _ = LIVE.try_with(|l| {
            let now = l.get() + bytes;
            l.set(now);
            let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
        });
    }

    // SAFETY: every call forwards to `System` unchanged; only a thread-local counter is added.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            add(layout.size() as i64);
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            add(layout.size() as i64);
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            add(-(layout.size() as i64));
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            add(new_size as i64 - layout.size() as i64);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    /// This thread's live bytes.
    pub fn live() -> i64 {
        LIVE.with(|l| l.get())
    }

    /// This thread's highest live bytes since [`reset_peak`].
    pub fn peak() -> i64 {
        PEAK.with(|p| p.get())
    }

    /// Starts [`peak`] again from the live bytes now.
    pub fn reset_peak() {
        PEAK.with(|p| p.set(live()));
    }

    /// `f`'s result, run on a one-thread pool of its own (so every allocation of its ops is
    /// counted on that thread) after the thread's first matmul has made gemm's packing slab
    /// (one L2 cache's bytes, kept for the thread's life).
    pub fn on_one_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        use burn::backend::Flex;
        use burn::tensor::Tensor;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| {
            let square = || Tensor::<Flex, 2>::ones([512, 512], &Default::default());
            drop(square().matmul(square()));
            f()
        })
    }
}

#[global_allocator]
static COUNTING: counting::Counting = counting::Counting;
