//! `GpuNode`: one per GPU node, named after the Node.
//!
//! Two writers, two halves: the operator owns `spec` (field manager `tessera-operator`) and
//! says what each GPU should offer; the node's plugin owns `status` (field manager
//! `tessera-plugin`) and says what the hardware holds. Neither writes the other's half.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::{
    MigMode, MigProfileName, MpsPolicy, PlacementPolicy, SharingStrategy, TimeSlicingPolicy,
};

/// What each GPU of a node should offer, as resolved from the `GpuSharingPolicy` objects.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuNode",
    plural = "gpunodes",
    shortname = "gpunode",
    shortname = "gn",
    doc = "One per GPU node: spec is the per-GPU configuration the operator resolved from the policies, status is what the node's plugin observes on the hardware.",
    category = "tessera",
    status = "GpuNodeStatus",
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".status.gpuCount","description":"GPUs on the node"}"#,
    printcolumn = r#"{"name":"Strategies","type":"string","jsonPath":".status.strategyMix","description":"GPUs per strategy the plugin runs them with now"}"#,
    printcolumn = r#"{"name":"MIG Instances","type":"integer","jsonPath":".status.migInstances","description":"MIG instances that exist on the node's GPUs"}"#,
    printcolumn = r#"{"name":"Unhealthy GPUs","type":"integer","jsonPath":".status.unhealthyGpus","description":"GPUs with a fatal fault or unreadable health"}"#,
    printcolumn = r#"{"name":"Applied","type":"string","jsonPath":".status.conditions[?(@.type==\"Applied\")].status","description":"Whether the plugin runs every GPU as the spec says"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","description":"Why the node is or is not Ready"}"#,
    printcolumn = r#"{"name":"Applied Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Applied\")].reason","priority":1,"description":"Why the spec is or is not applied"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1,"description":"The Ready condition's message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeSpec {
    /// Per-GPU configuration. A GPU not listed keeps the plugin's default
    /// (`--default-strategy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["index"]))]
    pub gpus: Vec<GpuConfig>,
}

/// The resolved configuration of one GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.strategy != 'Adaptive'",
     "message": "a GpuNode holds resolved strategies: the operator turns Adaptive into MIG, MPS, TimeSlicing or Exclusive per GPU"},
    {"rule": "self.strategy != 'MIG' || has(self.mig)",
     "message": "strategy MIG needs a mig block"}
]))]
pub struct GpuConfig {
    /// GPU index on the node, as NVML numbers them.
    #[schemars(range(min = 0, max = 63))]
    pub index: u32,
    /// UUID of the GPU the operator resolved this for; the plugin ignores an entry whose
    /// UUID does not match the GPU at `index` (e.g. after a board swap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The strategy this GPU is shared with (never `Adaptive` here).
    pub strategy: SharingStrategy,
    /// The `GpuSharingPolicy` that governs this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The MIG settings; set with strategy MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<GpuMigConfig>,
    /// The MPS settings; set with strategy MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsPolicy>,
    /// The time-slicing settings; set with strategy TimeSlicing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingPolicy>,
    /// The governing policy's `repartition.allowGpuReset`: the plugin may reset this GPU,
    /// when no claim uses it, to apply a MIG mode change that waits for a reset (A100,
    /// A30).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_gpu_reset: bool,
    /// (Adaptive with `bindingConditions`) the strategies this GPU may be switched to when
    /// the scheduler allocates one of their devices: the plugin publishes them with
    /// binding conditions, after every ready device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub alternatives: Vec<GpuShape>,
}

/// A strategy a GPU may be switched to, with its settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.strategy != 'Adaptive'",
     "message": "an alternative is a concrete strategy: MIG, MPS, TimeSlicing or Exclusive"},
    {"rule": "self.strategy != 'MIG' || has(self.mig)",
     "message": "strategy MIG needs a mig block"}
]))]
pub struct GpuShape {
    /// The strategy the GPU may be switched to.
    pub strategy: SharingStrategy,
    /// The MIG settings; set with strategy MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<GpuMigConfig>,
    /// The MPS settings; set with strategy MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsPolicy>,
    /// The time-slicing settings; set with strategy TimeSlicing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingPolicy>,
}

impl GpuConfig {
    /// The configuration the GPU has once switched to `shape` (same GPU, policy and
    /// reset permission; no alternatives of its own).
    pub fn switched_to(&self, shape: &GpuShape) -> GpuConfig {
        GpuConfig {
            strategy: shape.strategy,
            mig: shape.mig.clone(),
            mps: shape.mps.clone(),
            time_slicing: shape.time_slicing.clone(),
            alternatives: Vec::new(),
            ..self.clone()
        }
    }
}

/// MIG configuration of one GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuMigConfig {
    /// `Dynamic` (partitions made when claims are prepared) or `Static` (the
    /// `instances` below, made ahead of claims).
    #[serde(default)]
    pub mode: MigMode,
    /// Profiles to offer; empty means all the GPU supports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub allowed_profiles: Vec<MigProfileName>,
    /// Placement preference the plugin orders devices by.
    #[serde(default)]
    pub placement: PlacementPolicy,
    /// (Static mode) the instances this GPU holds, with the placement the operator chose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub instances: Vec<PlannedInstance>,
}

/// A MIG instance at a fixed placement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedInstance {
    /// The MIG profile, e.g. `3g.40gb`.
    pub profile: MigProfileName,
    /// The first memory slice of the placement.
    #[schemars(range(min = 0, max = 7))]
    pub start: u32,
}

/// What the node's plugin observes on the hardware, written by the plugin whenever it
/// changes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// The `metadata.generation` of the spec the plugin last applied; older than the
    /// GpuNode's generation while the plugin has not yet acted on the operator's edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The node's conditions: `Ready` (every GPU is healthy and published; otherwise the
    /// reason says which fault, geometry or dropped field stands in the way) and
    /// `Applied` (the plugin runs every GPU as its spec says; otherwise the message names
    /// what waits: claims, a reset, instances not made yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Every GPU of the node, by NVML index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuState>,
    /// How many GPUs the node has (for `kubectl get`).
    #[serde(default)]
    pub gpu_count: u32,
    /// How many GPUs run each strategy now, e.g. `MIG:2,MPS:1` (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy_mix: Option<String>,
    /// How many MIG instances exist on the node's GPUs now (for `kubectl get`).
    #[serde(default)]
    pub mig_instances: u32,
    /// How many of the node's GPUs are not healthy: a fatal fault seen, or health
    /// unreadable (for `kubectl get`; `gpus[].healthMessage` says why).
    #[serde(default)]
    pub unhealthy_gpus: u32,
}

/// One GPU as the plugin sees it on the hardware.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuState {
    /// The GPU's index on the node, as NVML numbers them.
    pub index: u32,
    /// The GPU's UUID, `GPU-…`.
    pub uuid: String,
    /// The product name NVML reports, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// The GPU's framebuffer memory, in MiB.
    pub memory_mi_b: u64,
    /// The GPU's architecture, e.g. `Hopper`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// The GPU's PCI bus id, e.g. `0000:3b:00.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// Whether the GPU can be partitioned with MIG.
    pub mig_capable: bool,
    /// Whether MIG mode is on now.
    pub mig_enabled: bool,
    /// Whether a MIG mode change waits for a GPU reset (A100 and A30 need one).
    #[serde(default)]
    pub mig_pending_reset: bool,
    /// The strategy the plugin runs the GPU with now; absent before it applied one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<SharingStrategy>,
    /// The MIG instances that exist on the GPU now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstanceState>,
    /// The MPS control daemon and its clients, when the GPU is shared with MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsState>,
    /// Every claim the plugin has prepared on this GPU or is preparing, whatever the
    /// strategy, until the plugin has unprepared it. A GPU that lists one is in use even
    /// when the scheduler no longer shows an allocation (a pod deleted with `--force` is
    /// gone from the API before its node has released the GPU), so its shape does not
    /// change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepared_claims: Vec<ClaimRef>,
    /// The GPU's health as the driver reports it.
    #[serde(default)]
    pub health: GpuHealth,
    /// Why the GPU is not healthy (an XID, a lost GPU), when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_message: Option<String>,
}

/// A MIG instance that exists on the GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigInstanceState {
    /// The MIG profile, e.g. `1g.10gb`.
    pub profile: String,
    /// The first memory slice the instance occupies.
    pub placement_start: u32,
    /// How many memory slices the instance occupies.
    pub placement_size: u32,
    /// The instance's UUID, `MIG-…`.
    pub uuid: String,
    /// The GPU instance id NVML gave it (a recreated instance may get another).
    pub gpu_instance_id: u32,
    /// The compute instance id NVML gave it inside its GPU instance.
    pub compute_instance_id: u32,
    /// The claim using the instance; absent while none does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimRef>,
    /// Whether Tessera created it (`Tessera`) or found it (`External`, never destroyed).
    pub origin: InstanceOrigin,
    /// Whether the instance belongs to the GPU's static layout: it exists with or without
    /// a claim, and a claim is handed it as it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub static_layout: bool,
}

/// Who created a MIG instance.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum InstanceOrigin {
    /// Created by Tessera, for a claim or for the GPU's static layout.
    #[default]
    Tessera,
    /// Found on the GPU; Tessera reports it and never destroys it.
    External,
}

/// A ResourceClaim, by namespace, name and UID.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID (a claim recreated under the same name has another).
    pub uid: String,
}

/// The MPS state of a GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsState {
    /// Whether the GPU's MPS control daemon runs.
    pub daemon_running: bool,
    /// The claims holding a share, with the limits enforced on each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<MpsClientState>,
}

/// One MPS client: a claim's share of the GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsClientState {
    /// The claim holding the share.
    pub claim: ClaimRef,
    /// The share of the GPU's threads enforced on the client
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), in percent.
    pub active_thread_percentage: u32,
    /// The pinned device memory limit enforced on the client, in MiB.
    pub pinned_memory_limit_mi_b: u64,
}

/// A GPU's health.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GpuHealth {
    /// No fault seen.
    #[default]
    Healthy,
    /// A fault was reported; devices on the GPU are tainted.
    Unhealthy,
    /// Health cannot be read.
    Unknown,
}
