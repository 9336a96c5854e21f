//! MPS and compute-mode operations of the simulated backend: the bodies of those methods
//! of [`GpuBackend`](crate::backend::GpuBackend), run under the lock by `SimBackend::run`.

use super::{SimGpu, SimMps, inner::Inner};
use crate::backend::{ComputeMode, ErrorKind, MpsDaemonConfig, MpsState, TimeSlice};

/// Why an MPS server cannot run on the GPU, if it cannot. With MIG mode on, CUDA
/// enumerates only MIG devices: "without creating GPU instances (and corresponding compute
/// instances), CUDA workloads cannot be run on the GPU" (MIG user guide), and "the MPS
/// server will fail to start if incompatible devices are visible after the application of
/// CUDA_VISIBLE_DEVICES" (MPS documentation, environment variables). A daemon for the
/// whole GPU would accept clients whose server never starts; the simulator refuses it at
/// once so the mistake surfaces where it was made.
fn mps_refused(g: &SimGpu) -> Option<ErrorKind> {
    if g.time_slice != TimeSlice::Default {
        return Some(ErrorKind::InUse(
            "the GPU is shared by time-slicing; MPS and time-slicing cannot share a GPU".into(),
        ));
    }
    if g.mig_enabled {
        return Some(ErrorKind::NotSupported(
            "MIG mode is on: CUDA sees only the GPU's MIG devices, so an MPS server for the whole GPU cannot start; turn MIG mode off first".into(),
        ));
    }
    None
}

/// Starts the MPS control daemon; a no-op when it already runs with the same configuration.
pub(super) fn start_mps(
    inner: &mut Inner,
    gpu: u32,
    config: &MpsDaemonConfig,
) -> Result<MpsState, ErrorKind> {
    let pid = inner.state.next_pid;
    let g = inner.gpu_mut(gpu)?;
    match &g.mps {
        Some(m) if m.config == *config => {
            return Ok(MpsState::Running {
                pid: m.pid,
                config: m.config.clone(),
            });
        }
        Some(_) => {
            return Err(ErrorKind::InUse(
                "MPS is running with another configuration; stop it first".into(),
            ));
        }
        None => {}
    }
    if let Some(refused) = mps_refused(g) {
        return Err(refused);
    }
    g.mps = Some(SimMps {
        pid,
        config: config.clone(),
    });
    inner.state.next_pid += 1;
    Ok(MpsState::Running {
        pid,
        config: config.clone(),
    })
}

/// Records an MPS control daemon that runs as its own process (the simulated driver's
/// `nvidia-cuda-mps-control -f`), under the rules [`start_mps`] applies; it replaces the
/// record of a daemon that is gone, which the caller has checked.
pub(super) fn daemon_started(
    inner: &mut Inner,
    gpu: u32,
    pid: u32,
    config: &MpsDaemonConfig,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    if let Some(refused) = mps_refused(g) {
        return Err(refused);
    }
    g.mps = Some(SimMps {
        pid,
        config: config.clone(),
    });
    Ok(())
}

/// Sets the defaults (active thread percentage, pinned memory limit) of the running
/// daemon, as `set_default_*` commands on its control pipe do.
pub(super) fn set_daemon_defaults(
    inner: &mut Inner,
    gpu: u32,
    thread_percentage: Option<u8>,
    pinned_memory_limit_mib: Option<u64>,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    let Some(m) = &mut g.mps else {
        return Err(ErrorKind::NotFound(format!(
            "no MPS control daemon runs on GPU {gpu}"
        )));
    };
    if thread_percentage.is_some() {
        m.config.default_active_thread_percentage = thread_percentage;
    }
    if pinned_memory_limit_mib.is_some() {
        m.config.default_pinned_memory_limit_mib = pinned_memory_limit_mib;
    }
    Ok(())
}

/// Stops the MPS control daemon, if any.
pub(super) fn stop_mps(inner: &mut Inner, gpu: u32) -> Result<(), ErrorKind> {
    inner.gpu_mut(gpu)?.mps = None;
    Ok(())
}

/// The MPS control daemon's state.
pub(super) fn mps_state(inner: &Inner, gpu: u32) -> Result<MpsState, ErrorKind> {
    Ok(match &inner.gpu(gpu)?.mps {
        Some(m) => MpsState::Running {
            pid: m.pid,
            config: m.config.clone(),
        },
        None => MpsState::Stopped,
    })
}

/// Sets the GPU's compute mode.
/// Sets the time-slice length, on a full GPU that no MPS daemon shares.
pub(super) fn set_time_slice(
    inner: &mut Inner,
    gpu: u32,
    slice: TimeSlice,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    if slice != TimeSlice::Default {
        if g.mps.is_some() {
            return Err(ErrorKind::InUse(
                "the MPS control daemon runs on this GPU; MPS and time-slicing cannot share a GPU"
                    .into(),
            ));
        }
        if g.mig_enabled {
            return Err(ErrorKind::NotSupported(
                "time-slicing applies to full GPUs; MIG mode is on".into(),
            ));
        }
        if g.compute_mode != ComputeMode::Default {
            return Err(ErrorKind::NotSupported(format!(
                "time-slicing needs compute mode Default, the GPU is in {:?}",
                g.compute_mode
            )));
        }
    }
    g.time_slice = slice;
    Ok(())
}

pub(super) fn set_compute_mode(
    inner: &mut Inner,
    gpu: u32,
    mode: ComputeMode,
) -> Result<(), ErrorKind> {
    inner.gpu_mut(gpu)?.compute_mode = mode;
    Ok(())
}
