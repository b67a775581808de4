//! The CUDA probe: CubeCL's memory usage for the device (bytes in use, bytes reserved), read
//! after a device sync at each phase boundary. CubeCL keeps no peak, so the peak here is the
//! largest sample: allocations that live only between two boundaries are not seen.

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
    phases: PhaseMax,
}

impl CudaProbe {
    /// A probe for `device`.
    pub fn new(device: CudaDevice) -> Self {
        Self {
            device,
            in_use: 0,
            reserved: 0,
            reserved_after_step: 0,
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
            live_after_forward_bytes: Some(self.phases.forward),
            live_after_backward_bytes: Some(self.phases.backward),
            live_after_step_bytes: Some(self.phases.step),
        }
    }
}
