//! Backend choice: one type alias per backend, picked once at start-up.
//!
//! `auto` takes CUDA, then a wgpu *hardware* adapter (discrete, integrated or virtual GPU), then
//! the CPU: it never picks a CPU adapter such as Mesa's llvmpipe, which is a CPU at a GPU API's
//! cost. `wgpu` takes any adapter, llvmpipe included (that is how CI runs the GPU path).

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::cuda::CudaDevice;
use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Cuda, Flex, Wgpu};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Tensor};

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{Autotune, AutotuneCache, BackendKind, DeviceSpec, Settings};
use crate::panics::{self, Captured};

mod cuda;
mod wgpu;

/// Training on the CPU: Burn's Flex backend under autodiff.
pub type CpuBackend = Autodiff<Flex>;
/// Training on an NVIDIA GPU: burn-cuda under autodiff.
pub type CudaBackend = Autodiff<Cuda>;
/// Training on any other GPU: burn-wgpu (Vulkan; Metal on macOS) under autodiff.
pub type WgpuBackend = Autodiff<Wgpu>;
/// [`CpuBackend`] with balanced activation checkpointing (`memory.checkpointing`).
pub type CpuCheckpointed = Autodiff<Flex, BalancedCheckpointing>;
/// [`CudaBackend`] with balanced activation checkpointing.
pub type CudaCheckpointed = Autodiff<Cuda, BalancedCheckpointing>;
/// [`WgpuBackend`] with balanced activation checkpointing.
pub type WgpuCheckpointed = Autodiff<Wgpu, BalancedCheckpointing>;

/// A wgpu adapter a run uses.
#[derive(Debug, Clone)]
pub struct Adapter {
    /// CubeCL's handle for it.
    pub device: WgpuDevice,
    /// The driver's name for it, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// The graphics API: `Vulkan` or `Metal`.
    pub api: String,
}

/// The backend a run uses.
#[derive(Debug, Clone)]
pub enum Selected {
    /// Flex on the CPU.
    Cpu,
    /// CUDA device `index`.
    Cuda(CudaDevice),
    /// A wgpu adapter.
    Wgpu(Adapter),
}

impl Selected {
    /// Name used in reports: `cpu`, `cuda:0`, `wgpu: llvmpipe (…), Vulkan`.
    pub fn name(&self) -> String {
        self.used().to_string()
    }

    /// What reports say this backend is.
    pub fn used(&self) -> BackendUsed {
        match self {
            Self::Cpu => BackendUsed::Cpu,
            Self::Cuda(d) => BackendUsed::Cuda { index: d.index },
            Self::Wgpu(a) => BackendUsed::Wgpu {
                adapter: a.name.clone(),
                api: a.api.clone(),
            },
        }
    }

    /// The `backend.kind` that selects this backend again (e.g. in a child process).
    pub fn kind(&self) -> BackendKind {
        match self {
            Self::Cpu => BackendKind::Cpu,
            Self::Cuda(_) => BackendKind::Cuda,
            Self::Wgpu(_) => BackendKind::Wgpu,
        }
    }

    /// Whether the device can compute in `dtype` (a half type of a precision mode).
    pub fn supports(&self, dtype: DType) -> bool {
        match self {
            Self::Cpu => <Flex as Backend>::supports_dtype(&Default::default(), dtype),
            Self::Cuda(d) => <Cuda as Backend>::supports_dtype(d, dtype),
            Self::Wgpu(a) => <Wgpu as Backend>::supports_dtype(&a.device, dtype),
        }
    }
}

/// The backend a run used, as reports hold it: [`Selected`] without its device handles.
/// summary.json and compare's report spell it `cpu`, `cuda:0` or `wgpu: llvmpipe (…), Vulkan`
/// and read that text back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum BackendUsed {
    /// Flex on the CPU.
    Cpu,
    /// A CUDA device.
    Cuda {
        /// Its index.
        index: usize,
    },
    /// A wgpu adapter.
    Wgpu {
        /// The driver's name for it, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
        adapter: String,
        /// The graphics API: `Vulkan` or `Metal`.
        api: String,
    },
}

impl BackendUsed {
    /// The `backend.kind` that selects this backend again.
    pub fn kind(&self) -> BackendKind {
        match self {
            Self::Cpu => BackendKind::Cpu,
            Self::Cuda { .. } => BackendKind::Cuda,
            Self::Wgpu { .. } => BackendKind::Wgpu,
        }
    }
}

impl std::fmt::Display for BackendUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda { index } => write!(f, "cuda:{index}"),
            Self::Wgpu { adapter, api } => write!(f, "wgpu: {adapter}, {api}"),
        }
    }
}

/// Text that is not a [`BackendUsed`]'s spelling.
#[derive(Debug, thiserror::Error)]
#[error("backend {0:?}: expected \"cpu\", \"cuda:<index>\" or \"wgpu: <adapter>, <api>\"")]
pub struct BadBackend(String);

impl TryFrom<String> for BackendUsed {
    type Error = BadBackend;

    fn try_from(text: String) -> Result<Self, BadBackend> {
        let parsed = if text == "cpu" {
            Some(Self::Cpu)
        } else if let Some(index) = text.strip_prefix("cuda:") {
            index.parse().ok().map(|index| Self::Cuda { index })
        } else {
            // The adapter's name may hold ", " itself (`llvmpipe (LLVM 15.0.6, 256 bits)`); the
            // API's never does.
            text.strip_prefix("wgpu: ")
                .and_then(|rest| rest.rsplit_once(", "))
                .map(|(adapter, api)| Self::Wgpu {
                    adapter: adapter.into(),
                    api: api.into(),
                })
        };
        parsed.ok_or(BadBackend(text))
    }
}

impl From<BackendUsed> for String {
    fn from(used: BackendUsed) -> Self {
        used.to_string()
    }
}

/// The backend a config asks for cannot run on this machine.
#[derive(Debug, thiserror::Error)]
pub enum NoDevice {
    /// `cuda`: no device, driver or NVRTC.
    #[error(
        "backend.kind = \"cuda\": no usable CUDA device {index}: {reason} (use --backend cpu or auto)"
    )]
    Cuda {
        /// The device index asked for.
        index: usize,
        /// What failed.
        reason: String,
    },
    /// `wgpu`: no loader, no adapter, or an adapter that cannot run a kernel.
    #[error("backend.kind = \"wgpu\": {0} (use --backend cpu or auto)")]
    Wgpu(String),
}

/// Mesa's Vulkan drivers try a Wayland connection when wgpu creates its instance, and
/// libwayland prints "XDG_RUNTIME_DIR is invalid or not set" for each try on a headless machine
/// (a server, CI). The trainer draws nothing on screen: point the variable at the temporary
/// folder so the try fails quietly. Call first thing in `main`, before any thread starts.
pub fn headless() {
    if cfg!(target_os = "linux") && std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
}

/// Applies `backend.autotune` and `backend.autotune_cache` to CubeCL's runtime config, over
/// what its config file and environment say. CubeCL reads its config once, when the first
/// device is made: call this before [`select`]. Returns the fresh cache folder to remove when
/// the run ends, if one was made.
pub fn configure_cubecl(settings: &Settings) -> Option<PathBuf> {
    use burn::cubecl::config::autotune::AutotuneLevel;
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

    let fresh = (settings.autotune_cache == AutotuneCache::Fresh)
        .then(|| std::env::temp_dir().join(format!("oomlab-autotune-{}", std::process::id())));
    if settings.autotune.is_none() && fresh.is_none() {
        return None;
    }
    if CubeClRuntimeConfig::storage().lock().is_some() {
        // Already read by an earlier run in this process (a library caller): it stays.
        return None;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    if let Some(level) = settings.autotune {
        config.autotune.level = match level {
            Autotune::Minimal => AutotuneLevel::Minimal,
            Autotune::Balanced => AutotuneLevel::Balanced,
            Autotune::Extensive => AutotuneLevel::Extensive,
            Autotune::Full => AutotuneLevel::Full,
        };
    }
    if let Some(dir) = &fresh {
        config.autotune.cache = CacheConfig::File(dir.clone());
    }
    CubeClRuntimeConfig::set(config);
    fresh
}

/// Resolves `kind`: `auto` takes CUDA when device `index` initialises, else a wgpu hardware
/// adapter, else the CPU, saying so.
pub fn select(kind: BackendKind, index: usize) -> Result<Selected, NoDevice> {
    match kind {
        BackendKind::Cpu => Ok(Selected::Cpu),
        BackendKind::Cuda => cuda::probe(index).map(Selected::Cuda),
        BackendKind::Wgpu => wgpu::pick(true).map(Selected::Wgpu),
        BackendKind::Auto => {
            let cuda = match cuda::probe(index) {
                Ok(device) => return Ok(Selected::Cuda(device)),
                Err(NoDevice::Cuda { reason, .. }) => reason,
                Err(e) => e.to_string(),
            };
            match wgpu::pick(false) {
                Ok(adapter) => {
                    eprintln!(
                        "backend auto: no CUDA device ({cuda}); using {}",
                        adapter.name
                    );
                    Ok(Selected::Wgpu(adapter))
                }
                Err(NoDevice::Wgpu(why)) => {
                    eprintln!(
                        "backend auto: no CUDA device ({cuda}), no wgpu GPU ({why}); using the \
                         CPU (Flex)"
                    );
                    Ok(Selected::Cpu)
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// The backend a run of `settings` selects: `[distributed] devices` decide it when set (their
/// first CUDA index for `cuda`), else `backend.kind` and `backend.cuda_index`.
pub fn select_for(settings: &Settings) -> Result<Selected, NoDevice> {
    match &settings.distributed {
        Some(spec) => match spec.devices[0] {
            DeviceSpec::Cpu => Ok(Selected::Cpu),
            DeviceSpec::Cuda(index) => cuda::probe(index).map(Selected::Cuda),
            // burn-collective's peers here are CPU or CUDA devices, not wgpu's.
            DeviceSpec::Selected => match select(settings.backend, settings.cuda_index)? {
                Selected::Wgpu(_) => Err(NoDevice::Wgpu(
                    "distributed runs on the CPU or CUDA: set backend.kind or --backend to \
                     cpu or cuda"
                        .into(),
                )),
                selected => Ok(selected),
            },
        },
        None => select(settings.backend, settings.cuda_index),
    }
}

/// One CUDA device per data-parallel peer, each checked with the test kernel (`first`, the
/// selected device, alone without `[distributed]`).
pub fn cuda_peers(settings: &Settings, first: &CudaDevice) -> Result<Vec<CudaDevice>, NoDevice> {
    let Some(spec) = &settings.distributed else {
        return Ok(vec![first.clone()]);
    };
    let probe = |device: &DeviceSpec| match *device {
        DeviceSpec::Cuda(index) if index == first.index => Ok(first.clone()),
        DeviceSpec::Selected => Ok(first.clone()),
        DeviceSpec::Cuda(index) => cuda::probe(index),
        DeviceSpec::Cpu => Err(NoDevice::Cuda {
            index: first.index,
            reason: "distributed.devices mixes cpu and cuda".into(),
        }),
    };
    spec.devices.iter().map(probe).collect()
}

/// Peers of a CPU run: they share Flex's one device.
pub fn cpu_peers<D: Default + Clone>(settings: &Settings) -> Vec<D> {
    let n = settings.distributed.as_ref().map_or(1, |d| d.devices.len());
    vec![D::default(); n]
}

/// Sums four ones on `device`: the driver must load, compile and run a kernel. CubeCL panics
/// when it cannot (often in its server thread, so this thread only sees a closed channel): the
/// reason is the first line of the first panic message of any thread, and nothing is printed.
fn test_kernel<B: Backend>(device: &B::Device) -> Result<(), String> {
    let Captured { result, first } = panics::capture(
        |_| true,
        false,
        || Tensor::<B, 1>::ones([4], device).sum().into_scalar(),
    );
    match result {
        Ok(sum) if sum.elem::<f64>() == 4.0 => Ok(()),
        Ok(sum) => Err(format!("test kernel returned {sum}, expected 4")),
        Err(payload) => {
            let reason = first
                .or_else(|| Some(panics::message(payload.as_ref())))
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "initialisation panicked".into());
            Err(reason.lines().next().unwrap_or_default().to_string())
        }
    }
}
