//! Models for oomlab: the seed article's [`SimpleModel`], a MobileNetV1 ([`MobileNet`]),
//! ResNet-18/34/50 ([`ResNet`]) and a GPT-2-style language model ([`Gpt`]).
//!
//! The only place a network is defined. Each is generic over a backend the engine runs
//! ([`ModelBackend`]) and takes the run's [`RunContext`] in `forward`: its precision policy
//! decides every dtype, the layers only apply it. The memory-lean ops, their kernels and all
//! `unsafe` live below this crate (`oomlab-engine`, `flex-kernels`).
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod gpt;
pub mod layers;
pub mod mobilenet;
pub mod resnet;
pub mod simple;

pub use gpt::{Attention, Gpt, GptConfig, GptError};
pub use mobilenet::{MobileNet, MobileNetConfig, MobileNetError};
pub use oomlab_engine::{ModelBackend, Precision, RunContext};
pub use resnet::{
    Architecture, BlockKind, BlockSpec, ResNet, ResNetConfig, ResNetError, Stage, Stem,
};
pub use simple::{SimpleModel, SimpleModelConfig};
