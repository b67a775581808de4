//! End-to-end tests: the real `trainer` binary on the real configs, on the CPU backend.
//!
//! Table of contents:
/// The book's commands parse and its figures exist.
mod book;
mod common;
/// Bad configs, flags and data: exact messages and exit codes.
mod errors;
/// free_cache, the budget and its diagnosis, `compare`, `find-batch-size`.
mod fixes;
/// Heap peaks: what mixed precision, accumulation and BN in f32 cost.
mod memory;
/// Mixed precision, loss scaling and accumulation through the binary.
mod precision;
/// Hostile input: no hang, no silent wrong state, nothing lost (issue 13).
mod reliability;
/// Checkpoints and `--resume`.
mod resume;
/// Training runs: both models learn, runs are reproducible, backends are chosen right.
mod train;
