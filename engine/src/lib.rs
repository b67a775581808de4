//! oomlab's engine: the memory-lean autodiff ops the models are built from, the precision
//! policy they compute under and the per-run [`RunContext`] they report to.
//!
//! Two traits split the work the way Burn splits its own: [`ModelBackend`] holds the graph ops
//! (implemented once for plain backends, composed, and once for [`Autodiff`], as graph ops
//! that keep only what their backward reads); [`Kernels`] holds the pieces those ops are made
//! of, with defaults composed from Burn's ops and the CPU backend's overrides in [`cpu`]
//! (which runs the `flex-kernels` crate). Models know only [`ModelBackend`] and [`Precision`].
//!
//! [`Autodiff`]: burn::backend::Autodiff
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod attention;
pub mod batch_norm;
pub mod boundary;
mod cast;
mod composed;
pub mod context;
pub mod conv2d;
pub mod conv_bn_relu;
pub mod conv_relu_pool;
pub mod cpu;
pub mod footprint;
pub mod kernels;
pub mod max_pool;
pub mod model_backend;
pub mod precision;
pub mod relu;
pub mod sliced_linear;
pub mod slices;

pub use batch_norm::BatchNormOutput;
pub use boundary::{mark, Boundary, Pass};
pub use cast::cast;
pub use context::{Listener, RunContext};
pub use footprint::{Family, Footprint, Input, Layer, Plan, Planned, Sizes};
pub use kernels::Kernels;
pub use max_pool::PoolWindow;
pub use model_backend::ModelBackend;
pub use precision::{dtype_name, Precision};
