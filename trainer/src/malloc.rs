//! glibc malloc tuning for training on the CPU.
//!
//! A training step allocates and frees the same large activation buffers every step. glibc
//! serves blocks over 128 KiB with `mmap` and unmaps them on free, so every step page-faults
//! and zeroes them again: measured on 2 cores, 35% of the run's time was kernel time. Raising
//! the mmap threshold to its maximum (32 MiB on 64-bit) and never trimming keeps those pages:
//! SimpleModel f32 batch 128 went from 380 to 500 images/s (docs/src/appendix-speed.md).
//! The threshold's maximum still sent SimpleModel's 32 MiB conv output and its gradient to
//! `mmap`; with `mmap` switched off, every block comes from the arenas and stays: a 32 MiB
//! ReLU's backward went from 40 to 19 ms. Blocks an arena cannot hold go to the main arena
//! (glibc retries there), which grows with `brk`.

/// Applies the tuning; a no-op where the allocator is not glibc's.
pub fn tune_for_training() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before any threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
