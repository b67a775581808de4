//! The CUDA probe: CubeCL's memory usage for the device (bytes in use, bytes reserved), read
//! after a device sync at each phase boundary. CubeCL keeps no peak, so the peak here is the
//! largest sample: allocations that live only between two boundaries are not seen. The driver's
//! free/total memory (cuMemGetInfo, what nvidia-smi shows) adds the device-wide used bytes:
//! CubeCL's pools, the CUDA context and every other process on the device.

use burn::backend::cuda::CudaDevice;
use burn::backend::Cuda;
use burn::cubecl::cuda::CudaRuntime;
use burn::cubecl::Runtime;
use burn::tensor::backend::Backend;

use super::{MemoryProbe, MemoryReport, Phase, PhaseMax};

/// Sampled CubeCL usage of one CUDA device.
pub struct CudaProbe {
    device: CudaDevice,
    in_use: u64,
    reserved: u64,
    reserved_after_step: u64,
    device_used: Option<u64>,
    phases: PhaseMax,
}

/// The device's free and total bytes, from the driver. Binds device `index`'s primary context
/// (the one CubeCL uses) to this thread first; `None` if the driver will not say.
pub fn device_memory(index: usize) -> Option<(u64, u64)> {
    use cudarc::driver::result;
    let ask = || -> Option<(u64, u64)> {
        result::init().ok()?;
        let device = result::device::get(index as i32).ok()?;
        // SAFETY: `device` is a valid handle from the driver; the primary context is retained
        // for the life of the process, so the pointer made current stays valid.
        unsafe {
            let ctx = result::primary_ctx::retain(device).ok()?;
            result::ctx::set_current(ctx).ok()?;
        }
        let (free, total) = result::mem_get_info().ok()?;
        Some((free as u64, total as u64))
    };
    // cudarc panics when it cannot load the driver library.
    std::panic::catch_unwind(ask).ok().flatten()
}

impl CudaProbe {
    /// A probe for `device`.
    pub fn new(device: CudaDevice) -> Self {
        Self {
            device,
            in_use: 0,
            reserved: 0,
            reserved_after_step: 0,
            device_used: None,
            phases: PhaseMax::default(),
        }
    }
}

impl MemoryProbe for CudaProbe {
    fn sample(&mut self, phase: Phase) {
        // Pending (fused) kernels must run before their memory shows.
        if <Cuda as Backend>::sync(&self.device).is_err() {
            return;
        }
        let Ok(usage) = CudaRuntime::client(&self.device).memory_usage() else {
            return;
        };
        self.in_use = self.in_use.max(usage.bytes_in_use);
        self.reserved = self.reserved.max(usage.bytes_reserved);
        self.phases.record(phase, usage.bytes_in_use);
        if let Some((free, total)) = device_memory(self.device.index) {
            let used = total.saturating_sub(free);
            self.device_used = Some(self.device_used.map_or(used, |u| u.max(used)));
        }
        if phase == Phase::AfterStep {
            self.reserved_after_step = usage.bytes_reserved;
        }
    }

    fn report(&self) -> MemoryReport {
        MemoryReport {
            memory_probe: "cuda".into(),
            peak_bytes: Some(self.in_use),
            reserved_peak_bytes: Some(self.reserved),
            reserved_after_step_bytes: Some(self.reserved_after_step),
            device_used_peak_bytes: self.device_used,
            live_after_forward_bytes: Some(self.phases.forward),
            live_after_backward_bytes: Some(self.phases.backward),
            live_after_step_bytes: Some(self.phases.step),
        }
    }
}
