//! The GPU probe: CubeCL's memory usage for a device (bytes in use, bytes reserved by its
//! pools), read after a device sync. CUDA and wgpu share this code; only the driver's
//! device-wide figure ([`device_memory`], what nvidia-smi shows: CubeCL's pools, the CUDA
//! context and every other process) is CUDA's alone.
//!
//! CubeCL keeps no peak: the peak reported is the largest sample, taken at every layer
//! boundary of forward and backward, and where an op reports its own peak moment (max-pool's
//! backward). Any other allocation that lives only inside one layer is not seen.

use std::marker::PhantomData;

use burn::backend::cuda::CudaDevice;
use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use burn::backend::{Cuda, Wgpu};
use burn::cubecl::cuda::CudaRuntime;
use burn::cubecl::Runtime;
use burn::tensor::backend::Backend;

use super::probe::{Meter, Probe, Reading};
use super::ProbeKind;

/// A device of Burn backend `B`, whose CubeCL runtime is `R`, as a [`Meter`].
pub struct Cube<B: Backend, R: Runtime> {
    device: B::Device,
    kind: ProbeKind,
    device_used: fn(&B::Device) -> Option<u64>,
    runtime: PhantomData<fn() -> R>,
}

impl<B, R> Meter for Cube<B, R>
where
    B: Backend,
    R: Runtime<Device = B::Device>,
{
    fn kind(&self) -> ProbeKind {
        self.kind
    }

    fn read(&self) -> Option<Reading> {
        // Pending (fused) kernels must run before their memory shows.
        B::sync(&self.device).ok()?;
        let usage = R::client(&self.device).memory_usage().ok()?;
        Some(Reading {
            in_use: usage.bytes_in_use,
            reserved: Some(usage.bytes_reserved),
        })
    }

    fn device_used(&self) -> Option<u64> {
        (self.device_used)(&self.device)
    }
}

/// Sampled CubeCL usage of a CUDA device, with the driver's device-wide figure.
pub type CudaProbe = Probe<Cube<Cuda, CudaRuntime>>;
/// Sampled CubeCL usage of a wgpu adapter (Vulkan, Metal).
pub type WgpuProbe = Probe<Cube<Wgpu, WgpuRuntime>>;

/// A probe for CUDA `device`.
pub fn cuda(device: CudaDevice) -> CudaProbe {
    Probe::new(Cube {
        device,
        kind: ProbeKind::Cuda,
        device_used: |d| device_memory(d.index).map(|(free, total)| total.saturating_sub(free)),
        runtime: PhantomData,
    })
}

/// A probe for wgpu `device`. wgpu exposes no device-wide usage.
pub fn wgpu(device: WgpuDevice) -> WgpuProbe {
    Probe::new(Cube {
        device,
        kind: ProbeKind::Wgpu,
        device_used: |_| None,
        runtime: PhantomData,
    })
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
