//! End-to-end tests: the real `trainer` binary on the real configs, on the CPU backend and on
//! wgpu over a software Vulkan device (llvmpipe).
//!
//! Table of contents:
/// The book's commands parse and its figures exist.
mod book;
/// Hostile checkpoints: files that are no regular files, foreign names, records of another run.
mod checkpoints;
mod common;
/// `[distributed]`: peers that equal one device, per-replica batch norm, faults on one peer.
mod distributed;
/// Bad configs, flags and data: exact messages and exit codes.
mod errors;
/// free_cache, the budget and its diagnosis, `compare`, `find-batch-size`.
mod fixes;
/// `memory.fuse = "blocks"`: lower peaks, the same losses, estimated.
mod fused;
/// Heap peaks: what mixed precision, accumulation and BN in f32 cost.
mod memory;
/// `[mistakes]`: evaluating with autograd, keeping loss tensors; compare's line charts.
mod mistakes;
/// Where a run writes: locked folders, regular output files, nothing it does not own.
mod outputs;
/// Mixed precision, loss scaling and accumulation through the binary.
mod precision;
/// Hostile input: no hang, no silent wrong state, nothing lost (issue 13).
mod reliability;
/// Checkpoints and `--resume`.
mod resume;
/// `distributed.shard`: ZeRO-1 and -2 equal the unsharded run, checkpoints, what each peer
/// holds.
mod sharding;
/// Ctrl-C, SIGTERM and SIGHUP: clean stops, a second signal, parents that forward.
mod signals;
/// Training runs: both models learn, runs are reproducible, backends are chosen right.
mod train;
/// The GPU path on llvmpipe: a real CubeCL pool, free_cache, checkpointing, resume, errors.
mod wgpu;
