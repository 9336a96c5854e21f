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
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".status.gpuCount"}"#,
    printcolumn = r#"{"name":"Strategies","type":"string","jsonPath":".status.strategyMix","description":"GPUs per applied strategy"}"#,
    printcolumn = r#"{"name":"MIG","type":"integer","jsonPath":".status.migInstances","description":"Live MIG instances"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
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
    /// MIG settings, with strategy MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<GpuMigConfig>,
    /// MPS settings, with strategy MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsPolicy>,
    /// Time-slicing settings, with strategy TimeSlicing.
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
    /// The strategy.
    pub strategy: SharingStrategy,
    /// MIG settings, with strategy MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<GpuMigConfig>,
    /// MPS settings, with strategy MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsPolicy>,
    /// Time-slicing settings, with strategy TimeSlicing.
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
    /// `Dynamic` or `Static`.
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
    /// MIG profile name.
    pub profile: MigProfileName,
    /// First memory slice of the placement.
    #[schemars(range(min = 0, max = 7))]
    pub start: u32,
}

/// What the node's plugin observes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStatus {
    /// The `metadata.generation` (spec) the plugin last applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and `Applied`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Every GPU of the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuState>,
    /// Number of GPUs (for `kubectl get`).
    #[serde(default)]
    pub gpu_count: u32,
    /// GPUs per applied strategy, e.g. `MIG:2,MPS:1` (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy_mix: Option<String>,
    /// Live MIG instances on the node (for `kubectl get`).
    #[serde(default)]
    pub mig_instances: u32,
}

/// One GPU as the plugin sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuState {
    /// Index on the node.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// NVML product name.
    pub product_name: String,
    /// Framebuffer memory in MiB.
    pub memory_mi_b: u64,
    /// Architecture, e.g. `Hopper`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// PCI bus id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// Whether the GPU supports MIG.
    pub mig_capable: bool,
    /// Whether MIG mode is on now.
    pub mig_enabled: bool,
    /// Whether a MIG mode change waits for a GPU reset (A100/A30).
    #[serde(default)]
    pub mig_pending_reset: bool,
    /// The strategy the plugin applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<SharingStrategy>,
    /// Live MIG instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstanceState>,
    /// MPS daemon state, when the GPU is shared with MPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsState>,
    /// Every claim the plugin has prepared on this GPU or is preparing, whatever the
    /// strategy, until the plugin has unprepared it. A GPU that lists one is in use even
    /// when the scheduler no longer shows an allocation (a pod deleted with `--force` is
    /// gone from the API before its node has released the GPU), so its shape does not
    /// change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepared_claims: Vec<ClaimRef>,
    /// Health as reported by the driver.
    #[serde(default)]
    pub health: GpuHealth,
    /// Why the GPU is unhealthy, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_message: Option<String>,
}

/// A live MIG instance.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigInstanceState {
    /// Profile name.
    pub profile: String,
    /// First memory slice.
    pub placement_start: u32,
    /// Number of memory slices.
    pub placement_size: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
    /// GPU instance id (not stable across destroy/recreate).
    pub gpu_instance_id: u32,
    /// Compute instance id.
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

/// A reference to a ResourceClaim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// UID of the claim.
    pub uid: String,
}

/// MPS state of a GPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsState {
    /// Whether the control daemon runs.
    pub daemon_running: bool,
    /// Claims holding a share, with their enforced limits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<MpsClientState>,
}

/// One MPS client (a claim's share).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsClientState {
    /// The claim.
    pub claim: ClaimRef,
    /// Enforced `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
    pub active_thread_percentage: u32,
    /// Enforced pinned device memory limit in MiB.
    pub pinned_memory_limit_mi_b: u64,
}

/// GPU health.
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
