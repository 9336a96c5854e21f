//! Device queries and settings: enumeration, identity, memory, PCI, MIG mode, compute
//! mode, and the driver version.

use std::ffi::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::*;
use tessera_gpu::{
    backend::{ComputeMode, GpuBackend, sim::DRIVER_VERSION},
    catalog::Architecture,
};

use super::{View, call, driver, get, handle, model, pointer, put, put_str};
use crate::{codes, handles::Handle};

/// The GPU index a physical-GPU handle names.
pub(super) fn gpu_index(device: nvmlDevice_t) -> Result<u32, codes::Code> {
    match handle(device)? {
        Handle::Gpu(i) => Ok(i),
        // A MIG device handle is not a physical GPU: NVML refuses GPU-wide calls on it.
        Handle::MigDevice { .. } => Err(codes::NOT_SUPPORTED),
        _ => Err(codes::INVALID_ARGUMENT),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    call(|| {
        driver()?;
        put_str(version, length, DRIVER_VERSION)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    call(|| {
        driver()?;
        put_str(version, length, "13.580.0-sim")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let n = View::now(&d).state.gpus.len();
        put(count, c_uint::try_from(n).map_err(|_| codes::UNKNOWN)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        View::now(&d).gpu(index)?;
        put(device, pointer(Handle::Gpu(index)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        if uuid.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        // SAFETY: a NUL-terminated string, NVML's contract.
        let uuid = unsafe { std::ffi::CStr::from_ptr(uuid) }.to_string_lossy();
        let view = View::now(&d);
        for g in &view.state.gpus {
            if g.uuid == uuid {
                return put(device, pointer(Handle::Gpu(g.index)));
            }
            for gi in &g.instances {
                if let Some(ci) = gi.compute_instances.iter().find(|c| c.uuid == uuid) {
                    let h = Handle::MigDevice {
                        gpu: g.index,
                        gi: gi.id,
                        ci: ci.id,
                    };
                    return put(device, pointer(h));
                }
            }
        }
        Err(codes::NOT_FOUND)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let i = gpu_index(device)?;
        View::now(&d).gpu(i)?;
        put(index, i)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let m = model(view.gpu(gpu_index(device)?)?)?;
        put_str(
            name,
            length,
            m.product_names.first().map_or("", String::as_str),
        )
    })
}

/// The UUID of a GPU, or of a MIG device (`MIG-…`).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        match handle(device)? {
            Handle::Gpu(i) => put_str(uuid, length, &view.gpu(i)?.uuid),
            Handle::MigDevice { gpu, gi, ci } => {
                let c = view
                    .gpu(gpu)?
                    .instances
                    .iter()
                    .find(|x| x.id == gi)
                    .and_then(|x| x.compute_instances.iter().find(|c| c.id == ci))
                    .ok_or(codes::INVALID_ARGUMENT)?;
                put_str(uuid, length, &c.uuid)
            }
            _ => Err(codes::INVALID_ARGUMENT),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let m = model(view.gpu(gpu_index(device)?)?)?;
        let mut info = get(memory)?;
        let want = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);
        if info.version != want {
            return Err(codes::ARGUMENT_VERSION_MISMATCH);
        }
        info.total = m.memory_mib << 20;
        info.reserved = 0;
        info.used = 0;
        info.free = info.total;
        put(memory, info)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let m = model(view.gpu(gpu_index(device)?)?)?;
        let total = m.memory_mib << 20;
        put(
            memory,
            nvmlMemory_t {
                total,
                free: total,
                used: 0,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let m = model(view.gpu(gpu_index(device)?)?)?;
        let a = match m.architecture {
            Architecture::Ampere => NVML_DEVICE_ARCH_AMPERE,
            Architecture::Ada => NVML_DEVICE_ARCH_ADA,
            Architecture::Hopper => NVML_DEVICE_ARCH_HOPPER,
            Architecture::Blackwell => NVML_DEVICE_ARCH_BLACKWELL,
            _ => NVML_DEVICE_ARCH_UNKNOWN,
        };
        put(arch, a)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let (ma, mi) = model(view.gpu(gpu_index(device)?)?)?.compute_capability;
        put(major, c_int::try_from(ma).map_err(|_| codes::UNKNOWN)?)?;
        put(minor, c_int::try_from(mi).map_err(|_| codes::UNKNOWN)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let g = view.gpu(gpu_index(device)?)?;
        // `00000000:10:00.0`: domain, bus, device.function.
        let mut parts = g.pci_bus_id.split([':', '.']);
        let mut next = || {
            parts
                .next()
                .and_then(|p| c_uint::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        };
        let (domain, bus, dev) = (next(), next(), next());
        // SAFETY: a C struct of integers and char arrays: all zero is a value.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        super::fill(&mut info.busId, &g.pci_bus_id);
        super::fill(
            &mut info.busIdLegacy,
            &format!("{domain:04x}:{bus:02x}:{dev:02x}.0"),
        );
        info.domain = domain;
        info.bus = bus;
        info.device = dev;
        // NVIDIA's PCI vendor id in the low half, as NVML reports it.
        info.pciDeviceId = 0x10de;
        info.pciSubSystemId = 0x10de;
        put(pci, info)
    })
}

/// The simulated node numbers its device files like its indices.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let i = gpu_index(device)?;
        View::now(&d).gpu(i)?;
        put(minor, i)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let g = view.gpu(gpu_index(device)?)?;
        if model(g)?.mig.is_none() {
            return Err(codes::NOT_SUPPORTED);
        }
        put(current, c_uint::from(g.mig_enabled))?;
        put(pending, c_uint::from(g.mig_pending))
    })
}

/// `activation_status` is `NVML_ERROR_RESET_REQUIRED` while the new mode waits for a
/// reset (Ampere), as NVML reports it.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activation_status: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let i = gpu_index(device)?;
        let enabled = match mode {
            NVML_DEVICE_MIG_ENABLE => true,
            NVML_DEVICE_MIG_DISABLE => false,
            _ => return Err(codes::INVALID_ARGUMENT),
        };
        if activation_status.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let change = d.sim.set_mig_mode(i, enabled).map_err(|e| codes::of(&e))?;
        let status = if change.current == enabled {
            codes::SUCCESS
        } else {
            codes::RESET_REQUIRED
        };
        put(activation_status, status)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let m = match view.gpu(gpu_index(device)?)?.compute_mode {
            ComputeMode::Default => nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT,
            ComputeMode::ExclusiveProcess => {
                nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
            }
            ComputeMode::Prohibited => nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED,
        };
        put(mode, m)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceSetComputeMode(
    device: nvmlDevice_t,
    mode: nvmlComputeMode_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let i = gpu_index(device)?;
        let m = match mode {
            nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT => ComputeMode::Default,
            nvmlComputeMode_enum_NVML_COMPUTEMODE_EXCLUSIVE_PROCESS => {
                ComputeMode::ExclusiveProcess
            }
            nvmlComputeMode_enum_NVML_COMPUTEMODE_PROHIBITED => ComputeMode::Prohibited,
            // EXCLUSIVE_THREAD was removed from the driver years ago.
            _ => return Err(codes::NOT_SUPPORTED),
        };
        d.sim.set_compute_mode(i, m).map_err(|e| codes::of(&e))
    })
}
