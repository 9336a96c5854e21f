//! MIG operations of the simulated backend: the geometry helpers ([`crate::geometry`]
//! occupancy, placement errors, instance conversion) and the bodies of the MIG methods of
//! [`GpuBackend`](crate::backend::GpuBackend), run under the lock by `SimBackend::run`.

use super::{SimComputeInstance, SimGpu, SimGpuInstance, inner::Inner};
use crate::{
    backend::{ComputeInstance, ErrorKind, MigInstance, MigModeChange},
    catalog::{GpuModel, MigLayout, find_model},
    geometry::{Occupancy, Placement, PlacementError},
};

pub(super) fn model_of(gpu: &SimGpu) -> Result<&'static GpuModel, ErrorKind> {
    find_model(&gpu.model).map_err(|e| ErrorKind::InvalidArgument(e.to_string()))
}

pub(super) fn layout_of(gpu: &SimGpu) -> Result<&'static MigLayout, ErrorKind> {
    model_of(gpu)?
        .mig
        .as_ref()
        .ok_or_else(|| ErrorKind::NotSupported(format!("{} has no MIG", gpu.model)))
}

pub(super) fn occupancy_of(gpu: &SimGpu, layout: &MigLayout) -> Result<Occupancy, ErrorKind> {
    let mut occ = Occupancy::new();
    for gi in &gpu.instances {
        let pl = Placement {
            profile_id: gi.profile_id,
            start: gi.start,
        };
        occ.place(layout, pl, gi.id)?;
    }
    Ok(occ)
}

pub(super) fn placement_error(e: PlacementError) -> ErrorKind {
    match e {
        PlacementError::UnknownProfile(_) | PlacementError::InvalidStart { .. } => {
            ErrorKind::Placement(e)
        }
        // NVML answers an occupied placement or a full profile with
        // NVML_ERROR_INSUFFICIENT_RESOURCES (gpu-hardware.md §3).
        other => ErrorKind::InsufficientResources(other.to_string()),
    }
}

pub(super) fn mig_uuid() -> String {
    format!("MIG-{}", uuid::Uuid::new_v4())
}

pub(super) fn to_instance(gpu: &SimGpu, gi: &SimGpuInstance) -> MigInstance {
    let profile = layout_of(gpu).ok().and_then(|l| l.profile(gi.profile_id));
    MigInstance {
        gpu: gpu.index,
        gpu_instance_id: gi.id,
        profile_id: gi.profile_id,
        profile_name: profile.map(|p| p.name.clone()).unwrap_or_default(),
        start: gi.start,
        size: profile.map(|p| p.memory_slices).unwrap_or_default(),
        compute_instances: gi
            .compute_instances
            .iter()
            .map(|c| ComputeInstance {
                id: c.id,
                uuid: c.uuid.clone(),
            })
            .collect(),
    }
}

pub(super) fn is_idle(gpu: &SimGpu) -> Result<(), ErrorKind> {
    if !gpu.instances.is_empty() {
        return Err(ErrorKind::InUse(format!(
            "{} MIG GPU instance(s) exist",
            gpu.instances.len()
        )));
    }
    if !gpu.mps.is_empty() {
        return Err(ErrorKind::InUse(format!(
            "{} MPS control daemon(s) run",
            gpu.mps.len()
        )));
    }
    Ok(())
}

/// Changes MIG mode, only on an idle GPU; on Ampere the change stays pending until a reset.
pub(super) fn set_mig_mode(
    inner: &mut Inner,
    gpu: u32,
    enabled: bool,
) -> Result<MigModeChange, ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    let model = model_of(g)?;
    if model.mig.is_none() {
        return Err(ErrorKind::NotSupported(format!("{} has no MIG", model.id)));
    }
    is_idle(g)?;
    if model.architecture.mig_toggle_without_reset() {
        g.mig_enabled = enabled;
    }
    g.mig_pending = enabled;
    Ok(MigModeChange {
        current: g.mig_enabled,
        pending: g.mig_pending,
        reset_required: g.mig_enabled != g.mig_pending,
    })
}

/// Resets an idle, resettable GPU, applying a pending MIG mode.
pub(super) fn reset_gpu(inner: &mut Inner, gpu: u32) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    if !g.resettable {
        return Err(ErrorKind::NotSupported(
            "this node cannot reset the GPU (like a cloud VM); a reboot is needed".into(),
        ));
    }
    is_idle(g)?;
    g.mig_enabled = g.mig_pending;
    Ok(())
}

/// The GPU's MIG instances.
pub(super) fn mig_instances(inner: &Inner, gpu: u32) -> Result<Vec<MigInstance>, ErrorKind> {
    let g = inner.gpu(gpu)?;
    Ok(g.instances.iter().map(|gi| to_instance(g, gi)).collect())
}

/// Creates a GPU instance at a placement the geometry allows, with the smallest free id.
pub(super) fn create_gpu_instance(
    inner: &mut Inner,
    gpu: u32,
    profile_id: u32,
    start: u8,
) -> Result<MigInstance, ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    let layout = layout_of(g)?;
    if !g.mig_enabled {
        return Err(ErrorKind::NotSupported("MIG mode is disabled".into()));
    }
    let mut occ = occupancy_of(g, layout)?;
    let id = (1u32..)
        .find(|i| g.instances.iter().all(|gi| gi.id != *i))
        .ok_or_else(|| ErrorKind::InsufficientResources("no GPU-instance id".into()))?;
    occ.place(layout, Placement { profile_id, start }, id)
        .map_err(placement_error)?;
    let gi = SimGpuInstance {
        id,
        profile_id,
        start,
        compute_instances: Vec::new(),
    };
    let out = to_instance(g, &gi);
    g.instances.push(gi);
    Ok(out)
}

/// Creates the one full-size compute instance of a GPU instance.
pub(super) fn create_compute_instance(
    inner: &mut Inner,
    gpu: u32,
    gi: u32,
) -> Result<MigInstance, ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    let pos = g
        .instances
        .iter()
        .position(|i| i.id == gi)
        .ok_or_else(|| ErrorKind::NotFound(format!("no GPU instance {gi}")))?;
    if !g.instances[pos].compute_instances.is_empty() {
        // Tessera creates one compute instance spanning the GPU instance, so a
        // second one has no slices left, as on hardware.
        return Err(ErrorKind::InsufficientResources(format!(
            "GPU instance {gi} already has its full-size compute instance"
        )));
    }
    g.instances[pos].compute_instances.push(SimComputeInstance {
        id: 0,
        uuid: mig_uuid(),
    });
    Ok(to_instance(g, &g.instances[pos]))
}

/// Destroys a compute instance.
pub(super) fn destroy_compute_instance(
    inner: &mut Inner,
    gpu: u32,
    gi: u32,
    ci: u32,
) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    let inst = g
        .instances
        .iter_mut()
        .find(|i| i.id == gi)
        .ok_or_else(|| ErrorKind::NotFound(format!("no GPU instance {gi}")))?;
    let pos = inst
        .compute_instances
        .iter()
        .position(|c| c.id == ci)
        .ok_or_else(|| {
            ErrorKind::NotFound(format!("no compute instance {ci} in GPU instance {gi}"))
        })?;
    inst.compute_instances.remove(pos);
    Ok(())
}

/// Destroys a GPU instance that has no compute instance left.
pub(super) fn destroy_gpu_instance(inner: &mut Inner, gpu: u32, gi: u32) -> Result<(), ErrorKind> {
    let g = inner.gpu_mut(gpu)?;
    let pos = g
        .instances
        .iter()
        .position(|i| i.id == gi)
        .ok_or_else(|| ErrorKind::NotFound(format!("no GPU instance {gi}")))?;
    let cis = g.instances[pos].compute_instances.len();
    if cis > 0 {
        return Err(ErrorKind::InUse(format!(
            "GPU instance {gi} still has {cis} compute instance(s); destroy them first"
        )));
    }
    g.instances.remove(pos);
    Ok(())
}
