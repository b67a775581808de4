//! The network a config names, as one type the training loop can hold.

use burn::module::{ModuleMapper, Param};
use burn::prelude::*;
use burn::tensor::DType;
use burn_models::{cast, MobileNet, MobileNetError, ModelBackend, Precision, SimpleModel};

use crate::config::ModelSpec;

/// Either model; `forward` dispatches to it.
// One model is held per run; boxing a variant would hide it from the Module derive.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Classifier<B: Backend> {
    /// The seed article's SimpleModel.
    Simple(SimpleModel<B>),
    /// MobileNetV1.
    MobileNet(MobileNet<B>),
}

impl<B: Backend> Classifier<B> {
    /// Builds the model `spec` names on `device`.
    pub fn init(spec: &ModelSpec, device: &B::Device) -> Result<Self, MobileNetError> {
        Ok(match spec {
            ModelSpec::Simple(c) => Self::Simple(c.init(device)),
            ModelSpec::MobileNet(c) => Self::MobileNet(c.init(device)?),
        })
    }

    /// Whether the network has batch norms (so whether their dtype matters).
    pub fn has_batch_norm(&self) -> bool {
        matches!(self, Self::MobileNet(_))
    }

    /// Trainable parameters (batch-norm running statistics excluded).
    pub fn trainable_params(&self) -> usize {
        match self {
            Self::Simple(m) => m.trainable_params(),
            Self::MobileNet(m) => m.trainable_params(),
        }
    }
}

impl<B: ModelBackend> Classifier<B> {
    /// The feature maps before the classifier head, in the policy's compute dtype.
    pub fn features(&self, images: Tensor<B, 4>, p: &Precision) -> Tensor<B, 4> {
        match self {
            Self::Simple(m) => m.features(images, p),
            Self::MobileNet(m) => m.features(images, p),
        }
    }

    /// Logits, `[batch, classes]`, in the policy's output dtype.
    pub fn forward(&self, images: Tensor<B, 4>, p: &Precision) -> Tensor<B, 2> {
        match self {
            Self::Simple(m) => m.forward(images, p),
            Self::MobileNet(m) => m.forward(images, p),
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
