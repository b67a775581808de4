//! `backend.kind = "cuda"`: is device `index` usable?

use burn::backend::cuda::CudaDevice;
use burn::backend::Cuda;
use burn::tensor::Tensor;

use super::NoDevice;
use crate::panics::{self, Captured};

/// Runs one tiny kernel on device `index`. CubeCL panics when the driver is missing (in its
/// server thread, so this thread only sees a closed channel): the hook keeps the first panic
/// message of any thread as the reason, and prints nothing.
pub(super) fn probe(index: usize) -> Result<CudaDevice, NoDevice> {
    let fail = |reason: String| NoDevice::Cuda { index, reason };
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
