//! What must hold whatever failed: checked against the simulated hardware, the plugins'
//! checkpoints (read, never repaired: the plugin's own loader moves unreadable files
//! aside, which a checker must not do under a running plugin) and the API.
//!
//! Pure functions of a [`Snapshot`], so each rule is tested without a cluster.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use serde::Deserialize;
use tessera_gpu::backend::sim::SimState;
use tessera_plugin::checkpoint::{ClaimPhase, ClaimRecord, DeviceKind, HeldLayout};

/// One node as the checker sees it.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    /// Node name (the pool).
    pub name: String,
    /// Its hardware.
    pub hardware: Option<SimState>,
    /// Its plugin's claim records, by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// Its static layouts, by GPU index.
    pub layouts: BTreeMap<u32, HeldLayout>,
}

/// Everything the rules look at, read at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The nodes.
    pub nodes: Vec<NodeView>,
    /// Every ResourceClaim.
    pub claims: Vec<ResourceClaim>,
    /// Every Pod.
    pub pods: Vec<Pod>,
    /// Every ResourceSlice.
    pub slices: Vec<ResourceSlice>,
}

/// A broken rule.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "rule")]
pub enum Violation {
    /// A running pod's MIG instance is not on the hardware.
    DestroyedInUse {
        /// Node.
        node: String,
        /// Claim `ns/name`.
        claim: String,
        /// The missing `MIG-…` UUID.
        uuid: String,
    },
    /// One claim is prepared on two nodes.
    PreparedTwice {
        /// Claim UID.
        uid: String,
        /// The nodes.
        nodes: Vec<String>,
    },
    /// Two claims hold the same hardware.
    Overlap {
        /// Node.
        node: String,
        /// The claims.
        claims: [String; 2],
    },
    /// A claim is prepared on devices it was not allocated.
    NotAllocated {
        /// Node.
        node: String,
        /// Claim.
        claim: String,
        /// The device.
        device: String,
    },
    /// A MIG instance no claim and no static layout knows (once the node is quiet).
    Leaked {
        /// Node.
        node: String,
        /// GPU index.
        gpu: u32,
        /// Placement start.
        start: u8,
        /// Profile id.
        profile_id: u32,
    },
    /// A device still carries the reconfiguring fence (once the node is quiet).
    FenceLeft {
        /// Node.
        node: String,
        /// Device.
        device: String,
    },
    /// A GPU serves two shapes at once (a whole GPU beside anything, a MIG partition
    /// beside a shape of the whole GPU, MPS beside time-slicing), in its claims' records or
    /// on its hardware (an MPS daemon on a GPU with MIG mode on or instances, a
    /// time-slice set under an MPS daemon).
    TwoShapes {
        /// Node.
        node: String,
        /// GPU index.
        gpu: u32,
        /// What was found.
        detail: String,
    },
    /// A running pod's claim uses a GPU as a whole (whole, MPS or time-sliced) while the
    /// GPU's MIG mode is on: CUDA sees only MIG devices there, so the pod finds no GPU.
    NonMigOnMigGpu {
        /// Node.
        node: String,
        /// GPU index.
        gpu: u32,
        /// Claim `ns/name`.
        claim: String,
    },
    /// A pod neither runs nor waits visibly for capacity (once quiet).
    PodStuck {
        /// Pod `ns/name`.
        pod: String,
        /// What it shows.
        detail: String,
    },
}

/// Rules that hold at every moment, faults or not.
pub fn always(s: &Snapshot) -> Vec<Violation> {
    let mut out = Vec::new();
    let running = running_claims(s);
    let mut seen: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for n in &s.nodes {
        let completed: Vec<&ClaimRecord> = n
            .claims
            .values()
            .filter(|r| r.phase == ClaimPhase::PrepareCompleted)
            .collect();
        for r in &completed {
            seen.entry(r.uid.as_str()).or_default().push(n.name.clone());
            if running.contains(r.uid.as_str()) {
                for uuid in mig_uuids(r) {
                    let present = n.hardware.as_ref().is_some_and(|h| {
                        h.gpus.iter().any(|g| {
                            g.instances
                                .iter()
                                .any(|gi| gi.compute_instances.iter().any(|c| c.uuid == uuid))
                        })
                    });
                    if !present {
                        out.push(Violation::DestroyedInUse {
                            node: n.name.clone(),
                            claim: format!("{}/{}", r.namespace, r.name),
                            uuid,
                        });
                    }
                }
            }
            if let Some(allocated) = allocated_devices(s, &r.uid) {
                for d in &r.devices {
                    if !allocated.contains(&(d.pool.clone(), d.device.clone())) {
                        out.push(Violation::NotAllocated {
                            node: n.name.clone(),
                            claim: format!("{}/{}", r.namespace, r.name),
                            device: d.device.clone(),
                        });
                    }
                }
            }
        }
        for (i, a) in completed.iter().enumerate() {
            for b in &completed[i + 1..] {
                let clash = a.devices.iter().any(|da| {
                    b.devices
                        .iter()
                        .any(|db| da.overlaps(db, layout_of(n, da.gpu)))
                });
                if clash {
                    out.push(Violation::Overlap {
                        node: n.name.clone(),
                        claims: [
                            format!("{}/{}", a.namespace, a.name),
                            format!("{}/{}", b.namespace, b.name),
                        ],
                    });
                }
            }
        }
    }
    for n in &s.nodes {
        out.extend(two_shapes(n));
        out.extend(non_mig_on_mig_gpus(n, &running));
    }
    for (uid, nodes) in seen {
        if nodes.len() > 1 {
            out.push(Violation::PreparedTwice {
                uid: uid.to_string(),
                nodes,
            });
        }
    }
    out
}

/// The shapes each GPU of a node serves, from its prepared claims and its hardware.
fn two_shapes(n: &NodeView) -> Vec<Violation> {
    let mut shapes: BTreeMap<u32, BTreeSet<&'static str>> = BTreeMap::new();
    for r in n.claims.values() {
        for d in &r.devices {
            let shape = match d.kind {
                DeviceKind::Gpu { .. } => "whole",
                DeviceKind::Mig { .. } => "MIG",
                DeviceKind::Mps { .. } => "MPS",
                DeviceKind::TimeSlice { .. } => "time-sliced",
            };
            shapes.entry(d.gpu).or_default().insert(shape);
        }
    }
    let mut out = Vec::new();
    for (gpu, found) in &shapes {
        if found.len() > 1 {
            out.push(Violation::TwoShapes {
                node: n.name.clone(),
                gpu: *gpu,
                detail: format!(
                    "claims of {} shapes prepared on it",
                    found.iter().copied().collect::<Vec<_>>().join(" and ")
                ),
            });
        }
    }
    if let Some(h) = &n.hardware {
        for g in &h.gpus {
            let detail = if g.mps.is_some() && (g.mig_enabled || !g.instances.is_empty()) {
                Some("an MPS daemon runs while MIG mode is on")
            } else if g.mps.is_some() && g.time_slice != tessera_gpu::backend::TimeSlice::Default {
                Some("an MPS daemon runs on a time-sliced GPU")
            } else {
                None
            };
            if let Some(detail) = detail {
                out.push(Violation::TwoShapes {
                    node: n.name.clone(),
                    gpu: g.index,
                    detail: detail.into(),
                });
            }
        }
    }
    out
}

/// Running pods' claims that use a whole GPU whose MIG mode is on.
fn non_mig_on_mig_gpus(n: &NodeView, running: &BTreeSet<&str>) -> Vec<Violation> {
    let Some(h) = &n.hardware else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for r in n.claims.values() {
        if r.phase != ClaimPhase::PrepareCompleted || !running.contains(r.uid.as_str()) {
            continue;
        }
        for d in &r.devices {
            let whole = !matches!(d.kind, DeviceKind::Mig { .. });
            let mig_on = h.gpus.get(d.gpu as usize).is_some_and(|g| g.mig_enabled);
            if whole && mig_on {
                out.push(Violation::NonMigOnMigGpu {
                    node: n.name.clone(),
                    gpu: d.gpu,
                    claim: format!("{}/{}", r.namespace, r.name),
                });
            }
        }
    }
    out
}

/// Rules for a cluster at rest: no fault in flight and the plugins done with their work.
pub fn at_rest(s: &Snapshot) -> Vec<Violation> {
    let mut out = always(s);
    for n in &s.nodes {
        let Some(h) = &n.hardware else { continue };
        for g in &h.gpus {
            for gi in &g.instances {
                let owned = n.claims.values().any(|r| {
                    r.devices.iter().any(|d| {
                        d.gpu == g.index
                            && matches!(&d.kind, DeviceKind::Mig { start, profile_id, .. }
                                if *start == gi.start && *profile_id == gi.profile_id)
                    })
                });
                let held = n.layouts.get(&g.index).is_some_and(|l| {
                    l.instances
                        .iter()
                        .any(|i| i.start == gi.start && i.profile_id == gi.profile_id)
                });
                if !owned && !held {
                    out.push(Violation::Leaked {
                        node: n.name.clone(),
                        gpu: g.index,
                        start: gi.start,
                        profile_id: gi.profile_id,
                    });
                }
            }
        }
    }
    for slice in &s.slices {
        let node = slice.spec.node_name.clone().unwrap_or_default();
        for d in slice.spec.devices.iter().flatten() {
            let fenced = d
                .taints
                .iter()
                .flatten()
                .any(|t| t.key == tessera_api::constants::RECONFIGURING_TAINT_KEY);
            if fenced {
                out.push(Violation::FenceLeft {
                    node: node.clone(),
                    device: d.name.clone(),
                });
            }
        }
    }
    for p in &s.pods {
        if let Some(detail) = stuck(p) {
            out.push(Violation::PodStuck {
                pod: format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
                detail,
            });
        }
    }
    out
}

/// Why a pod at rest is neither running nor visibly waiting for capacity (a
/// `PodScheduled=False` condition says what it waits for); `None` when it is fine.
fn stuck(p: &Pod) -> Option<String> {
    if p.metadata.deletion_timestamp.is_some() {
        return Some("still terminating".into());
    }
    let status = p.status.as_ref()?;
    match status.phase.as_deref() {
        Some("Running") | Some("Succeeded") | Some("Failed") => None,
        phase => {
            let unschedulable = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False");
            if unschedulable {
                None
            } else {
                Some(format!(
                    "phase {}, {}",
                    phase.unwrap_or("unknown"),
                    status
                        .container_statuses
                        .iter()
                        .flatten()
                        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
    }
}

fn layout_of(n: &NodeView, gpu: u32) -> Option<&'static tessera_gpu::MigLayout> {
    let h = n.hardware.as_ref()?;
    let g = h.gpus.get(gpu as usize)?;
    tessera_gpu::find_model(&g.model).ok()?.mig.as_ref()
}

fn mig_uuids(r: &ClaimRecord) -> Vec<String> {
    r.devices
        .iter()
        .filter_map(|d| match &d.kind {
            DeviceKind::Mig {
                created: Some(id), ..
            } => Some(id.uuid.clone()),
            _ => None,
        })
        .collect()
}

/// UIDs of claims reserved for a running pod that is not being deleted.
fn running_claims(s: &Snapshot) -> BTreeSet<&str> {
    let running: BTreeSet<&str> = s
        .pods
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Running")
        })
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    s.claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|st| st.reserved_for.as_ref())
                .is_some_and(|r| r.iter().any(|r| running.contains(r.uid.as_str())))
        })
        .filter_map(|c| c.metadata.uid.as_deref())
        .collect()
}

/// (pool, device) of Tessera's results in the claim's allocation; `None` when the claim
/// is gone or unallocated (nothing to compare).
fn allocated_devices(s: &Snapshot, uid: &str) -> Option<BTreeSet<(String, String)>> {
    let c = s
        .claims
        .iter()
        .find(|c| c.metadata.uid.as_deref() == Some(uid))?;
    let results = c
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .devices
        .as_ref()?
        .results
        .as_ref()?;
    Some(
        results
            .iter()
            .filter(|r| r.driver == tessera_api::constants::DRIVER_NAME)
            .map(|r| (r.pool.clone(), r.device.clone()))
            .collect(),
    )
}

#[derive(Deserialize)]
struct ClaimFile {
    claim: ClaimRecord,
}

#[derive(Deserialize)]
struct LayoutFile {
    gpu: u32,
    layout: HeldLayout,
}

/// Reads a plugin's checkpoint directory without changing it: files being written (dot files)
/// and files that do not parse (torn) are skipped.
pub fn read_checkpoint(
    checkpoint_dir: &Path,
) -> (BTreeMap<String, ClaimRecord>, BTreeMap<u32, HeldLayout>) {
    let mut claims = BTreeMap::new();
    for text in files(&checkpoint_dir.join("claims")) {
        if let Ok(f) = serde_json::from_str::<ClaimFile>(&text) {
            claims.insert(f.claim.uid.clone(), f.claim);
        }
    }
    let mut layouts = BTreeMap::new();
    for text in files(&checkpoint_dir.join("layouts")) {
        if let Ok(f) = serde_json::from_str::<LayoutFile>(&text) {
            layouts.insert(f.gpu, f.layout);
        }
    }
    (claims, layouts)
}

fn files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.') && name.ends_with(".json")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tessera_gpu::backend::sim::{SimComputeInstance, SimGpu, SimGpuInstance};
    use tessera_plugin::checkpoint::{DeviceRecord, MigIdentity};

    use super::*;

    fn hardware(instances: Vec<SimGpuInstance>) -> SimState {
        SimState {
            version: 1,
            next_pid: 1,
            gpus: vec![SimGpu {
                index: 0,
                uuid: "GPU-0".into(),
                model: "h100-80gb".into(),
                pci_bus_id: String::new(),
                mig_enabled: true,
                mig_pending: true,
                resettable: true,
                compute_mode: Default::default(),
                time_slice: Default::default(),
                mps: None,
                instances,
                lost: false,
            }],
        }
    }

    fn gi(id: u32, start: u8, uuid: &str) -> SimGpuInstance {
        SimGpuInstance {
            id,
            profile_id: 19,
            start,
            compute_instances: vec![SimComputeInstance {
                id: 0,
                uuid: uuid.into(),
            }],
        }
    }

    fn record(uid: &str, start: u8, uuid: &str) -> ClaimRecord {
        ClaimRecord {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
            phase: ClaimPhase::PrepareCompleted,
            devices: vec![DeviceRecord {
                request_names: vec![],
                pool: "n".into(),
                device: format!("mig-1g-{start}"),
                gpu: 0,
                kind: DeviceKind::Mig {
                    profile_id: 19,
                    profile: "1g.10gb".into(),
                    start,
                    size: 1,
                    created: Some(MigIdentity {
                        gpu_instance_id: 1,
                        compute_instance_id: 0,
                        uuid: uuid.into(),
                    }),
                    held: false,
                },
                share_id: None,
                cdi_device_ids: vec![],
            }],
        }
    }

    fn running_pod_with_claim(uid: &str) -> (Pod, ResourceClaim) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {},
            "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]}
        }))
        .unwrap();
        (pod, claim)
    }

    fn node(h: SimState, claims: Vec<ClaimRecord>) -> NodeView {
        NodeView {
            name: "n".into(),
            hardware: Some(h),
            claims: claims.into_iter().map(|r| (r.uid.clone(), r)).collect(),
            layouts: BTreeMap::new(),
        }
    }

    #[test]
    fn a_running_pods_missing_instance_is_destroyed_in_use() {
        let (pod, claim) = running_pod_with_claim("c1");
        let mut s = Snapshot {
            nodes: vec![node(
                hardware(vec![gi(1, 0, "MIG-a")]),
                vec![record("c1", 0, "MIG-a")],
            )],
            claims: vec![claim],
            pods: vec![pod],
            slices: vec![],
        };
        assert_eq!(always(&s), vec![]);
        s.nodes[0].hardware = Some(hardware(vec![]));
        assert!(matches!(
            always(&s).as_slice(),
            [Violation::DestroyedInUse { uuid, .. }] if uuid == "MIG-a"
        ));
    }

    #[test]
    fn instances_no_record_knows_are_leaked_at_rest_only() {
        let s = Snapshot {
            nodes: vec![node(hardware(vec![gi(1, 3, "MIG-x")]), vec![])],
            ..Snapshot::default()
        };
        assert_eq!(always(&s), vec![]);
        assert!(matches!(
            at_rest(&s).as_slice(),
            [Violation::Leaked { start: 3, .. }]
        ));
    }

    #[test]
    fn two_claims_on_one_placement_overlap_and_one_claim_on_two_nodes_is_prepared_twice() {
        let s = Snapshot {
            nodes: vec![node(
                hardware(vec![gi(1, 0, "MIG-a")]),
                vec![record("c1", 0, "MIG-a"), record("c2", 0, "MIG-a")],
            )],
            ..Snapshot::default()
        };
        assert!(
            always(&s)
                .iter()
                .any(|v| matches!(v, Violation::Overlap { .. }))
        );
        let mut other = s.nodes[0].clone();
        other.name = "m".into();
        other.claims.remove("c2");
        let mut s2 = s.clone();
        s2.nodes[0].claims.remove("c2");
        s2.nodes.push(other);
        assert!(
            always(&s2)
                .iter()
                .any(|v| matches!(v, Violation::PreparedTwice { .. }))
        );
    }

    #[test]
    fn a_pod_waiting_without_saying_why_is_stuck() {
        let waiting: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "namespace": "ns"},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .unwrap();
        assert_eq!(stuck(&waiting), None);
        let creating: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True"}]}
        }))
        .unwrap();
        assert!(stuck(&creating).is_some());
    }
    fn shared(uid: &str, kind: DeviceKind) -> ClaimRecord {
        ClaimRecord {
            devices: vec![DeviceRecord {
                device: "gpu-0".into(),
                kind,
                share_id: Some(format!("s-{uid}")),
                ..record(uid, 0, "").devices[0].clone()
            }],
            ..record(uid, 0, "")
        }
    }

    fn mps(uid: &str) -> ClaimRecord {
        shared(
            uid,
            DeviceKind::Mps {
                uuid: "GPU-0".into(),
                active_thread_percentage: 25,
                pinned_memory_limit_mib: 1024,
            },
        )
    }

    #[test]
    fn a_gpu_serving_two_shapes_is_a_violation_in_records_or_hardware() {
        let mut h = hardware(vec![gi(1, 0, "MIG-a")]);
        let s = Snapshot {
            nodes: vec![node(h.clone(), vec![record("c1", 0, "MIG-a"), mps("c2")])],
            ..Snapshot::default()
        };
        assert!(
            always(&s).iter().any(|v| matches!(v, Violation::TwoShapes { detail, .. } if detail.contains("MIG and MPS"))),
            "{:?}",
            always(&s)
        );
        // An MPS daemon on a GPU in MIG mode, whatever the records say.
        h.gpus[0].instances.clear();
        h.gpus[0].mps = Some(tessera_gpu::backend::sim::SimMps {
            pid: 7,
            config: Default::default(),
        });
        let s = Snapshot {
            nodes: vec![node(h.clone(), vec![])],
            ..Snapshot::default()
        };
        assert!(matches!(
            always(&s).as_slice(),
            [Violation::TwoShapes { detail, .. }] if detail.contains("MIG mode is on")
        ));
        h.gpus[0].mig_enabled = false;
        let s = Snapshot {
            nodes: vec![node(h, vec![mps("c2"), mps("c3")])],
            ..Snapshot::default()
        };
        assert_eq!(always(&s), vec![], "shares of one shape");
    }

    #[test]
    fn a_running_pod_on_a_whole_gpu_in_mig_mode_is_a_violation() {
        let (pod, claim) = running_pod_with_claim("c2");
        let s = Snapshot {
            nodes: vec![node(
                hardware(vec![]),
                vec![shared(
                    "c2",
                    DeviceKind::TimeSlice {
                        uuid: "GPU-0".into(),
                    },
                )],
            )],
            claims: vec![claim],
            pods: vec![pod],
            slices: vec![],
        };
        assert!(matches!(
            always(&s).as_slice(),
            [Violation::NonMigOnMigGpu { claim, .. }] if claim == "ns/c2"
        ));
        let mut off = s.clone();
        off.nodes[0].hardware.as_mut().unwrap().gpus[0].mig_enabled = false;
        assert_eq!(always(&off), vec![]);
    }
}
