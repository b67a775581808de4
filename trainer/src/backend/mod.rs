//! Backend choice: one type alias per backend, picked once at start-up.

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::cuda::CudaDevice;
use burn::backend::{Autodiff, Cuda, Flex};
use burn::tensor::Tensor;

use crate::config::BackendKind;
use crate::panics::{self, Captured};

/// Training on the CPU: Burn's Flex backend under autodiff.
pub type CpuBackend = Autodiff<Flex>;
/// Training on an NVIDIA GPU: burn-cuda under autodiff.
pub type CudaBackend = Autodiff<Cuda>;
/// [`CpuBackend`] with balanced activation checkpointing (`memory.checkpointing`).
pub type CpuCheckpointed = Autodiff<Flex, BalancedCheckpointing>;
/// [`CudaBackend`] with balanced activation checkpointing.
pub type CudaCheckpointed = Autodiff<Cuda, BalancedCheckpointing>;

/// The backend a run uses.
#[derive(Debug, Clone)]
pub enum Selected {
    /// Flex on the CPU.
    Cpu,
    /// CUDA device `index`.
    Cuda(CudaDevice),
}

impl Selected {
    /// Name used in reports.
    pub fn name(&self) -> String {
        match self {
            Self::Cpu => "cpu".into(),
            Self::Cuda(d) => format!("cuda:{}", d.index),
        }
    }

    /// The `backend.kind` that selects this backend again (e.g. in a child process).
    pub fn kind(&self) -> BackendKind {
        match self {
            Self::Cpu => BackendKind::Cpu,
            Self::Cuda(_) => BackendKind::Cuda,
        }
    }
}

/// `backend = "cuda"` where no usable GPU exists.
#[derive(Debug, thiserror::Error)]
#[error(
    "backend.kind = \"cuda\": no usable CUDA device {index}: {reason} (use --backend cpu or auto)"
)]
pub struct NoCuda {
    index: usize,
    reason: String,
}

/// Resolves `kind`: `auto` takes CUDA when device `index` initialises, else the CPU, saying so.
pub fn select(kind: BackendKind, index: usize) -> Result<Selected, NoCuda> {
    match kind {
        BackendKind::Cpu => Ok(Selected::Cpu),
        BackendKind::Cuda => probe_cuda(index).map(Selected::Cuda),
        BackendKind::Auto => match probe_cuda(index) {
            Ok(device) => Ok(Selected::Cuda(device)),
            Err(e) => {
                eprintln!(
                    "backend auto: no CUDA device ({}); using the CPU (Flex)",
                    e.reason
                );
                Ok(Selected::Cpu)
            }
        },
    }
}

/// Runs one tiny kernel on device `index`. CubeCL panics when the driver is missing (in its
/// server thread, so this thread only sees a closed channel): the hook keeps the first panic
/// message of any thread as the reason, and prints nothing.
fn probe_cuda(index: usize) -> Result<CudaDevice, NoCuda> {
    let fail = |reason: String| NoCuda { index, reason };
    if std::env::var_os("OOMLAB_NO_CUDA").is_some() {
        return Err(fail("disabled by OOMLAB_NO_CUDA".into()));
    }
    let Captured { result, first } = panics::capture(
        |_| true,
        false,
        || {
            let device = CudaDevice::new(index);
            let ones = Tensor::<Cuda, 1>::ones([4], &device).sum().into_scalar();
            (device, ones)
        },
    );
    match result {
        Ok((device, 4.0)) => Ok(device),
        Ok((_, sum)) => Err(fail(format!("test kernel returned {sum}, expected 4"))),
        Err(payload) => {
            let reason = first
                .or_else(|| Some(panics::message(payload.as_ref())))
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "initialisation panicked".into());
            // cudarc appends every library name it tried; the first clause is the reason.
            let reason = reason.lines().next().unwrap_or_default();
            Err(fail(
                reason
                    .split(" - searched")
                    .next()
                    .unwrap_or(reason)
                    .to_string(),
            ))
        }
    }
}
