//! The simulated `libcuda.so.1`: the CUDA driver API calls a probe makes (`cuInit`,
//! `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName`, `cuDeviceGetUuid`,
//! `cuDeviceTotalMem`, `cuDevicePrimaryCtxRetain`, `cuCtxCreate`, `cuCtxSetCurrent`,
//! `cuMemGetInfo`, `cuDriverGetVersion`, `cuGetErrorName`), answered from the simulated
//! hardware of the root the library sits in, by the rules CUDA applies:
//!
//! - `cuInit` needs `/dev/nvidiactl` and `/dev/nvidia-uvm` (character devices with the
//!   driver's numbers) in the root's `/dev`; without them CUDA cannot talk to the driver
//!   (`CUDA_ERROR_NO_DEVICE`, and `CUDA_ERROR_UNKNOWN` without UVM, as reported for real
//!   containers: containers.md §2.1). Without the simulated kernel's state (the driver is
//!   not loaded) it answers `CUDA_ERROR_NO_DEVICE` too.
//! - A GPU is a device only when its `/dev/nvidia<minor>` is there, it is not lost, and
//!   MIG mode is off. With MIG mode on, the GPU itself runs no CUDA work; its MIG devices
//!   (a compute instance in a GPU instance) are devices when both capability nodes,
//!   `/dev/nvidia-caps/nvidia-cap<N>` of the GI and of the CI, are there, and a process
//!   enumerates one MIG device only (MIG user guide; CUDA "Only single MIG instance
//!   enumeration is supported"). No device at all: `cuInit` fails with
//!   `CUDA_ERROR_NO_DEVICE`.
//! - `CUDA_VISIBLE_DEVICES` (indices or `GPU-`/`MIG-` UUIDs, comma-separated) picks and
//!   orders the devices; an entry that names nothing ends the list, as in CUDA.
//! - A process whose `$CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`) has an MPS
//!   control daemon is that daemon's client: it must see the daemon's shared-memory
//!   segment in its own `/dev/shm` (`CUDA_ERROR_MPS_CONNECTION_FAILED` otherwise), and
//!   its context gets the server's limits, lowered by its own
//!   `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` / `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, never
//!   raised (`cuMemGetInfo` reports the memory limit as the total,
//!   `cuCtxGetExecAffinity` the SMs). Once the daemon is gone, the context's calls fail
//!   (`CUDA_ERROR_MPS_RPC_FAILURE`). A process that reaches no daemon on a GPU an MPS
//!   daemon serves in compute mode `EXCLUSIVE_PROCESS` finds the GPU taken
//!   (`CUDA_ERROR_DEVICES_UNAVAILABLE`, "all CUDA-capable devices are busy or
//!   unavailable", containers.md §4.1); in `DEFAULT` it gets a context of its own, as
//!   MPS says: "the program continues to run as it normally would without MPS". A
//!   `PROHIBITED` GPU takes no context.
//!
//! The state is read, never written: these calls do not change the hardware.
#![allow(
    unsafe_code,
    non_snake_case,
    reason = "exports cuda.h's C ABI; the names are cuda.h's, unchanged, so a reader can look each one up"
)]

use std::{
    cell::Cell,
    ffi::{CStr, c_char, c_int, c_uint, c_void},
    io::{BufRead, BufReader, Write},
    os::unix::{ffi::OsStrExt, net::UnixStream},
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::Mutex,
};

use tessera_gpu::backend::{
    ComputeMode,
    sim::{
        CUDA_DRIVER_VERSION, SimState, caps,
        devices::{self, CAPS_MAJOR, NVIDIA_MAJOR},
        state::load_state,
    },
};

use crate::root::SimRoot;

/// `CUresult`.
pub type CUresult = c_uint;
/// `CUdevice`: an ordinal.
pub type CUdevice = c_int;
/// `CUcontext`: an opaque pointer.
pub type CUcontext = *mut c_void;

/// `CUuuid`.
#[repr(C)]
pub struct CUuuid {
    /// The 16 bytes.
    pub bytes: [c_char; 16],
}

/// `CUresult` values this library returns.
pub mod result {
    use super::CUresult;
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: CUresult = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: CUresult = 1;
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: CUresult = 3;
    /// `CUDA_ERROR_DEVICES_UNAVAILABLE`.
    pub const DEVICES_UNAVAILABLE: CUresult = 46;
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: CUresult = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: CUresult = 101;
    /// `CUDA_ERROR_INVALID_CONTEXT`.
    pub const INVALID_CONTEXT: CUresult = 201;
    /// `CUDA_ERROR_MPS_CONNECTION_FAILED`.
    pub const MPS_CONNECTION_FAILED: CUresult = 805;
    /// `CUDA_ERROR_MPS_RPC_FAILURE`.
    pub const MPS_RPC_FAILURE: CUresult = 806;
    /// `CUDA_ERROR_UNKNOWN`.
    pub const UNKNOWN: CUresult = 999;
}

/// One device a process can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// What `cuDeviceGetName` says.
    pub name: String,
    /// Its memory.
    pub memory_bytes: u64,
    /// The GPU's index.
    pub gpu: u32,
    /// Its SMs.
    pub sm_count: u32,
    /// Whether an MPS daemon serving the GPU owns it: compute mode `EXCLUSIVE_PROCESS`
    /// with a daemon running (a context must go through a daemon).
    pub mps_pipe_needed: bool,
    /// Whether the GPU takes no context at all (compute mode `PROHIBITED`).
    pub prohibited: bool,
}

/// What the process sees: the devices in CUDA order.
#[derive(Debug)]
struct Loaded {
    devices: Vec<Device>,
}

static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

thread_local! {
    /// The calling thread's current context: the device ordinal plus one, 0 for none.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// An MPS client's context: the daemon it goes through and the limits it got.
#[derive(Clone, Debug)]
struct MpsClient {
    pipe_dir: PathBuf,
    thread_percentage: Option<u8>,
    memory_mib: Option<u64>,
}

/// The MPS client contexts, by the token of [`CURRENT`].
static MPS_CLIENTS: Mutex<Vec<(usize, MpsClient)>> = Mutex::new(Vec::new());

fn mps_client(token: usize) -> Option<MpsClient> {
    MPS_CLIENTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(t, _)| *t == token)
        .map(|(_, c)| c.clone())
}

/// The lower of a server's limit and a client's own: the client's only further
/// constrains (MPS documentation, environment variables).
fn lower<T: Ord + Copy>(server: Option<T>, client: Option<T>) -> Option<T> {
    match (server, client) {
        (Some(s), Some(c)) => Some(s.min(c)),
        (s, c) => s.or(c),
    }
}

fn loaded() -> std::sync::MutexGuard<'static, Option<Loaded>> {
    LOADED.lock().unwrap_or_else(|p| p.into_inner())
}

fn call(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => result::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => result::UNKNOWN,
    }
}

fn put<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: non-null, and cuda.h's contract makes it point at a `T` the caller owns.
    unsafe { out.write(value) };
    Ok(())
}

fn with_device<T>(dev: CUdevice, f: impl FnOnce(&Device) -> T) -> Result<T, CUresult> {
    let l = loaded();
    let l = l.as_ref().ok_or(result::NOT_INITIALIZED)?;
    let i = usize::try_from(dev).map_err(|_| result::INVALID_DEVICE)?;
    l.devices.get(i).map(f).ok_or(result::INVALID_DEVICE)
}

/// The path of this library, from the dynamic loader.
fn own_path() -> Option<PathBuf> {
    // SAFETY: a C struct of pointers: all zero (null) is a value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = cuInit as *const () as *const c_void;
    // SAFETY: dladdr only reads the loader's tables and fills `info`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

/// What `cuInit` finds on the node of `root`: the devices, or the `CUresult` it fails with.
pub fn discover(root: &SimRoot, visible: Option<&str>) -> Result<Vec<Device>, CUresult> {
    let dev = root.dev();
    if !devices::is_char_device(&dev.join("nvidiactl"), NVIDIA_MAJOR, devices::CTL_MINOR) {
        return Err(result::NO_DEVICE);
    }
    if !devices::is_char_device(
        &dev.join("nvidia-uvm"),
        devices::UVM_MAJOR,
        devices::UVM_MINOR,
    ) {
        return Err(result::UNKNOWN);
    }
    let state = match load_state(&root.state()) {
        Ok(Some(s)) => s,
        _ => return Err(result::NO_DEVICE),
    };
    let all = enumerate(&state, &dev);
    let devices = match visible {
        None => all,
        Some(v) => pick(&all, v),
    };
    if devices.is_empty() {
        return Err(result::NO_DEVICE);
    }
    Ok(devices)
}

/// Every device the process can reach, in CUDA's default order, one MIG device at most.
fn enumerate(state: &SimState, dev: &Path) -> Vec<Device> {
    let mut out = Vec::new();
    let mut mig_taken = false;
    for g in &state.gpus {
        let Ok(model) = tessera_gpu::find_model(&g.model) else {
            continue;
        };
        if g.lost
            || !devices::is_char_device(
                &dev.join(format!("nvidia{}", g.index)),
                NVIDIA_MAJOR,
                g.index,
            )
        {
            continue;
        }
        let name = model
            .product_names
            .first()
            .cloned()
            .unwrap_or_else(|| model.id.clone());
        let mps_pipe_needed = !g.mps.is_empty() && g.compute_mode == ComputeMode::ExclusiveProcess;
        let prohibited = g.compute_mode == ComputeMode::Prohibited;
        if !g.mig_enabled {
            out.push(Device {
                uuid: g.uuid.clone(),
                name,
                memory_bytes: model.memory_mib << 20,
                sm_count: model.sm_count,
                gpu: g.index,
                mps_pipe_needed,
                prohibited,
            });
            continue;
        }
        let Some(layout) = &model.mig else { continue };
        for gi in &g.instances {
            let Some(profile) = layout.profile(gi.profile_id) else {
                continue;
            };
            let cap = |ci: Option<u32>| {
                let minor = caps::minor(g.index, gi.id, ci);
                devices::is_char_device(
                    &dev.join(format!("nvidia-caps/nvidia-cap{minor}")),
                    CAPS_MAJOR,
                    minor,
                )
            };
            if !cap(None) {
                continue;
            }
            for ci in &gi.compute_instances {
                if mig_taken || !cap(Some(ci.id)) {
                    continue;
                }
                mig_taken = true;
                out.push(Device {
                    uuid: ci.uuid.clone(),
                    name: format!("{name} MIG {}", profile.name),
                    memory_bytes: profile.memory_mib << 20,
                    sm_count: profile.sm_count,
                    gpu: g.index,
                    mps_pipe_needed,
                    prohibited,
                });
            }
        }
    }
    out
}

/// `CUDA_VISIBLE_DEVICES` applied to `all`: each entry an index into `all` or a UUID
/// (a prefix, as CUDA takes); the first entry naming nothing ends the list.
fn pick(all: &[Device], visible: &str) -> Vec<Device> {
    let mut out: Vec<Device> = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        let found = match entry.parse::<usize>() {
            Ok(i) => all.get(i),
            Err(_) if entry.len() > 4 => all.iter().find(|d| d.uuid.starts_with(entry)),
            Err(_) => None,
        };
        match found {
            Some(d) if !out.contains(d) => out.push(d.clone()),
            Some(_) => {}
            None => break,
        }
    }
    out
}

/// Whether an MPS control daemon answers in `pipe_dir`.
pub fn mps_daemon_reachable(pipe_dir: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(pipe_dir.join(crate::mps::SOCKET)) else {
        return false;
    };
    if writeln!(s, "get_server_list").is_err() {
        return false;
    }
    let mut status = String::new();
    BufReader::new(s).read_line(&mut status).is_ok() && status.trim_end() == "OK"
}

/// `cuInit`.
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    call(|| {
        if flags != 0 {
            return Err(result::INVALID_VALUE);
        }
        let mut l = loaded();
        if l.is_some() {
            return Ok(());
        }
        let root = own_path()
            .and_then(|p| SimRoot::of_library(&p))
            .ok_or(result::NO_DEVICE)?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let devices = discover(&root, visible.as_deref())?;
        *l = Some(Loaded { devices });
        Ok(())
    })
}

/// `cuDriverGetVersion`: works before `cuInit`, as CUDA's does.
#[unsafe(no_mangle)]
pub extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    call(|| put(version, CUDA_DRIVER_VERSION))
}

/// `cuDeviceGetCount`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    call(|| {
        let n = loaded()
            .as_ref()
            .ok_or(result::NOT_INITIALIZED)?
            .devices
            .len();
        put(count, c_int::try_from(n).map_err(|_| result::UNKNOWN)?)
    })
}

/// `cuDeviceGet`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    call(|| {
        with_device(ordinal, |_| ())?;
        put(device, ordinal)
    })
}

/// `cuDeviceGetName`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    call(|| {
        let text = with_device(dev, |d| d.name.clone())?;
        put_str(name, len, &text)
    })
}

/// Copies `text` (truncated) and a NUL into the caller's buffer of `len` bytes.
fn put_str(buf: *mut c_char, len: c_int, text: &str) -> Result<(), CUresult> {
    let len = usize::try_from(len).map_err(|_| result::INVALID_VALUE)?;
    if buf.is_null() || len == 0 {
        return Err(result::INVALID_VALUE);
    }
    let bytes = text.as_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, n);
        buf.add(n).write(0);
    }
    Ok(())
}

/// The 16 bytes of a `GPU-…`/`MIG-…` UUID.
fn uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
    let hex: String = uuid
        .split_once('-')
        .map_or(uuid, |(_, rest)| rest)
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut out = [0u8; 16];
    if hex.len() != 32 {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// `cuDeviceGetUuid`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    call(|| {
        let text = with_device(dev, |d| d.uuid.clone())?;
        let bytes = uuid_bytes(&text).ok_or(result::UNKNOWN)?;
        put(
            uuid,
            CUuuid {
                bytes: bytes.map(|b| b as c_char),
            },
        )
    })
}

/// `cuDeviceGetUuid_v2` (the same for a device that is not a MIG device's parent).
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    cuDeviceGetUuid(uuid, dev)
}

/// `cuDeviceTotalMem_v2`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    call(|| {
        let total = with_device(dev, |d| d.memory_bytes)?;
        put(bytes, usize::try_from(total).map_err(|_| result::UNKNOWN)?)
    })
}

/// Makes a context on `dev` current, by CUDA's compute-mode and MPS rules.
fn make_context(ctx: *mut CUcontext, dev: CUdevice) -> Result<(), CUresult> {
    let (mps, prohibited) = with_device(dev, |d| (d.mps_pipe_needed, d.prohibited))?;
    if prohibited {
        return Err(result::DEVICES_UNAVAILABLE);
    }
    let env = crate::mps::Env::from_process();
    let client = match crate::mps::attach(&env.pipe_dir) {
        Some(server) => {
            let segment = Path::new(crate::mps::DEV_SHM).join(&server.shm_segment);
            if !segment.exists() {
                return Err(result::MPS_CONNECTION_FAILED);
            }
            Some(MpsClient {
                pipe_dir: env.pipe_dir.clone(),
                thread_percentage: lower(server.thread_percentage, env.thread_percentage),
                memory_mib: lower(server.pinned_memory_mib, env.pinned_memory_mib),
            })
        }
        None if mps => return Err(result::DEVICES_UNAVAILABLE),
        None => None,
    };
    let token = usize::try_from(dev).map_err(|_| result::INVALID_DEVICE)? + 1;
    let mut clients = MPS_CLIENTS.lock().unwrap_or_else(|p| p.into_inner());
    clients.retain(|(t, _)| *t != token);
    if let Some(c) = client {
        clients.push((token, c));
    }
    drop(clients);
    put(ctx, std::ptr::without_provenance_mut(token))?;
    CURRENT.with(|c| c.set(token));
    Ok(())
}

/// `cuDevicePrimaryCtxRetain` (made current at once: the probe uses one context).
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    call(|| make_context(ctx, dev))
}

/// `cuCtxCreate_v2`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxCreate_v2(ctx: *mut CUcontext, _flags: c_uint, dev: CUdevice) -> CUresult {
    call(|| make_context(ctx, dev))
}

/// `cuCtxSetCurrent`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    call(|| {
        let token = ctx.addr();
        if token != 0 {
            with_device(
                CUdevice::try_from(token - 1).map_err(|_| result::INVALID_CONTEXT)?,
                |_| (),
            )
            .map_err(|_| result::INVALID_CONTEXT)?;
        }
        CURRENT.with(|c| c.set(token));
        Ok(())
    })
}

/// `cuMemGetInfo_v2`: the current context's device; nothing is allocated.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    call(|| {
        let token = CURRENT.with(Cell::get);
        if token == 0 {
            return Err(result::INVALID_CONTEXT);
        }
        let dev = CUdevice::try_from(token - 1).map_err(|_| result::INVALID_CONTEXT)?;
        let mut bytes =
            with_device(dev, |d| d.memory_bytes).map_err(|_| result::INVALID_CONTEXT)?;
        if let Some(client) = mps_client(token) {
            if !mps_daemon_reachable(&client.pipe_dir) {
                return Err(result::MPS_RPC_FAILURE);
            }
            if let Some(mib) = client.memory_mib {
                bytes = bytes.min(mib << 20);
            }
        }
        let bytes = usize::try_from(bytes).map_err(|_| result::UNKNOWN)?;
        put(free, bytes)?;
        put(total, bytes)
    })
}

/// `CUexecAffinityParam` with its `smCount` member (the only type CUDA defines).
#[repr(C)]
pub struct CUexecAffinityParam {
    /// `CU_EXEC_AFFINITY_TYPE_SM_COUNT` (0).
    pub kind: c_uint,
    /// `param.smCount.val`.
    pub sm_count: c_uint,
}

/// `cuCtxGetExecAffinity`: the SMs the current context may use; an MPS client's is its
/// active thread percentage of the device's SMs, rounded up.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetExecAffinity(param: *mut CUexecAffinityParam, kind: c_uint) -> CUresult {
    call(|| {
        if kind != 0 {
            return Err(result::INVALID_VALUE);
        }
        let token = CURRENT.with(Cell::get);
        if token == 0 {
            return Err(result::INVALID_CONTEXT);
        }
        let dev = CUdevice::try_from(token - 1).map_err(|_| result::INVALID_CONTEXT)?;
        let mut sms = with_device(dev, |d| d.sm_count).map_err(|_| result::INVALID_CONTEXT)?;
        if let Some(client) = mps_client(token) {
            if !mps_daemon_reachable(&client.pipe_dir) {
                return Err(result::MPS_RPC_FAILURE);
            }
            if let Some(p) = client.thread_percentage {
                sms = (sms * u32::from(p)).div_ceil(100);
            }
        }
        put(
            param,
            CUexecAffinityParam {
                kind,
                sm_count: sms,
            },
        )
    })
}

/// The `CUresult` names this library returns.
fn error_name(code: CUresult) -> &'static CStr {
    match code {
        result::SUCCESS => c"CUDA_SUCCESS",
        result::INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
        result::NOT_INITIALIZED => c"CUDA_ERROR_NOT_INITIALIZED",
        result::DEVICES_UNAVAILABLE => c"CUDA_ERROR_DEVICES_UNAVAILABLE",
        result::NO_DEVICE => c"CUDA_ERROR_NO_DEVICE",
        result::INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
        result::INVALID_CONTEXT => c"CUDA_ERROR_INVALID_CONTEXT",
        result::MPS_CONNECTION_FAILED => c"CUDA_ERROR_MPS_CONNECTION_FAILED",
        result::MPS_RPC_FAILURE => c"CUDA_ERROR_MPS_RPC_FAILURE",
        _ => c"CUDA_ERROR_UNKNOWN",
    }
}

/// `cuGetErrorName`.
#[unsafe(no_mangle)]
pub extern "C" fn cuGetErrorName(code: CUresult, name: *mut *const c_char) -> CUresult {
    call(|| put(name, error_name(code).as_ptr()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(uuid: &str) -> Device {
        Device {
            uuid: uuid.into(),
            name: "x".into(),
            memory_bytes: 1,
            sm_count: 1,
            gpu: 0,
            mps_pipe_needed: false,
            prohibited: false,
        }
    }

    #[test]
    fn visible_devices_pick_order_and_stop_at_an_unknown_entry() {
        let all = [
            dev("GPU-aaaa1111"),
            dev("GPU-bbbb2222"),
            dev("MIG-cccc3333"),
        ];
        let uuids = |v: &str| {
            pick(&all, v)
                .into_iter()
                .map(|d| d.uuid)
                .collect::<Vec<_>>()
        };
        assert_eq!(uuids("1,0"), ["GPU-bbbb2222", "GPU-aaaa1111"]);
        assert_eq!(uuids("MIG-cccc3333"), ["MIG-cccc3333"]);
        assert_eq!(uuids("0,7,1"), ["GPU-aaaa1111"]);
        assert!(uuids("GPU-zzzz").is_empty());
    }

    #[test]
    fn a_client_limit_only_lowers_the_servers() {
        assert_eq!(lower(Some(25), Some(50)), Some(25));
        assert_eq!(lower(Some(50), Some(25)), Some(25));
        assert_eq!(lower(Some(25), None), Some(25));
        assert_eq!(lower(None, Some(25)), Some(25));
        assert_eq!(lower::<u8>(None, None), None);
    }

    #[test]
    fn uuids_become_their_16_bytes() {
        let b = uuid_bytes("GPU-01234567-89ab-cdef-0123-456789abcdef").unwrap();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[15], 0xef);
        assert!(uuid_bytes("GPU-short").is_none());
    }
}
