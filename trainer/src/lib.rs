//! oomlab's trainer: configuration, data, the training loop and its reports.

pub mod backend;
pub mod cli;
pub mod commands;
pub mod config;
pub mod data;
pub mod malloc;
pub mod memory;
pub mod model;
pub mod report;
pub mod training;
