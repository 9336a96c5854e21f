//! The binding-conditions path, plugin side (pure): which claims the scheduler allocated
//! on a latent device of this node, and what becomes of each GPU they landed on.
//!
//! A latent device stands for a shape its GPU does not have (see
//! [`crate::slices::GpuView::latent`]). The scheduler allocates one only when no ready
//! device fits, writes the allocation with the device's binding conditions, and waits
//! for them in PreBind. The GPU's counter set makes every allocation on one GPU belong to
//! one shape, so the plugin can switch the GPU to that shape at once, with no fence: the
//! scheduler cannot be allocating a device of the old shape meanwhile. It then reports
//! [`SWITCHED_CONDITION`] and the scheduler binds the pod. Where the GPU cannot switch
//! (a claim prepared or allocated on the old shape before its devices consumed the
//! counters, a fault, a shape the spec no longer lists) it reports
//! [`SWITCH_FAILED_CONDITION`] instead, and the scheduler frees the allocation and tries
//! again.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_api::constants::{SWITCH_FAILED_CONDITION, SWITCHED_CONDITION};

use crate::slices::GpuOffer;

/// What the claim's `status.devices` says of its latent device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// Neither condition is true yet.
    Nothing,
    /// The GPU was switched.
    Switched,
    /// The GPU could not be switched.
    Failed,
}

/// One claim allocated on a latent device of this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatentClaim {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (the condition write is for this claim, not a namesake).
    pub uid: String,
    /// The GPU.
    pub gpu: u32,
    /// The allocated device.
    pub device: String,
    /// The allocation's share of a device that takes several (an MPS share).
    pub share_id: Option<String>,
    /// When the scheduler allocated it: a claim allocated again after a failed verdict
    /// is a new question.
    pub allocated_at: Option<String>,
    /// What its status says.
    pub reported: Reported,
}

impl LatentClaim {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// This allocation of this device: what a verdict answers.
    pub fn allocation(&self) -> (String, String, String) {
        (
            self.uid.clone(),
            self.device.clone(),
            self.allocated_at.clone().unwrap_or_default(),
        )
    }
}

/// The claims allocated on devices of `driver` in `pool` with binding conditions (one
/// entry per such device), leaving out claims being deleted.
pub fn latent_claims<'c>(
    claims: impl IntoIterator<Item = &'c ResourceClaim>,
    driver: &str,
    pool: &str,
) -> Vec<LatentClaim> {
    let mut out = Vec::new();
    for c in claims {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        for r in tessera_api::claims::allocated_devices(c) {
            if r.driver != driver
                || r.pool != pool
                || r.binding_conditions.as_ref().is_none_or(Vec::is_empty)
            {
                continue;
            }
            let Ok(name) = tessera_gpu::naming::parse_device_name(&r.device) else {
                continue;
            };
            let conditions = c
                .status
                .as_ref()
                .and_then(|s| s.devices.as_ref())
                .into_iter()
                .flatten()
                .find(|d| {
                    d.driver == r.driver
                        && d.pool == r.pool
                        && d.device == r.device
                        && d.share_id == r.share_id
                })
                .and_then(|d| d.conditions.clone())
                .unwrap_or_default();
            let is_true = |t: &str| {
                conditions
                    .iter()
                    .any(|c| c.type_ == t && c.status == "True")
            };
            let reported = if is_true(SWITCH_FAILED_CONDITION) {
                Reported::Failed
            } else if is_true(SWITCHED_CONDITION) {
                Reported::Switched
            } else {
                Reported::Nothing
            };
            out.push(LatentClaim {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                name: c.metadata.name.clone().unwrap_or_default(),
                uid: c.metadata.uid.clone().unwrap_or_default(),
                gpu: name.gpu(),
                device: r.device.clone(),
                share_id: r.share_id.clone(),
                allocated_at: c
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .and_then(|a| a.allocation_timestamp.as_ref())
                    .map(|t| t.0.to_string()),
                reported,
            });
        }
    }
    out
}

/// One GPU as the decision sees it.
#[derive(Clone, Debug)]
pub struct GpuSide<'a> {
    /// What it publishes now, with the device names of that offer.
    pub applied: Option<(&'a GpuOffer, Vec<String>)>,
    /// The shapes it may be switched to now, with their device names, in order.
    pub candidates: Vec<(&'a GpuOffer, Vec<String>)>,
    /// Claims allocated on it, as `namespace/name`.
    pub allocated: Vec<String>,
    /// Claims prepared for it whose allocation is gone (their unprepare is on its way),
    /// as `namespace/name`.
    pub unpreparing: Vec<String>,
    /// Whether it is healthy.
    pub healthy: bool,
}

/// What becomes of one GPU with latent claims.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Switch the GPU to this offer now.
    pub switch_to: Option<GpuOffer>,
    /// Claims whose device the GPU now offers ready (after the switch, if any): report
    /// them switched.
    pub switched: Vec<LatentClaim>,
    /// Claims the GPU cannot serve, with why: report them failed.
    pub failed: Vec<(LatentClaim, String)>,
}

/// Decides for one GPU. `claims` are its latent claims that have no verdict yet.
pub fn decide(gpu: &GpuSide<'_>, claims: &[LatentClaim]) -> Decision {
    let mut d = Decision::default();
    if claims.is_empty() {
        return d;
    }
    let in_applied = |c: &LatentClaim| {
        gpu.applied
            .as_ref()
            .is_some_and(|(_, names)| names.contains(&c.device))
    };
    // The first claim the GPU does not already serve picks the shape; the counters keep
    // the others on the same one.
    let target = claims.iter().filter(|c| !in_applied(c)).find_map(|c| {
        gpu.candidates
            .iter()
            .find(|(_, names)| names.contains(&c.device))
    });
    let latent_keys: Vec<String> = claims.iter().map(LatentClaim::key).collect();
    let blocking: Vec<&String> = gpu
        .allocated
        .iter()
        .filter(|u| !latent_keys.contains(u))
        .collect();
    let mut serves: Option<&Vec<String>> = gpu.applied.as_ref().map(|(_, n)| n);
    if let Some((offer, names)) = target {
        if !gpu.healthy {
            return fail_all(claims, "the GPU is unhealthy");
        }
        if !blocking.is_empty() {
            let why = format!(
                "the GPU holds claim(s) {} on its present shape",
                blocking
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return fail_all(claims, &why);
        }
        if gpu.unpreparing.iter().any(|u| !latent_keys.contains(u)) {
            // The scheduler has let go of those claims; the kubelet is about to
            // unprepare them, and the next pass decides (the scheduler looks again
            // every few seconds).
            return d;
        }
        d.switch_to = Some((*offer).clone());
        serves = Some(names);
    }
    for c in claims {
        if serves.is_some_and(|n| n.contains(&c.device)) {
            d.switched.push(c.clone());
        } else {
            d.failed.push((
                c.clone(),
                format!(
                    "device {} stands for no shape GPU {} may take now",
                    c.device, c.gpu
                ),
            ));
        }
    }
    d
}

fn fail_all(claims: &[LatentClaim], why: &str) -> Decision {
    Decision {
        switch_to: None,
        switched: Vec::new(),
        failed: claims
            .iter()
            .map(|c| (c.clone(), why.to_string()))
            .collect(),
    }
}

/// The latent claims of each GPU.
pub fn by_gpu(claims: Vec<LatentClaim>) -> BTreeMap<u32, Vec<LatentClaim>> {
    let mut out: BTreeMap<u32, Vec<LatentClaim>> = BTreeMap::new();
    for c in claims {
        out.entry(c.gpu).or_default().push(c);
    }
    out
}

#[cfg(test)]
mod tests;
