//! The precision policy: which dtype each kind of layer computes in.
//!
//! Parameters are always stored in f32 (master weights). A policy says which dtype a layer's
//! inputs and weights are cast to before it runs; the cast is the identity when the dtypes
//! already match, so the f32 policy adds no work.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{backend::Backend, DType, Tensor};

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

/// The four training precisions a config can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrecisionMode {
    /// Everything in f32.
    F32,
    /// f32 master weights; layers compute and save activations in f16.
    F16Mixed,
    /// f32 master weights; layers compute and save activations in bf16.
    Bf16Mixed,
    /// Parameters, gradients and optimizer state in f16, no master weights (teaching mode).
    F16,
}

impl PrecisionMode {
    /// Every mode, in the order configs list them.
    pub const ALL: [Self; 4] = [Self::F32, Self::F16Mixed, Self::Bf16Mixed, Self::F16];

    /// The name configs use: `f32`, `f16-mixed`, `bf16-mixed`, `f16`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16Mixed => "f16-mixed",
            Self::Bf16Mixed => "bf16-mixed",
            Self::F16 => "f16",
        }
    }

    /// The mode called `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The half type layers compute in, or `None` for f32.
    pub fn half(self) -> Option<DType> {
        match self {
            Self::F32 => None,
            Self::F16Mixed | Self::F16 => Some(DType::F16),
            Self::Bf16Mixed => Some(DType::BF16),
        }
    }

    /// Whether f32 master weights are kept (every mode but pure f16).
    pub fn master_weights(self) -> bool {
        self != Self::F16
    }

    /// dtype the parameters (and so gradients and optimizer state) are stored in.
    pub fn parameter_dtype(self) -> DType {
        match self {
            Self::F16 => DType::F16,
            _ => DType::F32,
        }
    }

    /// The layer policy: compute in the half type, batch norm in f32 when `batch_norm_f32`
    /// (else in the half type), and the loss always in f32: softmax in f16 overflows for
    /// reasons unrelated to what any mode teaches.
    pub fn policy(self, batch_norm_f32: bool) -> Precision {
        let compute = self.half().unwrap_or(DType::F32);
        Precision {
            compute,
            batch_norm: if batch_norm_f32 { DType::F32 } else { compute },
            output: DType::F32,
        }
    }
}

/// Casts every float parameter and buffer of `module` to `dtype`, keeping parameter ids and
/// whether each requires a gradient. Used by the pure-f16 mode, which has no master weights.
pub fn cast_params<B: Backend, M: Module<B>>(module: M, dtype: DType) -> M {
    struct Caster(DType);
    impl<B: Backend> ModuleMapper<B> for Caster {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let dtype = self.0;
            param.map(|t| {
                let grad = t.is_require_grad();
                cast(t, dtype).detach().set_require_grad(grad)
            })
        }
    }
    module.map(&mut Caster(dtype))
}

impl Default for Precision {
    fn default() -> Self {
        Self::F32
    }
}

/// Casts `x` to `dtype`, doing nothing when it already has that dtype.
pub fn cast<B: Backend, const D: usize>(x: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if x.dtype() == dtype {
        x
    } else {
        x.cast(dtype)
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
