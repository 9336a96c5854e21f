//! Reading a ResourceClaim and turning its allocation into the devices to make.

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use tessera_gpu::naming::{self, DeviceName};

use super::{ClaimError, Driver};
use crate::{
    checkpoint::{DeviceKind, DeviceRecord},
    kubelet::ClaimRef,
    quantity,
    slices::build::capacity,
};

/// Why an allocated device cannot be made on this node.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The device belongs to another node's pool.
    #[error("it is allocated from pool {pool}, but this plugin serves pool {ours}")]
    ForeignPool {
        /// The pool of the allocation.
        pool: String,
        /// Ours.
        ours: String,
    },
    /// The name is not one Tessera publishes.
    #[error("its name is not one Tessera publishes")]
    Name(#[source] naming::NamingError),
    /// The GPU it names is not on this node.
    #[error("it names GPU {0}, which this node does not have")]
    UnknownGpu(u32),
    /// An MPS share's allocation lacks the capacity it consumes.
    #[error(
        "the allocation has no consumed {0} capacity; is the DRAConsumableCapacity feature gate on?"
    )]
    MissingCapacity(&'static str),
    /// A MIG device on a GPU without MIG.
    #[error("it is a MIG device but GPU {0} does not support MIG")]
    NotMigCapable(u32),
    /// The profile is not one of the GPU's.
    #[error("its MIG profile is not one of the GPU's")]
    Profile(#[source] naming::NamingError),
    /// The profile cannot start where the name says.
    #[error("{profile} cannot start at memory slice {start}")]
    BadStart {
        /// Profile name.
        profile: String,
        /// Memory slice.
        start: u8,
    },
}

impl Driver {
    /// Reads the claim the kubelet names and checks it is the same object (UID) and is
    /// allocated, as the Go kubelet-plugin library does before calling a driver.
    pub(super) async fn read_claim(&self, c: &ClaimRef) -> Result<ResourceClaim, ClaimError> {
        let allocated = |claim: &ResourceClaim| {
            claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .is_some()
        };
        if let Some(cached) = self.api.cached(&c.namespace, &c.name)
            && cached.metadata.uid.as_deref() == Some(c.uid.as_str())
            && allocated(&cached)
        {
            // An allocation never changes once written (it can only be removed, and not
            // while the claim is reserved for the pod being started).
            return Ok((*cached).clone());
        }
        let name = || format!("{}/{}", c.namespace, c.name);
        let claim = self
            .api
            .get(&c.namespace, &c.name)
            .await
            .map_err(|source| ClaimError::Read {
                claim: name(),
                source,
            })?
            .ok_or_else(|| ClaimError::Missing { claim: name() })?;
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if uid != c.uid {
            return Err(ClaimError::Replaced {
                claim: name(),
                found: uid.to_string(),
                asked: c.uid.clone(),
            });
        }
        if !allocated(&claim) {
            return Err(ClaimError::NotAllocated { claim: name() });
        }
        Ok(claim)
    }

    /// The devices to make for our driver's results of the claim, without touching
    /// hardware. Every result must name one of this node's devices.
    pub(super) fn plan(&self, claim: &ResourceClaim) -> Result<Vec<DeviceRecord>, ClaimError> {
        let results: Vec<&DeviceRequestAllocationResult> =
            tessera_api::claims::allocated_devices(claim)
                .iter()
                .filter(|r| r.driver == self.state.driver_name())
                .collect();
        if results.is_empty() {
            return Err(ClaimError::NoDevices {
                claim: format!(
                    "{}/{}",
                    claim.metadata.namespace.as_deref().unwrap_or_default(),
                    claim.metadata.name.as_deref().unwrap_or_default()
                ),
                driver: self.state.driver_name().to_string(),
            });
        }
        results
            .into_iter()
            .map(|r| {
                self.plan_device(r).map_err(|source| ClaimError::Plan {
                    device: r.device.clone(),
                    source,
                })
            })
            .collect()
    }

    fn plan_device(&self, r: &DeviceRequestAllocationResult) -> Result<DeviceRecord, PlanError> {
        if r.pool != self.state.node() {
            return Err(PlanError::ForeignPool {
                pool: r.pool.clone(),
                ours: self.state.node().to_string(),
            });
        }
        let name = naming::parse_device_name(&r.device).map_err(PlanError::Name)?;
        let gpu = name.gpu();
        let info = self.gpus().gpu(gpu).ok_or(PlanError::UnknownGpu(gpu))?;
        let kind = match name {
            DeviceName::Gpu { .. } => {
                if r.share_id.is_some() {
                    DeviceKind::TimeSlice {
                        uuid: info.uuid.clone(),
                    }
                } else {
                    DeviceKind::Gpu {
                        uuid: info.uuid.clone(),
                    }
                }
            }
            DeviceName::Mps { .. } => {
                let consumed = r.consumed_capacity.as_ref();
                let get = |k: &str| consumed.and_then(|c| c.get(k)).map(|q| q.0.clone());
                let pct = get(capacity::COMPUTE_PERCENT)
                    .and_then(|q| q.parse::<u32>().ok())
                    .ok_or(PlanError::MissingCapacity(capacity::COMPUTE_PERCENT))?;
                let mib = get(capacity::MEMORY)
                    .and_then(|q| quantity::parse_mib(&q))
                    .ok_or(PlanError::MissingCapacity(capacity::MEMORY))?;
                DeviceKind::Mps {
                    uuid: info.uuid.clone(),
                    active_thread_percentage: pct,
                    pinned_memory_limit_mib: mib,
                }
            }
            DeviceName::Mig {
                profile_label,
                start,
                ..
            } => {
                let layout = self
                    .gpus()
                    .layouts
                    .get(&gpu)
                    .ok_or(PlanError::NotMigCapable(gpu))?;
                let profile = naming::resolve_profile_label(layout, &profile_label)
                    .map_err(PlanError::Profile)?;
                if !profile.starts.contains(start) {
                    return Err(PlanError::BadStart {
                        profile: profile.name.clone(),
                        start,
                    });
                }
                DeviceKind::Mig {
                    profile_id: profile.profile_id,
                    profile: profile.name.clone(),
                    start,
                    size: profile.memory_slices,
                    created: None,
                    held: false,
                }
            }
        };
        Ok(DeviceRecord {
            // The kubelet matches containers by request name without the subrequest part.
            request_names: vec![r.request.split('/').next().unwrap_or_default().to_string()],
            pool: r.pool.clone(),
            device: r.device.clone(),
            gpu,
            kind,
            share_id: r.share_id.clone(),
            cdi_device_ids: vec![],
        })
    }
}
