//! The network a config names, as one type the training loop can hold.

use std::sync::Mutex;

use burn::module::{ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::DType;
use burn_models::{MobileNet, MobileNetError, ResNet, ResNetError, SimpleModel};
use oomlab_engine::{cast, ModelBackend, RunContext};

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
    /// ResNet.
    ResNet(ResNet<B>),
}

/// A model config `init` refuses (the config layer checks the same bounds first).
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A MobileNet config out of bounds.
    #[error(transparent)]
    MobileNet(#[from] MobileNetError),
    /// A ResNet config out of bounds.
    #[error(transparent)]
    ResNet(#[from] ResNetError),
}

impl<B: Backend> Classifier<B> {
    /// Builds the model `spec` names on `device`, every weight drawn from `seed` now. Burn's
    /// random state is the backend's, one per process, and its parameters draw at first use:
    /// another run in this process seeding or drawing between this seed and this model's first
    /// forward would change its weights. The seed and every draw happen here, under one lock
    /// (code that draws from Burn's state without it can still interleave).
    pub fn init(spec: &ModelSpec, seed: u64, device: &B::Device) -> Result<Self, ModelError> {
        static SEEDING: Mutex<()> = Mutex::new(());
        let _turn = SEEDING.lock().unwrap_or_else(|e| e.into_inner());
        B::seed(device, seed);
        let model = match spec {
            ModelSpec::Simple(c) => Self::Simple(c.init(device)),
            ModelSpec::MobileNet(c) => Self::MobileNet(c.init(device)?),
            ModelSpec::ResNet(c) => Self::ResNet(c.init(device)?),
        };
        model.visit(&mut Draw);
        Ok(model)
    }

    /// Whether the network has batch norms (so whether their dtype matters).
    pub fn has_batch_norm(&self) -> bool {
        matches!(self, Self::MobileNet(_) | Self::ResNet(_))
    }

    /// Trainable parameters (batch-norm running statistics excluded).
    pub fn trainable_params(&self) -> usize {
        match self {
            Self::Simple(m) => m.trainable_params(),
            Self::MobileNet(m) => m.trainable_params(),
            Self::ResNet(m) => m.trainable_params(),
        }
    }
}

impl<B: ModelBackend> Classifier<B> {
    /// The feature maps before the classifier head, in the policy's compute dtype.
    pub fn features(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 4> {
        match self {
            Self::Simple(m) => m.features(images, cx),
            Self::MobileNet(m) => m.features(images, cx),
            Self::ResNet(m) => m.features(images, cx),
        }
    }

    /// Logits, `[batch, classes]`, in the policy's output dtype.
    pub fn forward(&self, images: Tensor<B, 4>, cx: &RunContext) -> Tensor<B, 2> {
        match self {
            Self::Simple(m) => m.forward(images, cx),
            Self::MobileNet(m) => m.forward(images, cx),
            Self::ResNet(m) => m.forward(images, cx),
        }
    }
}

/// Initialises each parameter it visits (a lazy one draws its values at its first `val`).
struct Draw;

impl<B: Backend> ModuleVisitor<B> for Draw {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
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
