//! The CUDA driver API, loaded as the CUDA runtime loads it: `dlopen("libcuda.so.1")`.
#![allow(unsafe_code, reason = "calls the CUDA driver API through its C ABI")]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::Report;

/// A device CUDA enumerated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDevice {
    /// Its UUID's 32 hex digits.
    pub uuid: String,
    /// Its name.
    pub name: String,
    /// `cuMemGetInfo` total, bytes: an MPS client's pinned memory limit where it has one.
    pub total_memory: usize,
    /// The SMs its context may use (`cuCtxGetExecAffinity`), where the driver says.
    pub sm_count: Option<u32>,
}

/// What CUDA said.
#[derive(Debug, Default)]
pub struct CudaReport {
    /// `cuInit`'s result.
    pub init: c_uint,
    /// The devices.
    pub devices: Vec<CudaDevice>,
}

/// Whether `want` (`GPU-…`/`MIG-…`) is one of `seen` (hex digits).
pub fn same_uuid_in(want: &str, seen: &[&str]) -> bool {
    let hex: String = want
        .split_once('-')
        .map_or(want, |(_, rest)| rest)
        .chars()
        .filter(|c| *c != '-')
        .collect::<String>()
        .to_lowercase();
    seen.contains(&hex.as_str())
}

type Init = unsafe extern "C" fn(c_uint) -> c_uint;
type Count = unsafe extern "C" fn(*mut c_int) -> c_uint;
type Uuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_uint;
type Name = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_uint;
type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_uint;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> c_uint;
type MemInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> c_uint;
/// `cuCtxGetExecAffinity` with `CUexecAffinityParam` as `{type, smCount}`.
type ExecAffinity = unsafe extern "C" fn(*mut [c_uint; 2], c_uint) -> c_uint;

/// Loads a library by its bare name, as the loader finds it.
fn load(name: &str, r: &mut Report) -> Option<libloading::Library> {
    // SAFETY: the driver's library; its initialisers are the driver's.
    match unsafe { libloading::Library::new(name) } {
        Ok(lib) => {
            r.found(format!("{name}: found by the dynamic loader"));
            Some(lib)
        }
        Err(e) => {
            r.missing(format!("{name} is not found by the dynamic loader: {e}"));
            None
        }
    }
}

/// Loads NVML and CUDA and asks CUDA for its devices.
pub fn probe(r: &mut Report) -> CudaReport {
    let mut out = CudaReport {
        init: u32::MAX,
        ..CudaReport::default()
    };
    let _nvml = load("libnvidia-ml.so.1", r);
    let Some(cuda) = load("libcuda.so.1", r) else {
        return out;
    };
    // SAFETY: the signatures are cuda.h's; every pointer passed is to a local.
    unsafe {
        let Ok(init) = cuda.get::<Init>(b"cuInit") else {
            r.missing("libcuda.so.1 has no cuInit");
            return out;
        };
        out.init = init(0);
        if out.init != 0 {
            r.missing(format!("cuInit failed with CUresult {}", out.init));
            return out;
        }
        let (Ok(count), Ok(uuid), Ok(name), Ok(retain), Ok(set), Ok(mem)) = (
            cuda.get::<Count>(b"cuDeviceGetCount"),
            cuda.get::<Uuid>(b"cuDeviceGetUuid"),
            cuda.get::<Name>(b"cuDeviceGetName"),
            cuda.get::<Retain>(b"cuDevicePrimaryCtxRetain"),
            cuda.get::<SetCurrent>(b"cuCtxSetCurrent"),
            cuda.get::<MemInfo>(b"cuMemGetInfo_v2"),
        ) else {
            r.missing("libcuda.so.1 lacks a device call the probe makes");
            return out;
        };
        let mut n = 0;
        let rc = count(&mut n);
        if rc != 0 {
            r.missing(format!("cuDeviceGetCount failed with CUresult {rc}"));
            return out;
        }
        r.found(format!("CUDA devices: {n}"));
        for dev in 0..n {
            let mut bytes = [0u8; 16];
            let mut text = [0 as c_char; 128];
            if uuid(&mut bytes, dev) != 0 || name(text.as_mut_ptr(), 128, dev) != 0 {
                r.missing(format!("device {dev}: no UUID or name"));
                continue;
            }
            let name = std::ffi::CStr::from_ptr(text.as_ptr())
                .to_string_lossy()
                .into_owned();
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut ctx = std::ptr::null_mut();
            let rc = retain(&mut ctx, dev);
            if rc != 0 {
                r.missing(format!("device {dev} ({name}): no context (CUresult {rc})"));
                continue;
            }
            set(ctx);
            let (mut free, mut total) = (0usize, 0usize);
            let rc = mem(&mut free, &mut total);
            if rc != 0 {
                r.missing(format!(
                    "device {dev} ({name}): cuMemGetInfo failed (CUresult {rc})"
                ));
                continue;
            }
            // SM_COUNT (0) is the one affinity type CUDA defines; an MPS client's is its
            // active thread percentage of the device's SMs.
            let mut affinity = [0 as c_uint; 2];
            let sm_count = cuda
                .get::<ExecAffinity>(b"cuCtxGetExecAffinity")
                .ok()
                .filter(|get| get(&mut affinity, 0) == 0)
                .map(|_| affinity[1]);
            let sms = sm_count.map_or_else(String::new, |n| format!(", {n} SMs"));
            r.found(format!(
                "device {dev}: {name}, uuid {hex}, {} MiB free of {} MiB{sms}",
                free >> 20,
                total >> 20
            ));
            out.devices.push(CudaDevice {
                uuid: hex,
                name,
                total_memory: total,
                sm_count,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_compare_by_their_hex_digits() {
        assert!(same_uuid_in(
            "MIG-0123ABCD-89ab-cdef-0123-456789abcdef",
            &["0123abcd89abcdef0123456789abcdef"]
        ));
        assert!(!same_uuid_in("GPU-1", &["0123"]));
    }
}
