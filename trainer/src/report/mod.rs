//! What a run tells its user: the progress bar while it trains, the per-window step log
//! (steps.csv, loss_scale.svg) and the end-of-run summary.

pub mod progress;
pub mod step_log;
pub mod summary;
