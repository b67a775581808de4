//! Memory: measured ([`probe`] over [`heap`] or [`cube`], drawn as a [`timeline`]), predicted ([`estimate`], against its [`floor`]), diagnosed when it runs out
//! ([`diagnosis`], [`catch`]) and given back ([`free_cache`]).
//!
//! One [`MemoryProbe`] per run is sampled at the phase boundaries of every micro-batch (after
//! forward, after backward) and optimizer step, and at every layer boundary of both passes.
//!
//! CubeCL reports current usage only and Burn keeps no peak, so its peak is the largest sample.
//! On the CPU, [`heap::CountingAllocator`] (installed by the `trainer` binary) sees every
//! allocation, so its peak is exact, not sampled.

pub mod catch;
pub mod cube;
pub mod diagnosis;
pub mod estimate;
pub mod floor;
pub mod free_cache;
pub mod heap;
pub mod host;
pub mod probe;
pub mod timeline;

use serde::{Deserialize, Serialize};

/// Where in a training step a sample is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A window (optimizer step) begins: peaks restart here, so evaluation is not counted.
    WindowStart,
    /// After a micro-batch's forward pass: the saved activations are all alive.
    AfterForward,
    /// After its backward pass: activations freed, gradients alive.
    AfterBackward,
    /// After the optimizer step (or the skip).
    AfterStep,
    /// An evaluation begins: until [`Phase::EvalEnd`], samples go to the evaluation's own
    /// peak, not the training figures.
    EvalStart,
    /// The evaluation ended.
    EvalEnd,
}

/// What measured a run's memory: `memory_probe` in reports, spelt as serde writes it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// The CPU's counting allocator: exact peaks, nothing reserved.
    Heap,
    /// CubeCL's memory usage on a CUDA device.
    Cuda,
    /// CubeCL's memory usage on a wgpu adapter.
    Wgpu,
    /// Nothing was measured.
    #[default]
    None,
}

impl ProbeKind {
    /// The spelling in reports: `heap`, `cuda`, `wgpu` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Heap => "heap",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
            Self::None => "none",
        }
    }
}

/// What a probe measured over a run, in bytes. `--summary-json` carries these keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Which probe measured the figures below.
    pub memory_probe: ProbeKind,
    /// Peak bytes in use during training steps: exact on the heap, the largest sample on
    /// CubeCL.
    pub peak_bytes: Option<u64>,
    /// How `peak_bytes` was obtained.
    #[serde(default)]
    pub peak_method: Option<String>,
    /// Peak bytes the allocator held from the device (CubeCL's reserved pools).
    pub reserved_peak_bytes: Option<u64>,
    /// Bytes the allocator still held after the last optimizer step (after `free_cache`'s
    /// cleanup, when it runs per step).
    pub reserved_after_step_bytes: Option<u64>,
    /// CUDA: the most device memory in use at a sample, device-wide (total − free from the
    /// driver, as nvidia-smi counts: the context and other processes included).
    pub device_used_peak_bytes: Option<u64>,
    /// Bytes in use before the model was built: the data set and the batcher on the CPU
    /// heap, nothing on a GPU (the data stays on the host).
    #[serde(default)]
    pub resident_bytes: Option<u64>,
    /// `peak_bytes` above `resident_bytes`: what training itself added (parameters,
    /// gradients, optimizer state, activations), the figure a GPU's peak in use compares with.
    #[serde(default)]
    pub training_peak_bytes: Option<u64>,
    /// Largest live bytes seen right after a forward pass.
    pub live_after_forward_bytes: Option<u64>,
    /// Largest live bytes seen right after a backward pass.
    pub live_after_backward_bytes: Option<u64>,
    /// Largest live bytes seen right after an optimizer step.
    pub live_after_step_bytes: Option<u64>,
    /// Peak bytes in use during an evaluation (the largest over the run's evaluations): exact
    /// on the heap, the largest layer-boundary sample on CubeCL.
    #[serde(default)]
    pub eval_peak_bytes: Option<u64>,
    /// What an evaluation added above what was in use when it began (the largest): the cost
    /// of evaluating, which `[mistakes] eval_with_autograd` raises.
    #[serde(default)]
    pub eval_added_bytes: Option<u64>,
}

/// A source of memory figures for one device.
pub trait MemoryProbe {
    /// Records the state at `phase` (a CUDA probe syncs the device first).
    fn sample(&mut self, phase: Phase);
    /// Records what is in use before the model exists: the training peak is counted above it.
    fn resident(&mut self) {}
    /// Everything measured so far.
    fn report(&self) -> MemoryReport;
    /// The reading taken at the last [`Phase::AfterStep`], for the per-step log.
    fn last_step(&self) -> Option<probe::Reading> {
        None
    }
    /// The samples of the window that peaked, where the probe keeps them.
    fn timeline(&self) -> Option<timeline::Timeline> {
        None
    }
    /// What the run's [`RunContext`](oomlab_engine::RunContext) calls at every layer boundary, for
    /// probes that sample there.
    fn listener(&self) -> Option<oomlab_engine::Listener> {
        None
    }
}

/// Per-phase maxima, shared by the probes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PhaseMax {
    pub forward: u64,
    pub backward: u64,
    pub step: u64,
}

impl PhaseMax {
    pub(crate) fn record(&mut self, phase: Phase, live: u64) {
        let slot = match phase {
            Phase::AfterForward => &mut self.forward,
            Phase::AfterBackward => &mut self.backward,
            Phase::AfterStep => &mut self.step,
            Phase::WindowStart | Phase::EvalStart | Phase::EvalEnd => return,
        };
        *slot = (*slot).max(live);
    }
}

/// A probe that measures nothing (library tests, or a heap probe whose allocator is absent).
#[derive(Debug, Default)]
pub struct NullProbe;

impl MemoryProbe for NullProbe {
    fn sample(&mut self, _: Phase) {}
    fn report(&self) -> MemoryReport {
        MemoryReport {
            memory_probe: ProbeKind::None,
            ..Default::default()
        }
    }
}

/// `1.5 GiB`, `12.0 MiB`, `512 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}
