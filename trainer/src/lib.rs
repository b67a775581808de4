//! oomlab's trainer: configuration, data, the training loop and its reports.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod eval;
pub mod malloc;
pub mod model;
pub mod optim;
pub mod progress;
pub mod summary;
pub mod train;
