//! Moving between tensors and primitives, and between dtypes: the one place the ops' casts
//! are defined.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};

use crate::kernels::Kernels;

/// A float primitive as a tensor.
pub(crate) fn float<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// A float tensor's primitive.
pub(crate) fn prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// Casts `x` to `dtype`, doing nothing when it already has that dtype (Burn's cast).
pub fn cast<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if x.dtype() == dtype {
        x
    } else {
        x.cast(dtype)
    }
}

/// A primitive in `dtype` (the identity when it already has it), through
/// [`Kernels::float_convert`]: the CPU backend converts directly, without the f64 copy of
/// every value its own cast makes. The fused ops take the f32 master weights and cast them
/// here, inside the op, so autodiff keeps no half copy of them: backward casts them again.
pub(crate) fn cast_prim<B: Kernels>(t: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    if t.dtype() == dtype {
        t
    } else {
        B::float_convert(t, dtype)
    }
}

/// [`cast_prim`] on a tensor.
pub(crate) fn convert<B: Kernels, const D: usize>(x: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    float(cast_prim::<B>(prim(x), dtype))
}
