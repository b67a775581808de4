//! Fast CPU kernels on Flex (Burn's CPU backend) tensors for oomlab's memory-lean ops: direct
//! depthwise, pointwise and dense convs on channels-last activations, batch norm + ReLU in
//! f32 over half activations, SimpleModel's conv → ReLU → max-pool, half-precision linear
//! layers, conversions without f64 staging.
//!
//! Kernels know no models and no autodiff: each function takes and returns `FlexTensor`s, and
//! returns `None` (or its input back) for operands it does not handle, so that the caller can
//! take Flex's own op. All of oomlab's `unsafe` lives here, each block with its safety
//! argument, and every gemm call goes through one checked wrapper (`gemm.rs`).
#![warn(missing_docs)]

mod bias;
mod bn_half;
mod bn_relu;
mod channels_last;
mod conv;
mod conv_pool;
mod convert;
mod dense;
mod depthwise;
mod gemm;
mod half_slices;
mod linear_half;
mod matmul;
mod max_pool;
mod pool_grad;
mod relu;
mod relu_pool;
mod rows;
mod values;

pub use bias::{add_bias, bias_grad};
pub use bn_half::{
    batch_norm_backward_half, batch_norm_forward_half, batch_norm_inference_half,
    batch_norm_recompute_half,
};
pub use bn_relu::{
    batch_norm_backward, batch_norm_forward, batch_norm_inference, bn_relu_backward,
    bn_relu_forward,
};
pub use channels_last::{channels_first, channels_last};
pub use conv::{pointwise_conv, pointwise_weight_backward, pointwise_x_backward};
pub use conv_pool::{conv_bias_first, conv_relu_pool_forward};
pub use convert::{convert, in_f32};
pub use dense::{dense_conv, dense_conv_first, dense_weight_backward, dense_x_backward};
pub use depthwise::{depthwise_conv, depthwise_weight_backward, depthwise_x_backward};
pub use linear_half::{linear_forward_half, linear_input_grad_half};
pub use matmul::add_matmul;
pub use max_pool::{max_pool_backward_first, max_pool_first};
pub use pool_grad::conv_relu_pool_param_grads;
pub use relu::{relu, relu_backward};
pub use relu_pool::relu_max_pool;
pub use rows::write_rows;
