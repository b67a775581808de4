//! The precision policy: which dtype each kind of layer computes in.
//!
//! A policy says which dtype a layer's inputs and weights are cast to before it runs, whatever
//! dtype the parameters are stored in (f32 master weights under mixed precision, f16 in the
//! trainer's pure-f16 teaching mode). The cast is the identity when the dtypes already match,
//! so the f32 policy adds no work. Which *training* precisions exist, and how parameters are
//! stored, is the trainer's business: models only apply the policy.

use burn::tensor::{backend::Backend, DType, Tensor};

use crate::cast::cast;

/// Where each layer family computes. Passed to every model's `forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Precision {
    /// dtype of convolutions, linear layers, pooling and activations.
    pub compute: DType,
    /// dtype in which batch norm computes its statistics and normalisation.
    pub batch_norm: DType,
    /// dtype of the logits handed to the loss.
    pub output: DType,
}

impl Precision {
    /// Everything in f32: the reference policy.
    pub const F32: Self = Self {
        compute: DType::F32,
        batch_norm: DType::F32,
        output: DType::F32,
    };

    /// Layers compute in `half`; batch norm in f32 when `batch_norm_f32` (else in `half`);
    /// the logits go to the loss in f32, since softmax in a half type overflows.
    pub fn mixed(half: DType, batch_norm_f32: bool) -> Self {
        Self {
            compute: half,
            batch_norm: if batch_norm_f32 { DType::F32 } else { half },
            output: DType::F32,
        }
    }

    /// Casts `x` to the compute dtype (identity when it already has it).
    pub fn compute<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast(x, self.compute)
    }

    /// Casts `x` to the batch-norm dtype.
    pub fn batch_norm<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast(x, self.batch_norm)
    }

    /// Casts logits to the output dtype the loss runs in.
    pub fn output<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        cast(x, self.output)
    }
}

impl Default for Precision {
    fn default() -> Self {
        Self::F32
    }
}

/// `f32`, `f16`, `bf16` or `f64`: the names configs and reports use.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        _ => "f32",
    }
}
