//! Operations over all of a model's gradients at once: scaling and the global L2 norm.
//!
//! `GradientsParams` is keyed by parameter id; a [`ModuleVisitor`] over the model finds the ids
//! (and their ranks), as Burn's own gradient accumulator does.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::{AutodiffBackend, BackendTypes};
use burn::tensor::DType;

/// Multiplies every gradient of `model` in `grads` by `factor`, in f32.
pub fn scale<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: GradientsParams,
    factor: f64,
) -> GradientsParams {
    struct Scale {
        grads: GradientsParams,
        factor: f64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                // Half gradients (pure f16) are scaled in f32 and rounded once: multiplying
                // in f16 by 1/65536 flushes small values a second time.
                let dtype = g.dtype();
                let g = match dtype {
                    DType::F32 => g.mul_scalar(self.factor),
                    _ => g.cast(DType::F32).mul_scalar(self.factor).cast(dtype),
                };
                self.grads.register(param.id, g);
            }
        }
    }
    if factor == 1.0 {
        return grads;
    }
    let mut visitor = Scale { grads, factor };
    model.visit(&mut visitor);
    visitor.grads
}

/// Whether every float parameter of `model` is finite.
pub fn all_finite<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> bool {
    struct MaxAbs<B: Backend>(Vec<Tensor<B, 1>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for MaxAbs<B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val().inner();
            // The largest magnitude is inf/NaN exactly when some element is.
            self.0.push(
                oomlab_engine::cast(t, DType::F32)
                    .abs()
                    .flatten::<1>(0, D - 1)
                    .max(),
            );
        }
    }
    let mut visitor = MaxAbs::<B::InnerBackend>(Vec::new());
    model.visit(&mut visitor);
    if visitor.0.is_empty() {
        return true;
    }
    let largest: f64 = Tensor::cat(visitor.0, 0).sum().into_scalar().elem();
    largest.is_finite()
}

/// The L2 norm over all gradients, computed in f32 and read back once. It is not finite
/// exactly when some gradient holds an inf or NaN (or its squares overflow f32, which only
/// gradients beyond 1.8e19 can do).
pub fn global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> f64 {
    sum_squares(model, grads).0.sqrt()
}

/// The sum of the squares of every gradient of `model` in `grads`, computed in f32, and the
/// device they are on (`None` when there are none).
pub fn sum_squares<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> (f64, Option<<B::InnerBackend as BackendTypes>::Device>) {
    struct SumSquares<'a, B: Backend> {
        grads: &'a GradientsParams,
        parts: Vec<Tensor<B, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for SumSquares<'_, B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                self.parts.push(g.cast(DType::F32).square().sum());
            }
        }
    }
    let mut visitor = SumSquares::<B::InnerBackend> {
        grads,
        parts: Vec::new(),
    };
    model.visit(&mut visitor);
    let Some(device) = visitor.parts.first().map(Tensor::device) else {
        return (0.0, None);
    };
    let total: f64 = Tensor::cat(visitor.parts, 0).sum().into_scalar().elem();
    (total, Some(device))
}
