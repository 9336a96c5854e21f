//! MPS and compute-mode operations of the simulated backend: the bodies of those methods
//! of [`GpuBackend`](crate::backend::GpuBackend), run under the lock by `SimBackend::run`.

use super::{SimMps, inner::Inner};
use crate::backend::{ComputeMode, ErrorKind, MpsDaemonConfig, MpsState};

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
pub(super) fn set_compute_mode(
    inner: &mut Inner,
    gpu: u32,
    mode: ComputeMode,
) -> Result<(), ErrorKind> {
    inner.gpu_mut(gpu)?.compute_mode = mode;
    Ok(())
}
