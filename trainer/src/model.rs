//! The network a config names, as one type the training loop can hold.

use std::sync::Mutex;

use burn::module::{ModuleMapper, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::DType;
use burn_models::{Gpt, GptError, MobileNet, MobileNetError, ResNet, ResNetError, SimpleModel};
use oomlab_engine::{cast, ModelBackend, RunContext};

use crate::config::ModelSpec;
use crate::data::Batch;

/// The model a config names; `predict` dispatches to it.
// One model is held per run; boxing a variant would hide it from the Module derive.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Network<B: Backend> {
    /// The seed article's SimpleModel.
    Simple(SimpleModel<B>),
    /// MobileNetV1.
    MobileNet(MobileNet<B>),
    /// ResNet.
    ResNet(ResNet<B>),
    /// A GPT-2-style language model.
    Gpt(Gpt<B>),
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
    /// A GPT config out of bounds.
    #[error(transparent)]
    Gpt(#[from] GptError),
}

impl<B: Backend> Network<B> {
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
            ModelSpec::Gpt(c) => Self::Gpt(c.init(device)?),
        };
        model.visit(&mut Draw);
        Ok(model)
    }

    /// Whether the network has batch norms (so whether their dtype matters).
    pub fn has_batch_norm(&self) -> bool {
        // A GPT's LayerNorms run in the same normalisation dtype.
        matches!(self, Self::MobileNet(_) | Self::ResNet(_) | Self::Gpt(_))
    }

    /// Trainable parameters (batch-norm running statistics excluded).
    pub fn trainable_params(&self) -> usize {
        match self {
            Self::Simple(m) => m.trainable_params(),
            Self::MobileNet(m) => m.trainable_params(),
            Self::ResNet(m) => m.trainable_params(),
            Self::Gpt(m) => m.trainable_params(),
        }
    }

    /// Whether it predicts tokens (so evaluation reports perplexity).
    pub fn is_language_model(&self) -> bool {
        matches!(self, Self::Gpt(_))
    }
}

impl<B: ModelBackend> Network<B> {
    /// A CNN's feature maps before the classifier head, in the policy's compute dtype
    /// (`None` for a language model).
    pub fn features(&self, images: Tensor<B, 4>, cx: &RunContext) -> Option<Tensor<B, 4>> {
        match self {
            Self::Simple(m) => Some(m.features(images, cx)),
            Self::MobileNet(m) => Some(m.features(images, cx)),
            Self::ResNet(m) => Some(m.features(images, cx)),
            Self::Gpt(_) => None,
        }
    }

    /// Every prediction of `batch` with its target: `([predictions, classes], [predictions])`,
    /// the logits in the policy's output dtype. A CNN predicts an image's class; a language
    /// model predicts each next token, so a batch of `n` windows of `seq` tokens makes `n ·
    /// seq` predictions. A batch the model cannot read (images for a language model) is a
    /// bug of the caller, which the config check rules out.
    pub fn predict(&self, batch: Batch<B>, cx: &RunContext) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        match (self, batch) {
            (Self::Gpt(m), Batch::Tokens { inputs, targets }) => {
                let [n, seq] = inputs.dims();
                let logits = m.forward(inputs, cx);
                let vocab = logits.dims()[2];
                (logits.reshape([n * seq, vocab]), targets.reshape([n * seq]))
            }
            (Self::Simple(m), Batch::Images { images, labels }) => (m.forward(images, cx), labels),
            (Self::MobileNet(m), Batch::Images { images, labels }) => {
                (m.forward(images, cx), labels)
            }
            (Self::ResNet(m), Batch::Images { images, labels }) => (m.forward(images, cx), labels),
            _ => panic!("a batch of the wrong kind for this model (the config check allows none)"),
        }
    }
}

impl<B> Network<B>
where
    B: AutodiffBackend + ModelBackend,
    B::InnerBackend: ModelBackend,
{
    /// The mean cross-entropy of `batch` (in f32) and the gradients of `scale` times it:
    /// forward, `after_forward`, backward. A GPT with whole-block checkpointing runs its
    /// blocks in stages ([`Gpt::recomputed_grads`](burn_models::Gpt::recomputed_grads)); every
    /// other model is one graph.
    pub fn loss_and_grads(
        &self,
        batch: Batch<B>,
        cx: &RunContext,
        scale: f64,
        after_forward: impl FnOnce(),
    ) -> (Tensor<B, 1>, GradientsParams) {
        let cross_entropy = |logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>| {
            CrossEntropyLossConfig::new()
                .init(&logits.device())
                .forward(logits, targets)
        };
        match (self, batch) {
            (Self::Gpt(m), Batch::Tokens { inputs, targets }) if m.checkpoints_blocks() => {
                let n = targets.dims().iter().product::<usize>();
                let loss = |logits: Tensor<B, 3>| {
                    let vocab = logits.dims()[2];
                    cross_entropy(logits.reshape([n, vocab]), targets.reshape([n]))
                };
                m.recomputed_grads(inputs, cx, scale, loss, after_forward)
            }
            (_, batch) => {
                let (logits, targets) = self.predict(batch, cx);
                let loss = cross_entropy(logits, targets);
                after_forward();
                let grads = loss.clone().mul_scalar(scale).backward();
                (loss, GradientsParams::from_grads(grads, self))
            }
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
