//! The backends the models run on: any Burn backend that can run oomlab's own autodiff ops,
//! [batch norm](crate::batch_norm) and [layer boundaries](crate::boundary).
//!
//! Plain backends (Flex, CUDA, wgpu) get the composed defaults; [`Autodiff`] overrides both
//! with single graph ops whose backward is written out.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::DType;

use crate::batch_norm::{self, BatchNormOutput};
use crate::boundary::{self, Boundary};

/// A backend for [`SimpleModel`](crate::SimpleModel) and [`MobileNet`](crate::MobileNet).
pub trait ModelBackend: Backend {
    /// Training-mode batch norm over a `[batch, channels, h, w]` input, with `gamma` and `beta`
    /// of shape `[channels]`, computed in `work`.
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> BatchNormOutput<Self> {
        batch_norm::batch_norm_plain::<Self>(x, gamma, beta, work, epsilon)
    }

    /// `x` unchanged. Under autodiff, the [boundary listener](crate::boundary::listen) hears
    /// the forward pass cross `at` and, later, the backward pass; a plain backend (inference)
    /// has no backward to pair with and reports nothing.
    fn boundary(x: FloatTensor<Self>, _at: Boundary) -> FloatTensor<Self> {
        x
    }
}

impl ModelBackend for burn::backend::Flex {}
impl ModelBackend for burn::backend::Cuda {}
impl ModelBackend for burn::backend::Wgpu {}

impl<B: ModelBackend, C: CheckpointStrategy> ModelBackend for Autodiff<B, C> {
    fn batch_norm_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        work: DType,
        epsilon: f64,
    ) -> BatchNormOutput<Self> {
        batch_norm::batch_norm_autodiff::<B, C>(x, gamma, beta, work, epsilon)
    }

    fn boundary(x: FloatTensor<Self>, at: Boundary) -> FloatTensor<Self> {
        boundary::boundary_autodiff::<B, C>(x, at)
    }
}
