//! oomlab's trainer: trains a model from a TOML config with its own training loop, measures
//! what each step costs in memory, and compares the fixes for "CUDA out of memory".
//!
//! # Map
//! | module | what it holds |
//! |---|---|
//! | [`cli`] | the command line, parsed and range-checked by clap |
//! | [`commands`] | one file per command: `run` (train), `estimate`, `compare/` (runner + report), `find_batch_size`, and `child` (the child processes the last two start) |
//! | [`exit`] | the exit codes and what is printed for each error |
//! | [`config`] | the TOML file: one file per section, each with its raw struct, validated spec and validation |
//! | [`data`] | synthetic images and CIFAR-10, normalised and batched |
//! | [`model`] | the network a config names (SimpleModel, MobileNet or ResNet, from `burn-models`) |
//! | [`outputs`] | where a run writes: folders claimed and locked, output paths checked before any work |
//! | [`backend`] | CPU (Flex), CUDA or wgpu (Vulkan/Metal), chosen once at start-up: `mod.rs` (types, `auto`), `cuda.rs`, `wgpu.rs` (adapters) |
//! | [`distributed`] | data parallel: one peer per device on burn-collective (`link.rs`: calls with a timeout; `peer.rs`: shards and sums; `fault.rs`: test faults) |
//! | [`training`] | the loop (`training/mod.rs`, read beside the article's PyTorch loop) and its parts |
//! | [`memory`] | one probe (`probe.rs`) over the heap or a CubeCL pool (`heap.rs`, `cube.rs`) sampled at every layer boundary (`timeline.rs`), the analytic estimate, the OOM diagnosis and its capture, `free_cache` |
//! | [`report`] | progress bar, per-window step log, memory timeline chart, end-of-run summary |
//! | [`malloc`], [`panics`] | glibc tuning for CPU training; capturing panics from CubeCL |
//!
//! # Where each fix lives
//! | fix (the seed article's, then beyond) | config switch | file(s) |
//! |---|---|---|
//! | 1. gradient accumulation | `train.accum_steps` | `training/accumulate.rs` (windows, loss weighted by share), `training/step.rs` (one step per window) |
//! | 2. mixed precision, f32 master weights | `precision.mode` | `config/precision.rs` (modes), `burn-models` `precision.rs` + `layers.rs` (casts at layer boundaries) |
//! | 2. dynamic loss scaling | `precision.loss_scale` | `training/loss_scale.rs`, `training/step.rs` (unscale once, skip on inf/NaN) |
//! | 2. batch norm kept in f32 | `precision.batch_norm_f32` | `burn-models` `batch_norm.rs` (autodiff op saving the half input and f32 statistics) |
//! | 3. a smaller model | `model.width_multiplier` | `burn-models` `mobilenet.rs` |
//! | 4. freeing cached memory | `memory.free_cache` | `memory/free_cache.rs` |
//! | activation checkpointing | `memory.checkpointing` | `backend/mod.rs` (Burn's balanced strategy, picked by type) |
//! | fused blocks | `memory.fuse` | `oomlab_engine::conv_bn_relu`, `oomlab_engine::conv_relu_pool` (custom autodiff ops) |
//! | knowing before you run | `memory.budget` | `memory/estimate.rs`, `memory/diagnosis.rs` (fixes ranked) |
//! | surviving an OOM | — | `memory/catch.rs` (the panic becomes the diagnosis, exit 3) |
//! | the mistakes (teaching) | `mistakes.eval_with_autograd`, `mistakes.keep_losses` | `training/mistakes.rs`, `training/eval.rs`; the probe's evaluation peak (`memory/probe.rs`), per-step memory in `steps.csv` |
//! | autotune (`cudnn.benchmark`) | `backend.autotune`, `backend.autotune_cache` | `backend/mod.rs` (`configure_cubecl`) |
//! | the largest batch that fits | — | `commands/find_batch_size.rs` |
//! | data parallel | `[distributed] devices` | `distributed/` (peers, shards, summed gradients), `training/mod.rs` (one `reduce` per window) |
//! | measuring it | — | `memory/probe.rs` + `memory/heap.rs` (exact CPU heap) or `memory/cube.rs` (CubeCL pool, CUDA or wgpu), `burn-models` `boundary.rs` (a sample at every layer boundary, forward and backward), `report/timeline.rs`, `commands/compare/` |

pub mod backend;
pub mod cli;
pub mod commands;
pub mod config;
pub mod data;
pub mod distributed;
pub mod exit;
pub mod malloc;
pub mod memory;
pub mod model;
pub mod outputs;
pub mod panics;
pub mod report;
pub mod training;
