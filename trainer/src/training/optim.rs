//! The optimizer a config names: Adam or SGD with momentum, with PyTorch's defaults where
//! Burn's differ (Adam ε = 1e-8, SGD dampening 0).

use std::path::Path;

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer, Sgd, SgdConfig};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;

use crate::config::{OptimizerName, TrainSpec};

type FileRecorder = NamedMpkFileRecorder<FullPrecisionSettings>;

/// Adam or SGD, over module type `M`.
#[derive(Clone)]
pub enum Optim<M: AutodiffModule<B>, B: AutodiffBackend> {
    /// Adam.
    Adam(OptimizerAdaptor<Adam, M, B>),
    /// SGD with momentum.
    Sgd(OptimizerAdaptor<Sgd<B::InnerBackend>, M, B>),
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Optim<M, B> {
    /// The optimizer `train` names, with its weight decay.
    pub fn new(train: &TrainSpec) -> Self {
        let decay =
            (train.weight_decay > 0.0).then(|| WeightDecayConfig::new(train.weight_decay as f32));
        match train.optimizer {
            OptimizerName::Adam => Self::Adam(
                AdamConfig::new()
                    .with_epsilon(1e-8)
                    .with_weight_decay(decay)
                    .init(),
            ),
            OptimizerName::Sgd => {
                let momentum = (train.momentum > 0.0).then_some(MomentumConfig {
                    momentum: train.momentum,
                    dampening: 0.0,
                    nesterov: false,
                });
                Self::Sgd(
                    SgdConfig::new()
                        .with_momentum(momentum)
                        .with_weight_decay(decay)
                        .init(),
                )
            }
        }
    }

    /// One update of `model` with `grads` at learning rate `lr`.
    pub fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> M {
        match self {
            Self::Adam(o) => o.step(lr, model, grads),
            Self::Sgd(o) => o.step(lr, model, grads),
        }
    }

    /// Writes the optimizer state (moments, momentum buffers) to `path` (`.mpk` is appended).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let recorder = FileRecorder::new();
        match self {
            Self::Adam(o) => recorder.record(o.to_record(), path.into()),
            Self::Sgd(o) => recorder.record(o.to_record(), path.into()),
        }
        .with_context(|| format!("writing optimizer state {}.mpk", path.display()))
    }

    /// Reads the state [`save`](Self::save) wrote.
    pub fn load(self, path: &Path, device: &B::Device) -> anyhow::Result<Self> {
        let recorder = FileRecorder::new();
        let context = || format!("reading optimizer state {}.mpk", path.display());
        Ok(match self {
            Self::Adam(o) => {
                Self::Adam(o.load_record(recorder.load(path.into(), device).with_context(context)?))
            }
            Self::Sgd(o) => {
                Self::Sgd(o.load_record(recorder.load(path.into(), device).with_context(context)?))
            }
        })
    }
}
