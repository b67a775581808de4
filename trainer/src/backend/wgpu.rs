//! `backend.kind = "wgpu"` (and `auto`'s second choice): which adapter, if any, runs the job.
//!
//! The graphics API is Vulkan everywhere but macOS, where it is Metal (not built or tested in
//! CI: the cfg below is all that differs).

use burn::backend::wgpu::WgpuDevice;
use burn::backend::Wgpu;
use wgpu::{Backends, DeviceType};

use super::{test_kernel, Adapter, NoDevice};

#[cfg(not(target_os = "macos"))]
const API: (Backends, &str) = (Backends::VULKAN, "Vulkan");
#[cfg(target_os = "macos")]
const API: (Backends, &str) = (Backends::METAL, "Metal");

/// Driver packages named when no adapter is found.
const DRIVERS: &str = "install a Vulkan driver: mesa-vulkan-drivers (llvmpipe, runs on any CPU) \
                       or your GPU vendor's";

/// The best adapter: a discrete, then integrated, then virtual GPU; a CPU adapter (llvmpipe)
/// only when `allow_cpu`. It must run a test kernel.
pub(super) fn pick(allow_cpu: bool) -> Result<Adapter, NoDevice> {
    if std::env::var_os("OOMLAB_NO_WGPU").is_some() {
        return Err(NoDevice::Wgpu("disabled by OOMLAB_NO_WGPU".into()));
    }
    loader()?;
    let infos = adapters();
    let rank = |t: DeviceType| match t {
        DeviceType::DiscreteGpu => 0,
        DeviceType::IntegratedGpu => 1,
        DeviceType::VirtualGpu => 2,
        DeviceType::Other => 3,
        DeviceType::Cpu => 4,
    };
    let best = infos
        .iter()
        .enumerate()
        .filter(|(_, i)| allow_cpu || i.device_type != DeviceType::Cpu)
        .min_by_key(|(n, i)| (rank(i.device_type), *n));
    let Some((n, info)) = best else {
        let why = match infos.is_empty() {
            true => format!("the {} loader found no adapter: {DRIVERS}", API.1),
            false => format!(
                "only CPU adapters ({}), which auto skips; --backend wgpu takes them",
                names(&infos)
            ),
        };
        return Err(NoDevice::Wgpu(why));
    };
    // CubeCL numbers adapters within their type, in enumeration order.
    let nth = infos[..n]
        .iter()
        .filter(|i| i.device_type == info.device_type)
        .count();
    let device = match info.device_type {
        DeviceType::DiscreteGpu => WgpuDevice::DiscreteGpu(nth),
        DeviceType::IntegratedGpu => WgpuDevice::IntegratedGpu(nth),
        DeviceType::VirtualGpu => WgpuDevice::VirtualGpu(nth),
        DeviceType::Cpu => WgpuDevice::Cpu,
        DeviceType::Other => WgpuDevice::DefaultDevice,
    };
    let adapter = Adapter {
        device,
        name: info.name.clone(),
        api: API.1.into(),
    };
    test_kernel::<Wgpu>(&adapter.device)
        .map_err(|why| NoDevice::Wgpu(format!("adapter {}: {why}", adapter.name)))?;
    Ok(adapter)
}

/// Every adapter of the graphics API, in the order CubeCL enumerates them.
fn adapters() -> Vec<wgpu::AdapterInfo> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: API.0,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let list = burn::cubecl::future::block_on(instance.enumerate_adapters(API.0));
    list.iter().map(|a| a.get_info()).collect()
}

fn names(infos: &[wgpu::AdapterInfo]) -> String {
    let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
    names.join(", ")
}

/// Linux: is the Vulkan loader there at all? (wgpu alone would only find no adapter.)
#[cfg(target_os = "linux")]
fn loader() -> Result<(), NoDevice> {
    const LIB: &std::ffi::CStr = c"libvulkan.so.1";
    // SAFETY: dlopen with a valid C string; the handle is closed at once.
    let handle = unsafe { libc::dlopen(LIB.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(NoDevice::Wgpu(format!(
            "no Vulkan loader (libvulkan.so.1 not found): install libvulkan1, then {DRIVERS}"
        )));
    }
    // SAFETY: `handle` came from dlopen above and is closed once.
    unsafe { libc::dlclose(handle) };
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn loader() -> Result<(), NoDevice> {
    Ok(())
}
