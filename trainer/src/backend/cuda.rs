//! `backend.kind = "cuda"`: is device `index` usable?

use burn::backend::cuda::CudaDevice;
use burn::backend::Cuda;

use super::{test_kernel, NoDevice};

/// Runs the test kernel on device `index`.
pub(super) fn probe(index: usize) -> Result<CudaDevice, NoDevice> {
    let fail = |reason: String| NoDevice::Cuda { index, reason };
    if std::env::var_os("OOMLAB_NO_CUDA").is_some() {
        return Err(fail("disabled by OOMLAB_NO_CUDA".into()));
    }
    let device = CudaDevice::new(index);
    test_kernel::<Cuda>(&device).map_err(|reason| {
        // cudarc appends every library name it tried; the first clause is the reason.
        fail(
            reason
                .split(" - searched")
                .next()
                .unwrap_or_default()
                .to_string(),
        )
    })?;
    Ok(device)
}
