//! MIG: profiles and placements from the catalogue, GPU and compute instances from the
//! simulator, which enforces placements, overlaps, instance limits and destroy order.
//!
//! Compute instances: the simulator models the one full-size compute instance per GPU
//! instance that Tessera creates; a smaller compute-instance profile is listed (so
//! queries answer as on hardware) but creating one is `NVML_ERROR_NOT_SUPPORTED`.

use std::ffi::c_uint;

use nvml_wrapper_sys::bindings::*;
use tessera_gpu::{
    MigLayout, MigProfile,
    backend::{
        GpuBackend,
        sim::{SimGpu, SimGpuInstance},
    },
};

use super::{
    View, call, device::gpu_index, driver, fill, get, handle, model, pointer, put, put_list,
};
use crate::{codes, handles::Handle, profiles};

fn layout(g: &SimGpu) -> Result<&'static MigLayout, codes::Code> {
    model(g)?.mig.as_ref().ok_or(codes::NOT_SUPPORTED)
}

/// A GPU instance a handle names, as the view shows it.
struct Gi<'v> {
    gpu: u32,
    id: u32,
    instance: &'v SimGpuInstance,
    profile: &'static MigProfile,
}

/// The GPU instance a handle names, if it still exists.
fn instance_of<'v>(view: &'v View, gi: nvmlGpuInstance_t) -> Result<Gi<'v>, codes::Code> {
    let Handle::GpuInstance { gpu, gi } = handle(gi)? else {
        return Err(codes::INVALID_ARGUMENT);
    };
    let g = view.gpu(gpu)?;
    let instance = g
        .instances
        .iter()
        .find(|i| i.id == gi)
        .ok_or(codes::INVALID_ARGUMENT)?;
    let profile = layout(g)?
        .profile(instance.profile_id)
        .ok_or(codes::UNKNOWN)?;
    Ok(Gi {
        gpu,
        id: gi,
        instance,
        profile,
    })
}

fn profile_fields(p: &MigProfile) -> (c_uint, c_uint, c_uint, c_uint, [c_uint; 5], u64) {
    let e = p.engines;
    (
        p.profile_id,
        c_uint::from(p.compute_slices),
        c_uint::from(p.max_instances),
        p.sm_count,
        [e.copy, e.decoders, e.encoders, e.jpeg, e.ofa],
        p.memory_mib,
    )
}

fn profile_at(device: nvmlDevice_t, index: c_uint) -> Result<&'static MigProfile, codes::Code> {
    let d = driver()?;
    let view = View::now(&d);
    let g = view.gpu(gpu_index(device)?)?;
    // A profile index this GPU does not have is an invalid argument, as on hardware.
    profiles::by_index(layout(g)?, index).ok_or(codes::INVALID_ARGUMENT)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let p = profile_at(device, profile)?;
        let (id, slices, count, sms, [ce, dec, enc, jpeg, ofa], mem) = profile_fields(p);
        put(
            info,
            nvmlGpuInstanceProfileInfo_t {
                id,
                isP2pSupported: 0,
                sliceCount: slices,
                instanceCount: count,
                multiprocessorCount: sms,
                copyEngineCount: ce,
                decoderCount: dec,
                encoderCount: enc,
                jpegCount: jpeg,
                ofaCount: ofa,
                memorySizeMB: mem,
            },
        )
    })
}

/// Versions 2 and 3 of the struct, told apart by `info.version`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    call(|| {
        let version = get(info.cast::<c_uint>())?;
        let v2 = (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as c_uint) | (2 << 24);
        let v3 = (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v3_t>() as c_uint) | (3 << 24);
        let p = profile_at(device, profile)?;
        let (id, slices, count, sms, [ce, dec, enc, jpeg, ofa], mem) = profile_fields(p);
        let name = format!("MIG {}", p.name);
        // The two versions share every field but their tail (v2: isP2pSupported, v3:
        // capabilities), so one body fills either.
        macro_rules! profile_info {
            ($t:ty) => {{
                // SAFETY: a C struct of integers and a char array: all zero is a value.
                let mut out: $t = unsafe { std::mem::zeroed() };
                out.version = version;
                out.id = id;
                out.sliceCount = slices;
                out.instanceCount = count;
                out.multiprocessorCount = sms;
                out.copyEngineCount = ce;
                out.decoderCount = dec;
                out.encoderCount = enc;
                out.jpegCount = jpeg;
                out.ofaCount = ofa;
                out.memorySizeMB = mem;
                fill(&mut out.name, &name);
                put(info.cast::<$t>(), out)
            }};
        }
        if version == v2 {
            profile_info!(nvmlGpuInstanceProfileInfo_v2_t)
        } else if version == v3 {
            profile_info!(nvmlGpuInstanceProfileInfo_v3_t)
        } else {
            Err(codes::ARGUMENT_VERSION_MISMATCH)
        }
    })
}

/// Every placement the profile can take, free or not, as NVML answers.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let g = view.gpu(gpu_index(device)?)?;
        let p = layout(g)?
            .profile(profile_id)
            .ok_or(codes::INVALID_ARGUMENT)?;
        let all: Vec<nvmlGpuInstancePlacement_t> = p
            .starts
            .iter()
            .map(|s| nvmlGpuInstancePlacement_t {
                start: c_uint::from(s),
                size: c_uint::from(p.memory_slices),
            })
            .collect();
        if !placements.is_null() && get(count)? < all.len() as c_uint {
            return Err(codes::INSUFFICIENT_SIZE);
        }
        put_list(placements, count, &all)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let gpu = gpu_index(device)?;
        let want = get(placement)?;
        if gpu_instance.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let p = layout(View::now(&d).gpu(gpu)?)?
            .profile(profile_id)
            .ok_or(codes::INVALID_ARGUMENT)?;
        let start = u8::try_from(want.start).map_err(|_| codes::INVALID_ARGUMENT)?;
        if want.size != c_uint::from(p.memory_slices) {
            return Err(codes::INVALID_ARGUMENT);
        }
        let inst = d
            .sim
            .create_gpu_instance(gpu, profile_id, start)
            .map_err(|e| codes::of(&e))?;
        put(
            gpu_instance,
            pointer(Handle::GpuInstance {
                gpu,
                gi: inst.gpu_instance_id,
            }),
        )
    })
}

/// Without a placement the driver picks the first free one, in placement order.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let gpu = gpu_index(device)?;
        if gpu_instance.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let p = layout(View::now(&d).gpu(gpu)?)?
            .profile(profile_id)
            .ok_or(codes::INVALID_ARGUMENT)?;
        let mut last = codes::INSUFFICIENT_RESOURCES;
        for start in p.starts.iter() {
            match d.sim.create_gpu_instance(gpu, profile_id, start) {
                Ok(inst) => {
                    let h = Handle::GpuInstance {
                        gpu,
                        gi: inst.gpu_instance_id,
                    };
                    return put(gpu_instance, pointer(h));
                }
                Err(e) => {
                    last = codes::of(&e);
                    if last != codes::INSUFFICIENT_RESOURCES {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let gpu = gpu_index(device)?;
        let view = View::now(&d);
        let g = view.gpu(gpu)?;
        layout(g)?
            .profile(profile_id)
            .ok_or(codes::INVALID_ARGUMENT)?;
        if !g.mig_enabled {
            return Err(codes::NOT_SUPPORTED);
        }
        let found: Vec<nvmlGpuInstance_t> = g
            .instances
            .iter()
            .filter(|i| i.profile_id == profile_id)
            .map(|i| pointer(Handle::GpuInstance { gpu, gi: i.id }))
            .collect();
        put_list(gpu_instances, count, &found)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let gpu = gpu_index(device)?;
        let view = View::now(&d);
        let g = view.gpu(gpu)?;
        if !g.mig_enabled {
            return Err(codes::NOT_SUPPORTED);
        }
        if !g.instances.iter().any(|i| i.id == id) {
            return Err(codes::NOT_FOUND);
        }
        put(gpu_instance, pointer(Handle::GpuInstance { gpu, gi: id }))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let g = instance_of(&view, gpu_instance)?;
        let (gpu, gi, p, start) = (g.gpu, g.id, g.profile, g.instance.start);
        put(
            info,
            nvmlGpuInstanceInfo_t {
                device: pointer(Handle::Gpu(gpu)),
                id: gi,
                profileId: p.profile_id,
                placement: nvmlGpuInstancePlacement_t {
                    start: c_uint::from(start),
                    size: c_uint::from(p.memory_slices),
                },
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let Handle::GpuInstance { gpu, gi } = handle(gpu_instance)? else {
            return Err(codes::INVALID_ARGUMENT);
        };
        d.sim
            .destroy_gpu_instance(gpu, gi)
            .map_err(|e| match codes::of(&e) {
                // A stale handle.
                codes::NOT_FOUND => codes::INVALID_ARGUMENT,
                c => c,
            })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let p = instance_of(&view, gpu_instance)?.profile;
        if eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
            return Err(codes::NOT_SUPPORTED);
        }
        let slices = profiles::compute_slices_of_index(profile).ok_or(codes::NOT_SUPPORTED)?;
        if !profiles::compute_size_fits(p.compute_slices, slices) {
            return Err(codes::NOT_SUPPORTED);
        }
        let e = p.engines;
        put(
            info,
            nvmlComputeInstanceProfileInfo_t {
                id: profile,
                sliceCount: c_uint::from(slices),
                instanceCount: c_uint::from(p.compute_slices / slices),
                multiprocessorCount: p.sm_count * c_uint::from(slices)
                    / c_uint::from(p.compute_slices.max(1)),
                sharedCopyEngineCount: e.copy,
                sharedDecoderCount: e.decoders,
                sharedEncoderCount: e.encoders,
                sharedJpegCount: e.jpeg,
                sharedOfaCount: e.ofa,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let Gi {
            gpu,
            id: gi,
            profile: p,
            ..
        } = instance_of(&view, gpu_instance)?;
        if compute_instance.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let slices =
            profiles::compute_slices_of_index(profile_id).ok_or(codes::INVALID_ARGUMENT)?;
        if !profiles::compute_size_fits(p.compute_slices, slices) {
            return Err(codes::INVALID_ARGUMENT);
        }
        if slices != p.compute_slices {
            return Err(codes::NOT_SUPPORTED);
        }
        let inst = d
            .sim
            .create_compute_instance(gpu, gi)
            .map_err(|e| codes::of(&e))?;
        let ci = inst.compute_instances.last().ok_or(codes::UNKNOWN)?.id;
        put(
            compute_instance,
            pointer(Handle::ComputeInstance { gpu, gi, ci }),
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let g = instance_of(&view, gpu_instance)?;
        let slices =
            profiles::compute_slices_of_index(profile_id).ok_or(codes::INVALID_ARGUMENT)?;
        let (gpu, gi) = (g.gpu, g.id);
        // Every simulated compute instance spans its GPU instance.
        let found: Vec<nvmlComputeInstance_t> = if slices == g.profile.compute_slices {
            g.instance
                .compute_instances
                .iter()
                .map(|c| pointer(Handle::ComputeInstance { gpu, gi, ci: c.id }))
                .collect()
        } else {
            Vec::new()
        };
        put_list(compute_instances, count, &found)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let Gi {
            gpu,
            id: gi,
            instance,
            ..
        } = instance_of(&view, gpu_instance)?;
        let exists = instance.compute_instances.iter().any(|c| c.id == id);
        if !exists {
            return Err(codes::NOT_FOUND);
        }
        put(
            compute_instance,
            pointer(Handle::ComputeInstance { gpu, gi, ci: id }),
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let view = View::now(&d);
        let Handle::ComputeInstance { gpu, gi, ci } = handle(compute_instance)? else {
            return Err(codes::INVALID_ARGUMENT);
        };
        let g = view.gpu(gpu)?;
        let inst = g
            .instances
            .iter()
            .find(|i| i.id == gi)
            .filter(|i| i.compute_instances.iter().any(|c| c.id == ci))
            .ok_or(codes::INVALID_ARGUMENT)?;
        let p = layout(g)?.profile(inst.profile_id).ok_or(codes::UNKNOWN)?;
        put(
            info,
            nvmlComputeInstanceInfo_t {
                device: pointer(Handle::MigDevice { gpu, gi, ci }),
                gpuInstance: pointer(Handle::GpuInstance { gpu, gi }),
                id: ci,
                profileId: profiles::compute_index_of_slices(p.compute_slices)
                    .ok_or(codes::UNKNOWN)?,
                placement: nvmlComputeInstancePlacement_t {
                    start: 0,
                    size: c_uint::from(p.compute_slices),
                },
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(
    compute_instance: nvmlComputeInstance_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let Handle::ComputeInstance { gpu, gi, ci } = handle(compute_instance)? else {
            return Err(codes::INVALID_ARGUMENT);
        };
        d.sim
            .destroy_compute_instance(gpu, gi, ci)
            .map_err(|e| match codes::of(&e) {
                codes::NOT_FOUND => codes::INVALID_ARGUMENT,
                c => c,
            })
    })
}
