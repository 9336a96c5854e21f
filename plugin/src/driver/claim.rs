//! Reading a ResourceClaim and turning its allocation into the devices to make.

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use kube::Api;
use tessera_gpu::naming::{self, DeviceName};

use super::{ClaimError, Driver};
use crate::{
    checkpoint::{DeviceKind, DeviceRecord},
    kubelet::ClaimRef,
    quantity,
    slices::build::capacity,
};

impl Driver {
    /// Reads the claim the kubelet names and checks it is the same object (UID) and is
    /// allocated, as the Go kubelet-plugin library does before calling a driver.
    pub(crate) async fn read_claim(&self, c: &ClaimRef) -> Result<ResourceClaim, ClaimError> {
        if let Some(cache) = &self.claim_cache {
            let key = kube::runtime::reflector::ObjectRef::new(&c.name).within(&c.namespace);
            if let Some(cached) = cache.get(&key)
                && cached.metadata.uid.as_deref() == Some(c.uid.as_str())
                && cached
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .is_some()
            {
                // An allocation never changes once written (it can only be removed, and
                // not while the claim is reserved for the pod being started).
                return Ok((*cached).clone());
            }
        }
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let claim = api.get(&c.name).await.map_err(|source| ClaimError::Read {
            claim: format!("{}/{}", c.namespace, c.name),
            source,
        })?;
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if uid != c.uid {
            return Err(ClaimError::Invalid(format!(
                "ResourceClaim {}/{} has UID {uid}, the kubelet asked for {}: the claim was replaced; the kubelet will retry with the new one",
                c.namespace, c.name, c.uid
            )));
        }
        if claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_none()
        {
            return Err(ClaimError::Invalid(format!(
                "ResourceClaim {}/{} is not allocated",
                c.namespace, c.name
            )));
        }
        Ok(claim)
    }

    /// The devices to make for our driver's results of the claim, without touching
    /// hardware. Every result must name one of this node's devices.
    pub(crate) fn plan(&self, claim: &ResourceClaim) -> Result<Vec<DeviceRecord>, ClaimError> {
        let results: Vec<&DeviceRequestAllocationResult> = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .map(|r| r.iter().filter(|r| r.driver == self.driver_name).collect())
            .unwrap_or_default();
        if results.is_empty() {
            return Err(ClaimError::Invalid(format!(
                "ResourceClaim {}/{} has no device of driver {} in its allocation",
                claim.metadata.namespace.as_deref().unwrap_or_default(),
                claim.metadata.name.as_deref().unwrap_or_default(),
                self.driver_name
            )));
        }
        results.into_iter().map(|r| self.plan_device(r)).collect()
    }

    fn plan_device(&self, r: &DeviceRequestAllocationResult) -> Result<DeviceRecord, ClaimError> {
        if r.pool != self.node {
            return Err(ClaimError::Invalid(format!(
                "device {} is allocated from pool {}, but this plugin serves pool {}",
                r.device, r.pool, self.node
            )));
        }
        let name = naming::parse_device_name(&r.device)
            .map_err(|e| ClaimError::Invalid(format!("device {}: {e}", r.device)))?;
        let gpu = name.gpu();
        let info = self.hw.gpu(gpu).ok_or_else(|| {
            ClaimError::Invalid(format!(
                "device {} names GPU {gpu}, which this node does not have",
                r.device
            ))
        })?;
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
                    .ok_or_else(|| {
                        ClaimError::Invalid(format!(
                            "MPS device {} has no consumed {} capacity in the allocation; is DRAConsumableCapacity on?",
                            r.device,
                            capacity::COMPUTE_PERCENT
                        ))
                    })?;
                let mib = get(capacity::MEMORY)
                    .and_then(|q| quantity::parse_mib(&q))
                    .ok_or_else(|| {
                        ClaimError::Invalid(format!(
                            "MPS device {} has no consumed memory capacity in the allocation",
                            r.device
                        ))
                    })?;
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
                let layout = self.hw.layouts.get(&gpu).ok_or_else(|| {
                    ClaimError::Invalid(format!(
                        "device {} is a MIG device but GPU {gpu} does not support MIG",
                        r.device
                    ))
                })?;
                let profile = naming::resolve_profile_label(layout, &profile_label)
                    .map_err(|e| ClaimError::Invalid(format!("device {}: {e}", r.device)))?;
                if !profile.starts.contains(start) {
                    return Err(ClaimError::Invalid(format!(
                        "device {}: {} cannot start at memory slice {start}",
                        r.device, profile.name
                    )));
                }
                DeviceKind::Mig {
                    profile_id: profile.profile_id,
                    profile: profile.name.clone(),
                    start,
                    size: profile.memory_slices,
                    created: None,
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
