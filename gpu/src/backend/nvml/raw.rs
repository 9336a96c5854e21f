//! Safe wrappers around the NVML MIG calls that nvml-wrapper does not wrap, reached
//! through its `-sys` function table (`Nvml::lib()`).
//!
//! This is the only module with `unsafe`: FFI calls need it. Each call passes pointers to
//! locals that outlive the call, buffers sized by a previous count query, and handles
//! obtained from NVML in the same locked section, so NVML never sees a dangling pointer.
//! A symbol missing from an old driver is an error, never a panic: the `-sys` methods
//! `expect` their symbol, so every call checks the symbol first.
#![allow(
    unsafe_code,
    reason = "raw NVML MIG calls the nvml-wrapper crate does not wrap"
)]

use std::{ffi::CStr, mem, os::raw::c_uint, ptr};

use nvml_wrapper::{Device, Nvml, error::nvml_try};
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    NVML_DEVICE_UUID_V2_BUFFER_SIZE, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlGpuInstanceProfileInfo_v2_t,
};

use super::map_nvml;
use crate::backend::ErrorKind;

/// A GPU-instance profile as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawProfile {
    /// Profile id.
    pub id: u32,
    /// Compute slices (`sliceCount`).
    pub slice_count: u32,
    /// Maximum instances.
    pub instance_count: u32,
    /// SMs.
    pub multiprocessor_count: u32,
    /// Copy engines, decoders, encoders, JPEG, OFA.
    pub engines: [u32; 5],
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Name from the v2 struct (`MIG 1g.10gb`), when the driver has it.
    pub name: Option<String>,
}

/// A compute instance as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawCi {
    /// Compute-instance id.
    pub id: u32,
    /// MIG device UUID.
    pub uuid: String,
}

/// A GPU instance as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawGi {
    /// GPU-instance id.
    pub id: u32,
    /// Profile id.
    pub profile_id: u32,
    /// Placement start and size.
    pub start: u32,
    /// Placement size.
    pub size: u32,
    /// Compute instances.
    pub cis: Vec<RawCi>,
}

macro_rules! sym {
    ($nvml:expr, $name:ident) => {
        if $nvml.lib().$name.is_err() {
            return Err(ErrorKind::NotSupported(format!(
                "the installed NVML has no {}",
                stringify!($name)
            )));
        }
    };
}

fn check(code: c_uint) -> Result<(), ErrorKind> {
    nvml_try(code).map_err(map_nvml)
}

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`: size | version << 24.
fn profile_info_v2_version() -> c_uint {
    (mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as c_uint) | (2 << 24)
}

fn cstr(buf: &[std::os::raw::c_char]) -> String {
    // SAFETY-free path: copy up to the first NUL byte.
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The address of a device's NVML handle, to recognise the device an event names when
/// the device can no longer answer queries (a GPU that fell off the bus).
pub fn handle_id(dev: &Device<'_>) -> usize {
    // SAFETY: reading the handle value; it is compared, never passed on.
    unsafe { dev.handle() }.addr()
}

/// The GPU-instance profile at profile *index* `index` (an NVML enum, not the id);
/// `Ok(None)` when the GPU does not have it.
pub fn profile_info(
    nvml: &Nvml,
    dev: &Device<'_>,
    index: u32,
) -> Result<Option<RawProfile>, ErrorKind> {
    let lib = nvml.lib();
    let handle = unsafe { dev.handle() };
    if lib.nvmlDeviceGetGpuInstanceProfileInfoV.is_ok() {
        let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        info.version = profile_info_v2_version();
        let rc = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfoV(handle, index, &mut info) };
        match nvml_try(rc) {
            Ok(()) => {
                let name = cstr(&info.name);
                return Ok(Some(RawProfile {
                    id: info.id,
                    slice_count: info.sliceCount,
                    instance_count: info.instanceCount,
                    multiprocessor_count: info.multiprocessorCount,
                    engines: [
                        info.copyEngineCount,
                        info.decoderCount,
                        info.encoderCount,
                        info.jpegCount,
                        info.ofaCount,
                    ],
                    memory_mib: info.memorySizeMB,
                    name: (!name.is_empty()).then_some(name),
                }));
            }
            Err(
                nvml_wrapper::error::NvmlError::NotSupported
                | nvml_wrapper::error::NvmlError::InvalidArg,
            ) => {
                return Ok(None);
            }
            // NVML_ERROR_ARGUMENT_VERSION_MISMATCH (25): the driver wants another struct
            // version; fall back to the v1 call below.
            Err(nvml_wrapper::error::NvmlError::UnexpectedVariant(25)) => {}
            Err(e) => return Err(map_nvml(e)),
        }
    }
    sym!(nvml, nvmlDeviceGetGpuInstanceProfileInfo);
    let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { mem::zeroed() };
    let rc = unsafe { lib.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, &mut info) };
    match nvml_try(rc) {
        Ok(()) => Ok(Some(RawProfile {
            id: info.id,
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            multiprocessor_count: info.multiprocessorCount,
            engines: [
                info.copyEngineCount,
                info.decoderCount,
                info.encoderCount,
                info.jpegCount,
                info.ofaCount,
            ],
            memory_mib: info.memorySizeMB,
            name: None,
        })),
        Err(
            nvml_wrapper::error::NvmlError::NotSupported
            | nvml_wrapper::error::NvmlError::InvalidArg,
        ) => Ok(None),
        Err(e) => Err(map_nvml(e)),
    }
}

/// Possible placements (start, size) of profile `profile_id`, through the `_v2` call
/// (nvml-wrapper's `possible_placements()` always returns an empty Vec in 0.13).
pub fn possible_placements(
    nvml: &Nvml,
    dev: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, ErrorKind> {
    sym!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    let lib = nvml.lib();
    let handle = unsafe { dev.handle() };
    let mut count: c_uint = 0;
    // First call with NULL gets the count.
    check(unsafe {
        lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            handle,
            profile_id,
            ptr::null_mut(),
            &mut count,
        )
    })?;
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    check(unsafe {
        lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            handle,
            profile_id,
            buf.as_mut_ptr(),
            &mut count,
        )
    })?;
    buf.truncate(count as usize);
    Ok(buf.into_iter().map(|p| (p.start, p.size)).collect())
}

fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<nvmlGpuInstanceInfo_t, ErrorKind> {
    sym!(nvml, nvmlGpuInstanceGetInfo);
    let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
    check(unsafe { nvml.lib().nvmlGpuInstanceGetInfo(gi, &mut info) })?;
    Ok(info)
}

fn ci_uuid(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<RawCi, ErrorKind> {
    sym!(nvml, nvmlComputeInstanceGetInfo_v2);
    sym!(nvml, nvmlDeviceGetUUID);
    let lib = nvml.lib();
    let mut info: nvmlComputeInstanceInfo_t = unsafe { mem::zeroed() };
    check(unsafe { lib.nvmlComputeInstanceGetInfo_v2(ci, &mut info) })?;
    let mut buf = [0 as std::os::raw::c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
    check(unsafe { lib.nvmlDeviceGetUUID(info.device, buf.as_mut_ptr(), buf.len() as c_uint) })?;
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok(RawCi { id: info.id, uuid })
}

fn compute_instances(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<Vec<RawCi>, ErrorKind> {
    sym!(nvml, nvmlGpuInstanceGetComputeInstances);
    // Every compute-instance profile, not only the full-size one: an instance created by
    // someone else may hold smaller compute instances.
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for index in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        let Some(ci_profile) = ci_profile_info_by_index(nvml, gi, index)? else {
            continue;
        };
        if seen.contains(&ci_profile.id) {
            continue;
        }
        seen.push(ci_profile.id);
        let mut handles: Vec<nvmlComputeInstance_t> =
            vec![ptr::null_mut(); ci_profile.instanceCount.max(1) as usize];
        let mut count: c_uint = 0;
        check(unsafe {
            nvml.lib().nvmlGpuInstanceGetComputeInstances(
                gi,
                ci_profile.id,
                handles.as_mut_ptr(),
                &mut count,
            )
        })?;
        handles.truncate(count as usize);
        for h in handles {
            out.push(ci_uuid(nvml, h)?);
        }
    }
    out.sort_by_key(|c| c.id);
    Ok(out)
}

/// GPU-instance slice count → compute-instance profile *index* of the same size.
fn ci_profile_index(slice_count: u32) -> Option<u32> {
    match slice_count {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

fn ci_profile_info(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    slice_count: u32,
) -> Result<Option<nvmlComputeInstanceProfileInfo_t>, ErrorKind> {
    match ci_profile_index(slice_count) {
        Some(index) => ci_profile_info_by_index(nvml, gi, index),
        None => Ok(None),
    }
}

fn ci_profile_info_by_index(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    index: u32,
) -> Result<Option<nvmlComputeInstanceProfileInfo_t>, ErrorKind> {
    sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo);
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
    let rc = unsafe {
        nvml.lib().nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi,
            index,
            NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &mut info,
        )
    };
    match nvml_try(rc) {
        Ok(()) => Ok(Some(info)),
        Err(
            nvml_wrapper::error::NvmlError::NotSupported
            | nvml_wrapper::error::NvmlError::InvalidArg,
        ) => Ok(None),
        Err(e) => Err(map_nvml(e)),
    }
}

/// The GPU instances of profile `profile_id` (at most `max` of them).
pub fn gpu_instances(
    nvml: &Nvml,
    dev: &Device<'_>,
    profile_id: u32,
    max: u32,
) -> Result<Vec<RawGi>, ErrorKind> {
    sym!(nvml, nvmlDeviceGetGpuInstances);
    let handle = unsafe { dev.handle() };
    let mut handles: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); max.max(1) as usize];
    let mut count: c_uint = 0;
    check(unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstances(handle, profile_id, handles.as_mut_ptr(), &mut count)
    })?;
    handles.truncate(count as usize);
    handles
        .into_iter()
        .map(|gi| {
            let info = gi_info(nvml, gi)?;
            Ok(RawGi {
                id: info.id,
                profile_id: info.profileId,
                start: info.placement.start,
                size: info.placement.size,
                cis: compute_instances(nvml, gi)?,
            })
        })
        .collect()
}

fn gi_by_id(nvml: &Nvml, dev: &Device<'_>, id: u32) -> Result<nvmlGpuInstance_t, ErrorKind> {
    sym!(nvml, nvmlDeviceGetGpuInstanceById);
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    check(unsafe {
        nvml.lib()
            .nvmlDeviceGetGpuInstanceById(dev.handle(), id, &mut gi)
    })?;
    Ok(gi)
}

/// Creates a GPU instance of `profile_id` at (start, size).
pub fn create_gpu_instance(
    nvml: &Nvml,
    dev: &Device<'_>,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<RawGi, ErrorKind> {
    sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement);
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = ptr::null_mut();
    check(unsafe {
        nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement(
            dev.handle(),
            profile_id,
            &placement,
            &mut gi,
        )
    })?;
    let info = gi_info(nvml, gi)?;
    Ok(RawGi {
        id: info.id,
        profile_id: info.profileId,
        start: info.placement.start,
        size: info.placement.size,
        cis: Vec::new(),
    })
}

/// Creates the full-size compute instance of GPU instance `gi_id` (compute slices
/// `slice_count`) and returns it with the MIG device UUID.
pub fn create_compute_instance(
    nvml: &Nvml,
    dev: &Device<'_>,
    gi_id: u32,
    slice_count: u32,
) -> Result<RawCi, ErrorKind> {
    sym!(nvml, nvmlGpuInstanceCreateComputeInstance);
    let gi = gi_by_id(nvml, dev, gi_id)?;
    let info = ci_profile_info(nvml, gi, slice_count)?.ok_or_else(|| {
        ErrorKind::NotSupported(format!(
            "no compute-instance profile of {slice_count} slices"
        ))
    })?;
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    check(unsafe {
        nvml.lib()
            .nvmlGpuInstanceCreateComputeInstance(gi, info.id, &mut ci)
    })?;
    ci_uuid(nvml, ci)
}

/// Destroys compute instance `ci_id` of GPU instance `gi_id`.
pub fn destroy_compute_instance(
    nvml: &Nvml,
    dev: &Device<'_>,
    gi_id: u32,
    ci_id: u32,
) -> Result<(), ErrorKind> {
    sym!(nvml, nvmlGpuInstanceGetComputeInstanceById);
    sym!(nvml, nvmlComputeInstanceDestroy);
    let gi = gi_by_id(nvml, dev, gi_id)?;
    let mut ci: nvmlComputeInstance_t = ptr::null_mut();
    check(unsafe {
        nvml.lib()
            .nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, &mut ci)
    })?;
    check(unsafe { nvml.lib().nvmlComputeInstanceDestroy(ci) })
}

/// Destroys GPU instance `gi_id` (its compute instances must be gone).
pub fn destroy_gpu_instance(nvml: &Nvml, dev: &Device<'_>, gi_id: u32) -> Result<(), ErrorKind> {
    sym!(nvml, nvmlGpuInstanceDestroy);
    let gi = gi_by_id(nvml, dev, gi_id)?;
    check(unsafe { nvml.lib().nvmlGpuInstanceDestroy(gi) })
}
