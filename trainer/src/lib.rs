//! oomlab's trainer: configuration, data, the training loop and its reports.

pub mod accumulate;
pub mod backend;
pub mod batch_finder;
pub mod checkpoint;
pub mod child;
pub mod cli;
pub mod compare;
pub mod config;
pub mod data;
pub mod eval;
pub mod grads;
pub mod loss_scale;
pub mod malloc;
pub mod memory;
pub mod model;
pub mod oom;
pub mod optim;
pub mod progress;
pub mod report;
pub mod schedule;
pub mod step;
pub mod step_log;
pub mod summary;
pub mod train;
pub mod updates;
