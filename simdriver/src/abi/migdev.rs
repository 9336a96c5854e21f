//! MIG device handles: a compute instance seen as a device, the way CUDA and tools that
//! walk a node's devices (NVIDIA's CDI generator through go-nvlib) see it. The MIG devices
//! of a GPU are numbered from 0 in GPU-instance, then compute-instance id order, up to
//! `nvmlDeviceGetMaxMigDeviceCount`; an index without a device is `NVML_ERROR_NOT_FOUND`,
//! as on hardware.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;

use super::{View, call, device::gpu_index, driver, handle, model, pointer, put};
use crate::{codes, handles::Handle};

/// The MIG device a handle names: (gpu, gi, ci), checked against the current view.
fn mig_of(view: &View, device: nvmlDevice_t) -> Result<(u32, u32, u32), codes::Code> {
    let Handle::MigDevice { gpu, gi, ci } = handle(device)? else {
        return Err(codes::INVALID_ARGUMENT);
    };
    let exists = view
        .gpu(gpu)?
        .instances
        .iter()
        .find(|i| i.id == gi)
        .is_some_and(|i| i.compute_instances.iter().any(|c| c.id == ci));
    if !exists {
        return Err(codes::INVALID_ARGUMENT);
    }
    Ok((gpu, gi, ci))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let g = view.gpu(gpu_index(device)?)?;
        let layout = model(g)?.mig.as_ref().ok_or(codes::NOT_SUPPORTED)?;
        put(count, c_uint::from(layout.max_gpu_instances))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let gpu = gpu_index(device)?;
        let g = view.gpu(gpu)?;
        if !g.mig_enabled {
            return Err(codes::NOT_SUPPORTED);
        }
        let mut instances: Vec<_> = g.instances.iter().collect();
        instances.sort_by_key(|i| i.id);
        let found = instances
            .iter()
            .flat_map(|i| {
                let mut cis: Vec<_> = i.compute_instances.iter().map(|c| c.id).collect();
                cis.sort_unstable();
                cis.into_iter().map(move |ci| (i.id, ci))
            })
            .nth(index as usize);
        let (gi, ci) = found.ok_or(codes::NOT_FOUND)?;
        put(mig_device, pointer(Handle::MigDevice { gpu, gi, ci }))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let mig = match handle(device)? {
            Handle::MigDevice { .. } => 1,
            Handle::Gpu(_) => 0,
            _ => return Err(codes::INVALID_ARGUMENT),
        };
        put(is_mig, mig)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        match handle(device)? {
            Handle::Gpu(_) => Err(codes::NOT_SUPPORTED),
            _ => put(id, mig_of(&view, device)?.1),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        match handle(device)? {
            Handle::Gpu(_) => Err(codes::NOT_SUPPORTED),
            _ => put(id, mig_of(&view, device)?.2),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let (gpu, _, _) = mig_of(&view, mig_device)?;
        put(device, pointer(Handle::Gpu(gpu)))
    })
}

/// The attributes of a MIG device: its GPU instance's profile (a full-size compute
/// instance, the only kind the simulator makes).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let (gpu, gi, _) = mig_of(&view, device).map_err(|e| match handle(device) {
            Ok(Handle::Gpu(_)) => codes::NOT_SUPPORTED,
            _ => e,
        })?;
        let g = view.gpu(gpu)?;
        let layout = model(g)?.mig.as_ref().ok_or(codes::NOT_SUPPORTED)?;
        let profile_id = g
            .instances
            .iter()
            .find(|i| i.id == gi)
            .map(|i| i.profile_id)
            .ok_or(codes::INVALID_ARGUMENT)?;
        let p = layout.profile(profile_id).ok_or(codes::UNKNOWN)?;
        let e = p.engines;
        put(
            attributes,
            nvmlDeviceAttributes_t {
                multiprocessorCount: p.sm_count,
                sharedCopyEngineCount: e.copy,
                sharedDecoderCount: e.decoders,
                sharedEncoderCount: e.encoders,
                sharedJpegCount: e.jpeg,
                sharedOfaCount: e.ofa,
                gpuInstanceSliceCount: c_uint::from(p.compute_slices),
                computeInstanceSliceCount: c_uint::from(p.compute_slices),
                memorySizeMB: p.memory_mib,
            },
        )
    })
}
