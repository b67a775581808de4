//! `[backend]`: which device runs the job.

use serde::{Deserialize, Serialize};

/// Which device runs the job.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA when a device initialises, else a wgpu GPU adapter (never a CPU one), else the
    /// CPU.
    #[default]
    Auto,
    /// NVIDIA GPU through burn-cuda; an error when none is usable.
    Cuda,
    /// Any other GPU through burn-wgpu (Vulkan; Metal on macOS); CPU adapters such as
    /// llvmpipe included. An error when none is usable.
    Wgpu,
    /// The CPU through Burn's Flex backend.
    Cpu,
}

impl BackendKind {
    /// The spelling of `backend.kind` and `--backend`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
            Self::Cpu => "cpu",
        }
    }
}

/// `[backend]`
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawBackend {
    pub kind: BackendKind,
    pub cuda_index: usize,
}
