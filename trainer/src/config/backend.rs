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

/// How hard CubeCL searches for the fastest kernel of each shape before using it: the
/// counterpart of `torch.backends.cudnn.benchmark` (CubeCL's levels; it cannot be switched
/// off). Nothing on the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Autotune {
    /// The fewest candidates.
    Minimal,
    /// CubeCL's default.
    Balanced,
    /// More candidates.
    Extensive,
    /// Every candidate.
    Full,
}

impl Autotune {
    /// The spelling in TOML and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Minimal => "minimal",
            Self::Balanced => "balanced",
            Self::Extensive => "extensive",
            Self::Full => "full",
        }
    }
}

/// Where CubeCL keeps the kernels its search chose, so that later runs skip the search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutotuneCache {
    /// CubeCL's own place: `target/autotune` inside a Cargo project, else the user's cache
    /// folder. Shared by every run there.
    Shared,
    /// A new, empty folder for this run only (removed when it ends): every run searches from
    /// scratch, as a first run anywhere does.
    Fresh,
}

/// `[backend]`
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawBackend {
    pub kind: BackendKind,
    pub cuda_index: usize,
    /// Unset: CubeCL's own choice (its config file, `CUBECL_AUTOTUNE_LEVEL`, else balanced).
    pub autotune: Option<Autotune>,
    /// Unset: `shared`.
    pub autotune_cache: Option<AutotuneCache>,
}
