//! The optimizer a config names: Adam or SGD with momentum, with PyTorch's defaults where
//! Burn's differ (Adam ε = 1e-8, SGD dampening 0).

use burn::module::{AutodiffModule, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer, Sgd, SgdConfig};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

use crate::config::{OptimizerName, TrainSpec};

/// Checkpoints' records: named MessagePack in memory, the format `NamedMpkFileRecorder` writes
/// to files (so older checkpoints load), written and read by std.
type BytesRecorder = NamedMpkBytesRecorder<FullPrecisionSettings>;

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

    /// The optimizer state (moments, momentum buffers) as `optim.mpk` holds it.
    pub fn to_bytes(&self) -> anyhow::Result<Vec<u8>> {
        let recorder = BytesRecorder::new();
        match self {
            Self::Adam(o) => Recorder::<B>::record(&recorder, o.to_record(), ()),
            Self::Sgd(o) => Recorder::<B>::record(&recorder, o.to_record(), ()),
        }
        .map_err(|e| anyhow::anyhow!("encoding the optimizer state: {e}"))
    }

    /// Reads the state [`to_bytes`](Self::to_bytes) wrote; the bytes have passed
    /// [`record_fit::fit_optim`](super::record_fit::fit_optim).
    pub fn from_bytes(self, bytes: Vec<u8>, device: &B::Device) -> Result<Self, String> {
        let recorder = BytesRecorder::new();
        Ok(match self {
            Self::Adam(o) => Self::Adam(o.load_record(
                Recorder::<B>::load(&recorder, bytes, device).map_err(|e| e.to_string())?,
            )),
            Self::Sgd(o) => Self::Sgd(o.load_record(
                Recorder::<B>::load(&recorder, bytes, device).map_err(|e| e.to_string())?,
            )),
        })
    }
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Optim<M, B> {
    /// A copy of the state with each parameter's entry under the id `rekey` gives it; an
    /// entry it gives none is left out. The tensors are shared, not copied.
    pub fn rekeyed(&self, rekey: impl Fn(ParamId) -> Option<ParamId>) -> Self {
        macro_rules! rekey {
            ($o:expr) => {{
                let record = ($o.to_record().into_iter())
                    .filter_map(|(id, state)| rekey(id).map(|id| (id, state)))
                    .collect();
                $o.clone().load_record(record)
            }};
        }
        match self {
            Self::Adam(o) => Self::Adam(rekey!(o)),
            Self::Sgd(o) => Self::Sgd(rekey!(o)),
        }
    }

    /// Bytes of the tensors the state holds (moments, momentum buffers), counted in its
    /// record; 0 when it cannot be encoded.
    pub fn state_bytes(&self) -> u64 {
        let record = self.to_bytes().ok();
        let node = record.and_then(|bytes| super::record_fit::Node::parse(&bytes).ok());
        node.map_or(0, |node| node.tensor_bytes() as u64)
    }

    /// Adds `other`'s entries (another peer's parameters) to this state.
    pub fn merge(&mut self, other: Self) {
        match (self, other) {
            (Self::Adam(o), Self::Adam(other)) => {
                let mut record = o.to_record();
                record.extend(other.to_record());
                *o = o.clone().load_record(record);
            }
            (Self::Sgd(o), Self::Sgd(other)) => {
                let mut record = o.to_record();
                record.extend(other.to_record());
                *o = o.clone().load_record(record);
            }
            // One config makes every peer's optimizer: the kinds are the same.
            _ => {}
        }
    }
}

/// The state the optimizer `train` names keeps for one parameter of shape `[1]`, as its record
/// stores it: taken from one real step, so it follows Burn's format and the config (SGD keeps
/// no buffer without momentum).
pub fn state_template<B: AutodiffBackend>(
    train: &TrainSpec,
    device: &B::Device,
) -> anyhow::Result<Vec<u8>> {
    let param = Param::from_tensor(Tensor::<B, 1>::zeros([1], device));
    let mut grads = GradientsParams::new();
    grads.register(param.id, Tensor::<B::InnerBackend, 1>::ones([1], device));
    let mut optim = Optim::<Param<Tensor<B, 1>>, B>::new(train);
    let _ = optim.step(1e-3, param, grads);
    optim.to_bytes()
}
