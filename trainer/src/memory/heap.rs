//! The CPU probe: a global allocator that counts live bytes and keeps their peak.
//!
//! The `trainer` binary installs [`CountingAllocator`]; everything Flex allocates for tensors
//! goes through it. Counting costs two relaxed atomics per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::probe::{Meter, Probe, Reading};
use super::ProbeKind;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting. Install with `#[global_allocator]`.
pub struct CountingAllocator;

fn grow(bytes: usize) {
    let now = LIVE.fetch_add(bytes as u64, Relaxed) + bytes as u64;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call forwards to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as u64, Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size() as u64, Relaxed);
            grow(new_size);
        }
        p
    }
}

/// Bytes allocated and not yet freed.
pub fn live() -> u64 {
    LIVE.load(Relaxed)
}

/// The most bytes live at once since the last [`reset_peak`].
pub fn peak() -> u64 {
    PEAK.load(Relaxed)
}

/// Starts a new peak from the current live bytes.
pub fn reset_peak() {
    PEAK.store(live(), Relaxed);
}

/// Whether [`CountingAllocator`] is the global allocator (something has been counted).
pub fn installed() -> bool {
    live() > 0 || peak() > 0
}

/// The process heap as a [`Meter`]: live bytes, and the allocator's exact peak per window.
#[derive(Debug, Default)]
pub struct Heap;

impl Meter for Heap {
    fn kind(&self) -> ProbeKind {
        ProbeKind::Heap
    }

    fn read(&self) -> Option<Reading> {
        installed().then(|| Reading {
            in_use: live(),
            reserved: None,
        })
    }

    fn settle(&self) {
        // gemm (Flex's matmul and conv) allocates a packing slab of one L2 cache per thread on
        // its first use there and keeps it for the thread's life: the runtime's, not a step's,
        // as a GPU context is. Made now on every rayon worker and this thread, it is resident.
        let touch = || gemm_common::gemm::L2_SLAB.with(|_| ());
        rayon::broadcast(|_| touch());
        touch();
    }

    fn window_start(&self) {
        reset_peak();
    }

    fn exact_peak(&self) -> Option<u64> {
        installed().then(peak)
    }
}

/// Heap peaks over training steps (evaluation excluded), exact, and the heap's timeline.
pub type HeapProbe = Probe<Heap>;
