//! Models for oomlab: the seed article's [`SimpleModel`] and a MobileNetV1 ([`MobileNet`]).
//!
//! Both are generic over a Burn [`Backend`](burn::tensor::backend::Backend) and take a
//! [`Precision`] policy in `forward`: the policy decides every dtype, the layers only apply it.
#![warn(missing_docs)]

pub mod backend;
pub mod batch_norm;
pub mod boundary;
pub mod conv_bn_relu;
pub mod conv_relu_pool;
mod flex;
pub mod grad_sum;
pub mod layers;
pub mod mobilenet;
pub mod precision;
pub mod simple;
pub mod sliced_linear;
pub mod slices;

pub use backend::ModelBackend;
pub use boundary::{mark, Boundary};
pub use mobilenet::{MobileNet, MobileNetConfig, MobileNetError};
pub use precision::{cast, dtype_name, Precision};
pub use simple::{SimpleModel, SimpleModelConfig};
