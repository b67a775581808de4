//! `[memory]`: freeing cached memory, activation checkpointing, fused blocks and a memory
//! budget.

use serde::{Deserialize, Serialize};

use super::{out_of_range, ConfigError};

/// When the allocator is asked to give its cached blocks back to the device: Burn's
/// `memory_cleanup`, the analogue of `torch.cuda.empty_cache()`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FreeCache {
    /// Keep the cache: the fastest, and what every framework does by default.
    #[default]
    Never,
    /// After every optimizer step.
    Step,
    /// After every epoch (before evaluation).
    Epoch,
}

/// Which activations autodiff keeps for backward.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    /// Keep every activation a backward op needs.
    #[default]
    None,
    /// burn-autodiff's balanced strategy: outputs of memory-bound ops (ReLU, element-wise
    /// arithmetic) are recomputed in backward from a kept input instead of being kept.
    Balanced,
    /// Whole-block recompute (`torch.utils.checkpoint`): each transformer block keeps only its
    /// input and runs again in backward.
    Blocks,
}

/// Whether conv → BN → ReLU (MobileNet) and conv → ReLU → max-pool (SimpleModel) run as
/// single ops that keep less for backward.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fuse {
    /// Every layer its own op: what the book's comparisons of the other fixes use.
    #[default]
    None,
    /// The blocks as single ops (same function, same gradients, less memory).
    Blocks,
}

impl Fuse {
    /// The TOML spelling, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Blocks => "blocks",
        }
    }
}

impl FreeCache {
    /// The TOML spelling, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Step => "step",
            Self::Epoch => "epoch",
        }
    }
}

impl Checkpointing {
    /// The TOML spelling, for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Balanced => "balanced",
            Self::Blocks => "blocks",
        }
    }
}

/// `[memory]` as written.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawMemory {
    pub free_cache: FreeCache,
    pub checkpointing: Checkpointing,
    pub fuse: Fuse,
    /// e.g. `"6GiB"`, or a number of bytes.
    pub budget: Option<RawSize>,
}

/// A size as written: `"6GiB"` or a plain number of bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RawSize {
    /// Bytes.
    Bytes(u64),
    /// With a unit, e.g. `"512MiB"`.
    Text(String),
}

/// `[memory]`, validated.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemorySpec {
    pub free_cache: FreeCache,
    pub checkpointing: Checkpointing,
    pub fuse: Fuse,
    /// Bytes the run may use at its peak; checked against the estimate before training.
    pub budget: Option<u64>,
}

pub(super) fn validate(m: &RawMemory) -> Result<MemorySpec, ConfigError> {
    let budget = match &m.budget {
        None => None,
        Some(RawSize::Bytes(0)) => return Err(out_of_range("memory.budget", 0, SIZE_HELP)),
        Some(RawSize::Bytes(b)) => Some(*b),
        Some(RawSize::Text(text)) => Some(
            parse_size(text)
                .ok_or_else(|| out_of_range("memory.budget", format!("{text:?}"), SIZE_HELP))?,
        ),
    };
    Ok(MemorySpec {
        free_cache: m.free_cache,
        checkpointing: m.checkpointing,
        fuse: m.fuse,
        budget,
    })
}

/// What [`parse_size`] accepts, for error messages.
pub const SIZE_HELP: &str =
    "expected a positive size such as \"6GiB\", \"512MiB\", \"1.5GB\" or \"800000000\" (bytes)";

/// `"6GiB"`, `"512 MiB"`, `"1.5GB"`, `"4096"` (bytes) → bytes. Binary (KiB, MiB, GiB, TiB) and
/// decimal (KB, MB, GB, TB) units; `None` for anything else or a size of zero.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    let bytes = (number * scale).round();
    (bytes >= 1.0 && bytes.is_finite()).then_some(bytes as u64)
}
