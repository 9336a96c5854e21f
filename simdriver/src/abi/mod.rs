//! The exported NVML functions. Each one checks its pointers, finds the object its
//! handle names, and asks the simulator, which applies the hardware's rules; the answer
//! goes back as NVML's return code. No function panics across the C boundary: a panic
//! is caught and answered with `NVML_ERROR_UNKNOWN`.
//!
//! The driver state (the simulator of the root this library was installed in) lives from
//! the first `nvmlInit*` to the matching last `nvmlShutdown`, as NVML's reference count.
#![allow(
    unsafe_code,
    non_snake_case,
    non_upper_case_globals,
    reason = "exports nvml.h's C ABI; the names are nvml.h's, unchanged, so a reader can look each one up"
)]

mod device;
mod events;
mod mig;
mod migdev;

use std::{
    ffi::{CStr, c_char, c_uint},
    os::unix::ffi::OsStrExt,
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex, MutexGuard},
};

use nvml_wrapper_sys::bindings::nvmlReturn_t;
use tessera_gpu::{
    backend::sim::{SimBackend, SimGpu, SimState},
    catalog::GpuModel,
};

use crate::{
    codes::{self, Code},
    handles::Handle,
    root::SimRoot,
};

/// One loaded driver.
pub(crate) struct Driver {
    sim: SimBackend,
    events: events::Sets,
}

struct Loaded {
    refs: u32,
    driver: Option<Arc<Driver>>,
}

static LOADED: Mutex<Loaded> = Mutex::new(Loaded {
    refs: 0,
    driver: None,
});

fn loaded() -> MutexGuard<'static, Loaded> {
    LOADED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs an NVML call: its result as a code, a panic as `NVML_ERROR_UNKNOWN`.
fn call(f: impl FnOnce() -> Result<(), Code>) -> nvmlReturn_t {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => codes::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => codes::UNKNOWN,
    }
}

/// The loaded driver, or `NVML_ERROR_UNINITIALIZED`.
fn driver() -> Result<Arc<Driver>, Code> {
    loaded().driver.clone().ok_or(codes::UNINITIALIZED)
}

/// The path of this library, from the dynamic loader.
fn own_path() -> Option<std::path::PathBuf> {
    // SAFETY: a C struct of pointers: all zero (null) is a value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = nvmlInit_v2 as *const () as *const libc::c_void;
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
        name.to_bytes(),
    )))
}

fn init() -> Result<(), Code> {
    let mut l = loaded();
    if l.driver.is_none() {
        // Without its root the library is a driver whose kernel module is not loaded.
        let root = own_path()
            .and_then(|p| SimRoot::of_library(&p))
            .ok_or(codes::DRIVER_NOT_LOADED)?;
        let sim = root.open().map_err(|_| codes::DRIVER_NOT_LOADED)?;
        l.driver = Some(Arc::new(Driver {
            sim,
            events: events::Sets::default(),
        }));
    }
    l.refs += 1;
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    call(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    call(init)
}

/// `flags` (`NVML_INIT_FLAG_NO_GPUS`, `NO_ATTACH`) change nothing for simulated GPUs,
/// which are always attached.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    call(init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    call(|| {
        let mut l = loaded();
        if l.refs == 0 {
            return Err(codes::UNINITIALIZED);
        }
        l.refs -= 1;
        if l.refs == 0 {
            l.driver = None;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    codes::describe(result).as_ptr()
}

/// Writes `value` through `out`.
fn put<T>(out: *mut T, value: T) -> Result<(), Code> {
    if out.is_null() {
        return Err(codes::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it point at a `T` the caller owns.
    unsafe { out.write(value) };
    Ok(())
}

/// Reads `*p`.
fn get<T: Copy>(p: *const T) -> Result<T, Code> {
    if p.is_null() {
        return Err(codes::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it point at a `T`.
    Ok(unsafe { p.read() })
}

/// Copies `s` and a NUL into the caller's buffer of `len` bytes.
fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Code> {
    if buf.is_null() {
        return Err(codes::INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(codes::INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller's buffer holds `len` bytes, more than we write.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Fills a fixed `c_char` array with `s`, truncated to leave the NUL.
fn fill(dst: &mut [c_char], s: &str) {
    dst.fill(0);
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// Writes `items` into the caller's array of `*count` entries (or only the count, when
/// `out` is null), as NVML's list calls do.
fn put_list<T: Copy>(out: *mut T, count: *mut c_uint, items: &[T]) -> Result<(), Code> {
    let n = c_uint::try_from(items.len()).map_err(|_| codes::UNKNOWN)?;
    if out.is_null() {
        return put(count, n);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: the caller sized `out` for at least the instances of this profile, which
        // bounds `items`; NVML's contract.
        unsafe { out.add(i).write(*item) };
    }
    put(count, n)
}

/// A consistent view of the hardware for one query.
struct View {
    state: SimState,
}

impl View {
    fn now(d: &Driver) -> Self {
        View {
            state: d.sim.state(),
        }
    }

    /// The GPU `index`; `NVML_ERROR_GPU_IS_LOST` once it fell off the bus.
    fn gpu(&self, index: u32) -> Result<&SimGpu, Code> {
        let g = self
            .state
            .gpus
            .get(index as usize)
            .ok_or(codes::INVALID_ARGUMENT)?;
        if g.lost {
            return Err(codes::GPU_IS_LOST);
        }
        Ok(g)
    }
}

fn model(g: &SimGpu) -> Result<&'static GpuModel, Code> {
    tessera_gpu::find_model(&g.model).map_err(|_| codes::UNKNOWN)
}

/// The handle behind a pointer.
fn handle<T>(p: *mut T) -> Result<Handle, Code> {
    Handle::decode(p.addr()).ok_or(codes::INVALID_ARGUMENT)
}

/// A handle as a pointer of the type NVML declares.
fn pointer<T>(h: Handle) -> *mut T {
    std::ptr::without_provenance_mut(h.encode())
}
