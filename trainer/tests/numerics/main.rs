//! Numerics of the training step on the CPU backend: mixed precision against f32, gradient
//! accumulation against one large batch, and the loss scaler's skip/backoff/growth.
//! Two trainings in one process keep to their own run contexts.

mod accumulate;
mod common;
mod concurrent;
mod estimate;
mod loss_scale;
mod precision;
mod step;
