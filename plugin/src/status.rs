//! `GpuNode.status`: what the plugin observes on its node's hardware.
//!
//! Written with server-side apply under the field manager `tessera-plugin`, so it never
//! touches the operator's `spec`. The plugin creates the `GpuNode` (owned by the Node) when
//! the operator has not yet, so a node's status is visible from its first second. Writes
//! are skipped when nothing changed, and `lastTransitionTime` only moves when a condition
//! flips, so status writes never cause churn.

use std::collections::BTreeMap;

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    api::{ObjectMeta, Patch, PostParams},
};
use serde_json::json;
use tessera_api::{
    GpuNode, GpuNodeSpec, GpuNodeStatus,
    conditions::{reasons, types},
    constants::PLUGIN_FIELD_MANAGER,
    gpunode::{
        ClaimRef, GpuHealth, GpuState, InstanceOrigin, MigInstanceState, MpsClientState, MpsState,
    },
    policy::SharingStrategy,
};
use tessera_gpu::backend::{GpuInfo, MigInstance};
use tessera_kit::client::apply_params;

use crate::{
    checkpoint::{Checkpoint, DeviceKind},
    slices::GpuOffer,
    state::NodeGpus,
};

/// Health of one GPU as the plugin tracks it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuHealthState {
    /// False after a fatal fault.
    pub healthy: bool,
    /// Why, when unhealthy.
    pub message: Option<String>,
}

/// Everything the status is computed from.
pub struct StatusInput<'a> {
    /// The GPUs.
    pub hw: &'a NodeGpus,
    /// Live MIG instances per GPU.
    pub live: &'a BTreeMap<u32, Vec<MigInstance>>,
    /// Prepared claims.
    pub checkpoint: &'a Checkpoint,
    /// What each GPU offers (same order as `hw.gpus`).
    pub offers: &'a [GpuOffer],
    /// Health per GPU (absent: healthy).
    pub health: &'a BTreeMap<u32, GpuHealthState>,
    /// Whether the MPS control daemon of each MPS GPU runs, as the backend says.
    pub mps_running: &'a BTreeMap<u32, bool>,
    /// `GpuNode.metadata.generation` the offers were resolved from.
    pub observed_generation: Option<i64>,
    /// Problems publishing: fields the API server dropped.
    pub problems: &'a [String],
    /// Parts of the spec that could not apply to a GPU (reported in `Applied`).
    pub config_warnings: &'a [String],
    /// Parts of GPUs not offered because MIG instances Tessera did not create hold them
    /// (reported in `Applied`).
    pub unavailable: &'a [String],
    /// GPUs whose live MIG instances do not fit the model of their geometry (reported in
    /// `Ready`): they offer no partitions.
    pub geometry: &'a [String],
    /// What the GPUs could not yet hold ahead of claims: a static layout not complete, a
    /// MIG mode change waiting for a reset (reported in `Applied`).
    pub holding: &'a crate::driver::HoldReport,
}

/// Computes the status (pure).
pub fn compute(input: &StatusInput<'_>, previous: &[Condition]) -> GpuNodeStatus {
    let gpus: Vec<GpuState> = input
        .hw
        .gpus
        .iter()
        .zip(input.offers)
        .map(|(info, offer)| gpu_state(input, info, offer))
        .collect();
    let mut mix: BTreeMap<&'static str, u32> = BTreeMap::new();
    for g in &gpus {
        if let Some(s) = g.strategy {
            *mix.entry(s.as_str()).or_default() += 1;
        }
    }
    let mig_total: usize = gpus.iter().map(|g| g.instances.len()).sum();
    let unhealthy = gpus
        .iter()
        .filter(|g| g.health != GpuHealth::Healthy)
        .count();
    let condition = |(kind, status, reason, message): (&str, bool, &str, String)| {
        condition(
            kind,
            status,
            reason,
            &message,
            input.observed_generation,
            previous,
        )
    };
    GpuNodeStatus {
        observed_generation: input.observed_generation,
        conditions: vec![
            condition(ready_condition(input, &gpus)),
            condition(applied_condition(input)),
        ],
        gpu_count: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
        gpus,
        strategy_mix: Some(
            mix.iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        mig_instances: u32::try_from(mig_total).unwrap_or(u32::MAX),
        unhealthy_gpus: u32::try_from(unhealthy).unwrap_or(u32::MAX),
    }
}

/// A condition before it meets the previous one: type, status, reason, message.
type ConditionParts = (&'static str, bool, &'static str, String);

/// `Ready`: the first of dropped fields, an unexpected geometry, unhealthy GPUs; else all
/// GPUs advertised.
fn ready_condition(input: &StatusInput<'_>, gpus: &[GpuState]) -> ConditionParts {
    let unhealthy = gpus
        .iter()
        .filter(|g| g.health == GpuHealth::Unhealthy)
        .count();
    if !input.problems.is_empty() {
        (
            types::READY,
            false,
            reasons::FIELDS_DROPPED,
            input.problems.join("; "),
        )
    } else if !input.geometry.is_empty() {
        (
            types::READY,
            false,
            reasons::UNEXPECTED_GEOMETRY,
            input.geometry.join("; "),
        )
    } else if unhealthy > 0 {
        (
            types::READY,
            false,
            reasons::GPU_UNHEALTHY,
            format!("{unhealthy} GPU(s) reported a fault; their devices are tainted"),
        )
    } else {
        (
            types::READY,
            true,
            reasons::AS_EXPECTED,
            format!("{} GPU(s) advertised", gpus.len()),
        )
    }
}

/// `Applied`: the first of spec entries that cannot apply and foreign instances; else the
/// devices follow the spec.
fn applied_condition(input: &StatusInput<'_>) -> ConditionParts {
    if !input.config_warnings.is_empty() {
        (
            types::APPLIED,
            false,
            reasons::CONFIG_NOT_APPLICABLE,
            input.config_warnings.join("; "),
        )
    } else if !input.holding.pending_reset.is_empty() {
        (
            types::APPLIED,
            false,
            reasons::MIG_MODE_PENDING_RESET,
            joined(&input.holding.pending_reset),
        )
    } else if !input.holding.incomplete.is_empty() {
        (
            types::APPLIED,
            false,
            reasons::REPARTITIONING,
            joined(&input.holding.incomplete),
        )
    } else if !input.unavailable.is_empty() {
        (
            types::APPLIED,
            false,
            reasons::FOREIGN_INSTANCES,
            input.unavailable.join("; "),
        )
    } else {
        (
            types::APPLIED,
            true,
            reasons::AS_EXPECTED,
            "the published devices follow the spec".to_string(),
        )
    }
}

fn joined(by_gpu: &BTreeMap<u32, String>) -> String {
    by_gpu.values().cloned().collect::<Vec<_>>().join("; ")
}

/// One GPU's entry.
fn gpu_state(input: &StatusInput<'_>, info: &GpuInfo, offer: &GpuOffer) -> GpuState {
    let instances = instances_of(input, info.index);
    let health = input.health.get(&info.index);
    GpuState {
        index: info.index,
        uuid: info.uuid.clone(),
        product_name: info.product_name.clone(),
        memory_mi_b: info.memory_mib,
        architecture: Some(info.architecture.as_str().to_string()),
        pci_bus_id: (!info.pci_bus_id.is_empty()).then(|| info.pci_bus_id.clone()),
        mig_capable: info.mig_capable,
        mig_enabled: !instances.is_empty() || info.mig_enabled,
        mig_pending_reset: info.mig_pending != info.mig_enabled,
        strategy: Some(strategy_of(offer)),
        mps: matches!(offer, GpuOffer::Mps { .. }).then(|| MpsState {
            daemon_running: input.mps_running.get(&info.index).copied().unwrap_or(false),
            clients: mps_clients_of(input.checkpoint, info.index),
        }),
        instances,
        prepared_claims: prepared_on(input.checkpoint, info.index),
        health: match health {
            Some(h) if !h.healthy => GpuHealth::Unhealthy,
            _ => GpuHealth::Healthy,
        },
        health_message: health.and_then(|h| h.message.clone()),
    }
}

/// The live MIG instances of a GPU, each with the claim using it and who made it.
fn instances_of(input: &StatusInput<'_>, gpu: u32) -> Vec<MigInstanceState> {
    let Some(live) = input.live.get(&gpu) else {
        return Vec::new();
    };
    live.iter()
        .map(|i| {
            let owner = input
                .checkpoint
                .mig_owner(gpu, i.start, i.profile_id)
                .map(claim_ref);
            let held = input
                .checkpoint
                .held(gpu, i.start, i.profile_id)
                .filter(|h| {
                    h.created
                        .as_ref()
                        .is_some_and(|m| Some(m.uuid.as_str()) == i.uuid())
                });
            let ours = held.map_or(owner.is_some(), |h| !h.adopted);
            MigInstanceState {
                profile: i.profile_name.clone(),
                placement_start: u32::from(i.start),
                placement_size: u32::from(i.size),
                uuid: i.uuid().unwrap_or_default().to_string(),
                gpu_instance_id: i.gpu_instance_id,
                compute_instance_id: i.compute_instances.first().map_or(0, |c| c.id),
                origin: if ours {
                    InstanceOrigin::Tessera
                } else {
                    InstanceOrigin::External
                },
                claim: owner,
                static_layout: held.is_some(),
            }
        })
        .collect()
}

/// The MPS clients prepared on a GPU, with their limits.
fn mps_clients_of(cp: &Checkpoint, gpu: u32) -> Vec<MpsClientState> {
    claims_on(cp, gpu, &|k| matches!(k, DeviceKind::Mps { .. }))
        .into_iter()
        .filter_map(|(r, d)| match &d.kind {
            DeviceKind::Mps {
                active_thread_percentage,
                pinned_memory_limit_mib,
                ..
            } => Some(MpsClientState {
                claim: claim_ref(r),
                active_thread_percentage: *active_thread_percentage,
                pinned_memory_limit_mi_b: *pinned_memory_limit_mib,
            }),
            _ => None,
        })
        .collect()
}

/// The claims the checkpoint holds on a GPU, prepared or with a prepare under way (which
/// holds the GPU as much as a finished one), by namespace and name.
fn prepared_on(cp: &Checkpoint, gpu: u32) -> Vec<ClaimRef> {
    let mut claims: Vec<ClaimRef> = cp
        .claims
        .values()
        .filter(|r| r.devices.iter().any(|d| d.gpu == gpu))
        .map(claim_ref)
        .collect();
    claims.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    claims
}

fn claim_ref(r: &crate::checkpoint::ClaimRecord) -> ClaimRef {
    ClaimRef {
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
    }
}

/// The (claim, device) pairs on one GPU whose kind matches.
fn claims_on<'c>(
    cp: &'c Checkpoint,
    gpu: u32,
    pred: &dyn Fn(&DeviceKind) -> bool,
) -> Vec<(
    &'c crate::checkpoint::ClaimRecord,
    &'c crate::checkpoint::DeviceRecord,
)> {
    cp.claims
        .values()
        .flat_map(|r| r.devices.iter().map(move |d| (r, d)))
        .filter(|(_, d)| d.gpu == gpu && pred(&d.kind))
        .collect()
}

pub fn strategy_of(offer: &GpuOffer) -> SharingStrategy {
    match offer {
        GpuOffer::DynamicMig { .. } | GpuOffer::StaticMig { .. } => SharingStrategy::Mig,
        GpuOffer::Mps { .. } => SharingStrategy::Mps,
        GpuOffer::TimeSlicing { .. } => SharingStrategy::TimeSlicing,
        GpuOffer::Exclusive => SharingStrategy::Exclusive,
    }
}

/// A condition that keeps its `lastTransitionTime` unless its status flips.
fn condition(
    t: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    previous: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let last = previous
        .iter()
        .find(|c| c.type_ == t && c.status == status)
        .map_or_else(
            || Time(Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
    Condition {
        type_: t.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time: last,
    }
}

/// Writes the status of the node's `GpuNode`.
pub struct StatusWriter {
    api: Api<GpuNode>,
    node: String,
    node_uid: String,
    last: Option<GpuNodeStatus>,
}

impl StatusWriter {
    /// A writer for `node`.
    pub fn new(client: Client, node: &str, node_uid: &str) -> Self {
        Self {
            api: Api::all(client),
            node: node.into(),
            node_uid: node_uid.into(),
            last: None,
        }
    }

    /// The node's `GpuNode`, created (empty spec, owned by the Node) when missing.
    pub async fn get_or_create(&self) -> Result<GpuNode, kube::Error> {
        if let Some(g) = self.api.get_opt(&self.node).await? {
            return Ok(g);
        }
        let g = GpuNode {
            metadata: ObjectMeta {
                name: Some(self.node.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node.clone(),
                    uid: self.node_uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            spec: GpuNodeSpec::default(),
            status: None,
        };
        match self.api.create(&PostParams::default(), &g).await {
            Ok(g) => Ok(g),
            // The operator created it in the meantime.
            Err(kube::Error::Api(s)) if s.code == 409 => self.api.get(&self.node).await,
            Err(e) => Err(e),
        }
    }

    /// Forgets what was written, so the next [`write`](Self::write) writes.
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// The conditions of the last status this writer wrote.
    pub fn last_conditions(&self) -> Option<Vec<Condition>> {
        self.last.as_ref().map(|s| s.conditions.clone())
    }

    /// Writes `status` unless it equals the last one written (ignoring condition times).
    pub async fn write(&mut self, status: GpuNodeStatus) -> Result<bool, kube::Error> {
        if self.last.as_ref().is_some_and(|l| same(l, &status)) {
            return Ok(false);
        }
        let patch = json!({
            "apiVersion": GpuNode::api_version(&()),
            "kind": GpuNode::kind(&()),
            "status": status,
        });
        self.api
            .patch_status(
                &self.node,
                &apply_params(PLUGIN_FIELD_MANAGER),
                &Patch::Apply(&patch),
            )
            .await?;
        self.last = Some(status);
        Ok(true)
    }
}

fn same(a: &GpuNodeStatus, b: &GpuNodeStatus) -> bool {
    let strip = |s: &GpuNodeStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests;
