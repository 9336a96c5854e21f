//! MPS and compute-mode operations of the simulated backend: the bodies of those methods
//! of [`GpuBackend`](crate::backend::GpuBackend), run under the lock by `SimBackend::run`.

use std::path::Path;

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

/// Why another daemon's server cannot run beside the daemons already on the GPU, if it
/// cannot: in `EXCLUSIVE_PROCESS` mode one process (one MPS server) holds the GPU, so a
/// second daemon's server never gets a context ("all CUDA-capable devices are busy or
/// unavailable"). Several daemons, each serving its own clients with its own limits, need
/// compute mode `DEFAULT`, as MPS on MIG runs one daemon per MIG device (MIG user guide,
/// "MIG with CUDA MPS"). The simulator refuses the second daemon at once, so the mistake
/// surfaces where it was made.
fn beside_others_refused(g: &SimGpu, pipe_dir: &Path) -> Option<ErrorKind> {
    let others = g
        .mps
        .iter()
        .filter(|m| m.config.pipe_dir != pipe_dir)
        .count();
    (others > 0 && g.compute_mode == ComputeMode::ExclusiveProcess).then(|| {
        ErrorKind::InUse(format!(
            "compute mode EXCLUSIVE_PROCESS lets one MPS server hold the GPU and {others} other daemon(s) run; several daemons need compute mode DEFAULT"
        ))
    })
}

/// Starts the MPS control daemon on `config.pipe_dir`; a no-op when it already runs with
/// the same configuration.
pub(super) fn start_mps(
    inner: &mut Inner,
    gpu: u32,
    config: &MpsDaemonConfig,
) -> Result<MpsState, ErrorKind> {
    let pid = inner.state.next_pid;
    let g = inner.gpu_mut(gpu)?;
    match g.mps.iter().find(|m| m.config.pipe_dir == config.pipe_dir) {
        Some(m) if m.config == *config => {
            return Ok(MpsState::Running {
                pid: m.pid,
                config: m.config.clone(),
            });
        }
        Some(_) => {
            return Err(ErrorKind::InUse(format!(
                "an MPS control daemon with another configuration runs on {}; stop it first",
                config.pipe_dir.display()
            )));
        }
        None => {}
    }
    if let Some(refused) = mps_refused(g).or_else(|| beside_others_refused(g, &config.pipe_dir)) {
        return Err(refused);
    }
    g.mps.push(SimMps {
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
/// record of a daemon on the same pipe directory that is gone, which the caller has
/// checked.
pub(super) fn daemon_started(
    inner: &mut Inner,
    gpu: u32,
    pid: u32,
    config: &MpsDaemonConfig,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    if let Some(refused) = mps_refused(g).or_else(|| beside_others_refused(g, &config.pipe_dir)) {
        return Err(refused);
    }
    g.mps.retain(|m| m.config.pipe_dir != config.pipe_dir);
    g.mps.push(SimMps {
        pid,
        config: config.clone(),
    });
    Ok(())
}

/// Sets the defaults (active thread percentage, pinned memory limit) of the daemon on
/// `pipe_dir`, as `set_default_*` commands on its control pipe do.
pub(super) fn set_daemon_defaults(
    inner: &mut Inner,
    gpu: u32,
    pipe_dir: &Path,
    thread_percentage: Option<u8>,
    pinned_memory_limit_mib: Option<u64>,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    let Some(m) = g.mps.iter_mut().find(|m| m.config.pipe_dir == pipe_dir) else {
        return Err(ErrorKind::NotFound(format!(
            "no MPS control daemon runs on GPU {gpu} with pipe directory {}",
            pipe_dir.display()
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

/// Stops the MPS control daemon on `pipe_dir`, if any.
pub(super) fn stop_mps(inner: &mut Inner, gpu: u32, pipe_dir: &Path) -> Result<(), ErrorKind> {
    inner
        .gpu_mut(gpu)?
        .mps
        .retain(|m| m.config.pipe_dir != pipe_dir);
    Ok(())
}

/// The state of the MPS control daemon on `pipe_dir`.
pub(super) fn mps_state(inner: &Inner, gpu: u32, pipe_dir: &Path) -> Result<MpsState, ErrorKind> {
    Ok(
        match inner
            .gpu(gpu)?
            .mps
            .iter()
            .find(|m| m.config.pipe_dir == pipe_dir)
        {
            Some(m) => MpsState::Running {
                pid: m.pid,
                config: m.config.clone(),
            },
            None => MpsState::Stopped,
        },
    )
}

/// Sets the time-slice length, on a full GPU that no MPS daemon shares.
pub(super) fn set_time_slice(
    inner: &mut Inner,
    gpu: u32,
    slice: TimeSlice,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    if slice != TimeSlice::Default {
        if !g.mps.is_empty() {
            return Err(ErrorKind::InUse(
                "an MPS control daemon runs on this GPU; MPS and time-slicing cannot share a GPU"
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

/// Sets the GPU's compute mode; `EXCLUSIVE_PROCESS` only while at most one MPS daemon
/// runs, since it lets one server hold the GPU (see [`beside_others_refused`]).
pub(super) fn set_compute_mode(
    inner: &mut Inner,
    gpu: u32,
    mode: ComputeMode,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    if mode == ComputeMode::ExclusiveProcess && g.mps.len() > 1 {
        return Err(ErrorKind::InUse(format!(
            "{} MPS control daemons run; EXCLUSIVE_PROCESS would leave all but one server without the GPU",
            g.mps.len()
        )));
    }
    g.compute_mode = mode;
    Ok(())
}
