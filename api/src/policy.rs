//! `GpuSharingPolicy`: how GPUs on matching nodes may be shared.
//!
//! The spec is validated by the API server (CEL rules below), so an invalid combination is
//! refused at `kubectl apply` with a message that says what to fix; the operator can then
//! trust every stored policy's shape and only has to judge it against the hardware.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{defaults, schema};

/// How GPUs on the nodes selected by `nodeSelector` (and, within them, the GPUs selected by
/// `gpuSelector`) may be shared. When several policies select the same GPU, the one with the
/// highest `priority` governs it; equal priorities are reported as `Conflicted`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "tessera.dev",
    version = "v1alpha1",
    kind = "GpuSharingPolicy",
    plural = "gpusharingpolicies",
    shortname = "gsp",
    doc = "How GPUs on matching nodes may be shared: MIG partitions, MPS shares, time-slicing, whole GPUs, or adaptively between them.",
    category = "tessera",
    status = "GpuSharingPolicyStatus",
    printcolumn = r#"{"name":"Strategy","type":"string","jsonPath":".spec.strategy"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority","priority":1}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.matchedNodes","description":"GPU nodes the nodeSelector selects"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".status.matchedGpus","description":"GPUs the policy governs"}"#,
    printcolumn = r#"{"name":"Allocated","type":"string","jsonPath":".status.allocatedPercent","description":"Share of the governed compute and memory slices held by claims"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","description":"Why the policy is or is not Ready"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1,"description":"The Ready condition's message: the GPUs and what to do"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.nodeSelector)",
     "message": "spec.nodeSelector is required: name the nodes, e.g. nodeSelector: {matchLabels: {tessera.dev/pool: inference}}, or write nodeSelector: {} to select every GPU node of the cluster"},
    {"rule": "self.strategy != 'MIG' || has(self.mig)",
     "message": "strategy MIG needs a mig block: add spec.mig (for example mig: {mode: Dynamic})"},
    {"rule": "self.strategy != 'Adaptive' || has(self.adaptive)",
     "message": "strategy Adaptive needs an adaptive block: add spec.adaptive.strategies (for example [MIG, MPS])"},
    {"rule": "!has(self.mig) || self.strategy == 'MIG' || (self.strategy == 'Adaptive' && has(self.adaptive) && 'MIG' in self.adaptive.strategies)",
     "messageExpression": "'spec.mig is set but strategy is ' + self.strategy + ': remove spec.mig or set strategy: MIG'"},
    {"rule": "!has(self.mps) || self.strategy == 'MPS' || (self.strategy == 'Adaptive' && has(self.adaptive) && 'MPS' in self.adaptive.strategies)",
     "messageExpression": "'spec.mps is set but strategy is ' + self.strategy + ': remove spec.mps or set strategy: MPS'"},
    {"rule": "!has(self.timeSlicing) || self.strategy == 'TimeSlicing' || (self.strategy == 'Adaptive' && has(self.adaptive) && 'TimeSlicing' in self.adaptive.strategies)",
     "messageExpression": "'spec.timeSlicing is set but strategy is ' + self.strategy + ': remove spec.timeSlicing or set strategy: TimeSlicing'"},
    {"rule": "!has(self.adaptive) || self.strategy == 'Adaptive'",
     "messageExpression": "'spec.adaptive is set but strategy is ' + self.strategy + ': remove spec.adaptive or set strategy: Adaptive'"}
]))]
pub struct GpuSharingPolicySpec {
    /// Which policy governs a GPU several select: the highest priority. Two or more at the
    /// highest priority are a conflict: each reports `Conflicted` naming the others and the
    /// GPUs, and those GPUs keep the configuration they had until the priorities differ.
    /// Default 0.
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i32,

    /// Nodes this policy applies to, by their labels (`matchLabels`, `matchExpressions`).
    /// Required, so that selecting every GPU is a choice someone wrote down: `{}` selects
    /// every node that runs the Tessera plugin. (A policy stored before this field was
    /// required and without it is read as `{}`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::label_selector")]
    pub node_selector: Option<LabelSelector>,

    /// GPUs on the selected nodes this policy applies to. Omitted: every GPU of those nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_selector: Option<GpuSelector>,

    /// How the selected GPUs are shared: `MIG` (hardware partitions), `MPS` (shares with
    /// enforced thread and memory limits), `TimeSlicing` (shared in turns, no isolation),
    /// `Exclusive` (one claim per whole GPU) or `Adaptive` (the operator moves idle GPUs
    /// between the strategies listed in `adaptive.strategies` as demand changes).
    pub strategy: SharingStrategy,

    /// MIG settings; required when `strategy` is `MIG`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigPolicy>,

    /// MPS settings; optional with strategy `MPS` (defaults apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsPolicy>,

    /// Time-slicing settings; optional with strategy `TimeSlicing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingPolicy>,

    /// Adaptive settings; required when `strategy` is `Adaptive`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptivePolicy>,

    /// When and how a GPU may change shape: only idle GPUs ever are; this says whether a
    /// GPU may be reset and how long a wait for claims may last before it is reported.
    #[serde(default)]
    pub repartition: RepartitionPolicy,
}

/// A sharing strategy for a GPU.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum SharingStrategy {
    /// Hardware partitions (Multi-Instance GPU) on MIG-capable GPUs.
    #[serde(rename = "MIG")]
    Mig,
    /// CUDA Multi-Process Service with per-client thread and memory limits.
    #[serde(rename = "MPS")]
    Mps,
    /// Several claims share the GPU in turns; no memory limits, no fault isolation.
    TimeSlicing,
    /// One claim per whole GPU.
    Exclusive,
    /// The operator picks among `adaptive.strategies` per GPU as demand changes.
    Adaptive,
}

impl SharingStrategy {
    /// The name used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mig => "MIG",
            Self::Mps => "MPS",
            Self::TimeSlicing => "TimeSlicing",
            Self::Exclusive => "Exclusive",
            Self::Adaptive => "Adaptive",
        }
    }
}

/// Selects GPUs on a node. Every listed criterion must match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSelector {
    /// GPU products, each written as NVML names it (`NVIDIA H100 80GB HBM3`), as GPU
    /// feature discovery labels it (`nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3`), or
    /// as Tessera's model id (`h100-80gb`; `kubectl tessera profiles` lists them); case
    /// does not matter. Empty: any product.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 96)), extend("x-kubernetes-list-type" = "set"))]
    pub product_names: Vec<String>,
    /// GPU indices on the node (as NVML numbers them). Empty: any index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(range(min = 0, max = 63)), extend("x-kubernetes-list-type" = "set"))]
    pub indices: Vec<u32>,
}

/// MIG settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.mode != 'Static' || (has(self.layout) && size(self.layout) > 0)",
     "message": "mig.mode Static needs a layout: list the instances every selected GPU holds, e.g. layout: [{profile: 3g.40gb, count: 2}]"},
    {"rule": "self.mode == 'Static' || !has(self.layout) || size(self.layout) == 0",
     "message": "mig.layout is only used with mode Static: remove it or set mig.mode: Static"},
    {"rule": "!has(self.layout) || self.layout.all(a, self.layout.exists_one(b, b.profile == a.profile))",
     "message": "mig.layout lists a profile more than once: give each profile one entry with its count"},
    {"rule": "!has(self.layout) || self.layout.map(e, e.count).sum() <= 7",
     "message": "mig.layout asks for more than 7 instances in all; a GPU holds at most 7 MIG instances"},
    {"rule": "!has(self.layout) || self.layout.map(e, int(e.profile.substring(0, 1)) * e.count).sum() <= 7",
     "message": "mig.layout needs more than 7 compute slices (the digit before g in each profile, times its count); a GPU has 7"},
    {"rule": "!has(self.allowedProfiles) || self.allowedProfiles.all(p, self.allowedProfiles.exists_one(q, q == p))",
     "message": "mig.allowedProfiles lists a profile more than once"}
]))]
pub struct MigPolicy {
    /// `Dynamic` (default): every allowed placement is offered and partitions are created
    /// when a claim is prepared. `Static`: the GPUs hold exactly `layout`, declared up front.
    #[serde(default)]
    pub mode: MigMode,

    /// Profiles claims may get, e.g. `1g.10gb`, `3g.40gb`, `1g.10gb+me`. Empty: every
    /// profile the GPU supports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub allowed_profiles: Vec<MigProfileName>,

    /// (Static mode) the instances each selected GPU holds. Placements are chosen by the
    /// operator; a layout that does not fit the GPU's geometry is reported as `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    pub layout: Vec<MigLayoutEntry>,

    /// Where new partitions go: `Pack` (default) fills already-used GPUs first so whole
    /// GPUs stay free for large requests; `Spread` prefers the emptiest GPU.
    #[serde(default)]
    pub placement: PlacementPolicy,

    /// Whole GPUs per node kept free of MIG partitions, so a request for a full GPU (or a
    /// 7g) can always be met on this node. Default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = 16))]
    pub reserve: u32,
}

/// A MIG profile name such as `1g.10gb`, `3g.40gb` or `1g.10gb+me`. The API server checks
/// its shape; whether the GPU offers it is judged against the hardware by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(transparent)]
pub struct MigProfileName(pub String);

impl JsonSchema for MigProfileName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MigProfileName".into()
    }

    fn inline_schema() -> bool {
        // Inlined so the CRD's structural schema has no `$ref`.
        true
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schema::mig_profile_name(generator)
    }
}

impl MigProfileName {
    /// The profile name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for MigProfileName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// MIG mode of a policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MigMode {
    /// Partitions are created at the placement the scheduler chose when a claim is prepared.
    #[default]
    Dynamic,
    /// The layout is declared up front and kept.
    Static,
}

/// Where new MIG partitions go.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PlacementPolicy {
    /// Fill already-used GPUs first (fewer fragmented GPUs).
    #[default]
    Pack,
    /// Prefer the emptiest GPU (less interference between tenants).
    Spread,
}

/// One line of a static MIG layout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigLayoutEntry {
    /// The MIG profile, e.g. `3g.40gb`.
    pub profile: MigProfileName,
    /// How many instances of the profile each GPU holds.
    #[schemars(range(min = 1, max = 7))]
    pub count: u32,
}

/// MPS settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MpsPolicy {
    /// Most claims sharing one GPU through MPS, from 1 to 48 (the MPS server's client
    /// limit on Volta and newer).
    #[serde(default = "defaults::mps_max_clients")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self >= 1 && self <= 48", "message": "mps.maxClients must be between 1 and 48 (the MPS client limit on Volta and newer)"}
    ]))]
    pub max_clients: u32,

    /// Share of the GPU's threads a client gets when its claim does not request compute
    /// capacity, in percent (1–100). Default: 100 / maxClients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self >= 1 && self <= 100", "message": "mps.defaultActiveThreadPercentage must be between 1 and 100 (a percentage of the GPU's threads)"}
    ]))]
    pub default_active_thread_percentage: Option<i32>,

    /// Pinned device memory a client gets when its claim does not request memory
    /// capacity, as a quantity such as `8Gi`. Default: GPU memory / maxClients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::memory_quantity")]
    pub default_pinned_memory_limit: Option<String>,
}

/// Time-slicing settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicingPolicy {
    /// Length of each claim's turn on the GPU: `Default` leaves the driver's choice.
    #[serde(default)]
    pub interval: TimeSliceInterval,
    /// Most claims sharing one GPU, from 1 to 64.
    #[serde(default = "defaults::time_slicing_max_clients")]
    #[schemars(range(min = 1, max = 64))]
    pub max_clients: u32,
}

impl Default for MpsPolicy {
    fn default() -> Self {
        MpsPolicy {
            max_clients: defaults::MPS_MAX_CLIENTS,
            default_active_thread_percentage: None,
            default_pinned_memory_limit: None,
        }
    }
}

impl Default for TimeSlicingPolicy {
    fn default() -> Self {
        TimeSlicingPolicy {
            interval: TimeSliceInterval::default(),
            max_clients: defaults::TIME_SLICING_MAX_CLIENTS,
        }
    }
}

/// Time-slice length, as `nvidia-smi compute-policy --set-timeslice` names them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TimeSliceInterval {
    /// The driver's default.
    #[default]
    Default,
    /// Short slices: lower latency, more switching overhead.
    Short,
    /// Medium slices.
    Medium,
    /// Long slices: better throughput for batch work.
    Long,
}

/// Adaptive settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!('Adaptive' in self.strategies)", "message": "adaptive.strategies cannot contain Adaptive: list the concrete strategies to move between (MIG, MPS, TimeSlicing, Exclusive)"},
    {"rule": "size(self.strategies) >= 2", "message": "adaptive.strategies needs at least two strategies to move between; with one, set spec.strategy to it instead"},
    {"rule": "self.strategies.all(s, self.strategies.exists_one(t, t == s))", "message": "adaptive.strategies lists a strategy more than once"}
]))]
pub struct AdaptivePolicy {
    /// Strategies an idle GPU may be moved between, most preferred first.
    #[schemars(length(min = 1, max = 4))]
    pub strategies: Vec<SharingStrategy>,
    /// Least time a GPU keeps a shape before it may change again, e.g. `10m`.
    #[serde(default = "defaults::adaptive_cooldown")]
    #[schemars(schema_with = "schema::duration")]
    pub cooldown: String,
    /// Also let the scheduler switch GPUs (Kubernetes 1.36+, KEP-5007 binding conditions):
    /// each GPU past its cooldown publishes its other strategies as devices with binding
    /// conditions, which the scheduler allocates only when no ready device fits and binds
    /// once the plugin has switched the GPU. Default false: only the operator's planner
    /// moves GPUs, which is faster because the scheduler checks binding conditions every
    /// five seconds (see the README).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub binding_conditions: bool,
}

impl AdaptivePolicy {
    /// `cooldown` as a duration (the default where it is unreadable, which the CRD's
    /// pattern prevents).
    pub fn cooldown_duration(&self) -> std::time::Duration {
        crate::duration::parse(&self.cooldown).unwrap_or(defaults::ADAPTIVE_COOLDOWN)
    }
}

/// When and how a GPU may change shape.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": format!("!has(self.drainTimeout) || self.progressDeadline == '{}' || self.progressDeadline == self.drainTimeout", defaults::progress_deadline()),
     "message": "repartition.drainTimeout is the deprecated name of repartition.progressDeadline: set only progressDeadline"}
]))]
pub struct RepartitionPolicy {
    /// Allow a GPU reset where a mode change needs one (A100/A30 MIG mode). Only idle GPUs
    /// are ever reset. When false, such GPUs report `MigModePendingReset` instead.
    #[serde(default)]
    pub allow_gpu_reset: bool,
    /// How long a GPU may wait for the claims on it to end before the policy reports
    /// `Degraded` with reason `ProgressDeadlineExceeded`, naming the claims, e.g. `15m`.
    /// Nothing is evicted and nothing is given up: the GPU keeps waiting and takes its
    /// new configuration as soon as its last claim ends (as a Deployment's
    /// `progressDeadlineSeconds` reports a stalled rollout without undoing it).
    #[serde(default = "defaults::progress_deadline")]
    #[schemars(schema_with = "schema::duration")]
    pub progress_deadline: String,
    /// Deprecated: the old name of `progressDeadline`, which it overrides when set. It
    /// never drained anything; use `progressDeadline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub drain_timeout: Option<String>,
}

impl Default for RepartitionPolicy {
    fn default() -> Self {
        RepartitionPolicy {
            allow_gpu_reset: false,
            progress_deadline: defaults::progress_deadline(),
            drain_timeout: None,
        }
    }
}

impl RepartitionPolicy {
    /// The progress deadline in force: the deprecated `drainTimeout` where a manifest
    /// still sets it, else `progressDeadline`.
    pub fn progress_deadline_duration(&self) -> std::time::Duration {
        self.drain_timeout
            .as_deref()
            .and_then(crate::duration::parse)
            .or_else(|| crate::duration::parse(&self.progress_deadline))
            .unwrap_or(defaults::PROGRESS_DEADLINE)
    }
}

/// What became of the policy, written by the operator after each pass and recomputed
/// from the cluster each time (nothing in it is history except `lastChanges`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSharingPolicyStatus {
    /// The `metadata.generation` of the spec this status describes; older than the
    /// policy's generation while the operator has not yet acted on an edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The policy's conditions: `Ready` (it governs GPUs and nothing stands in the way;
    /// otherwise its reason says what does), `Progressing` (some GPU is still being
    /// brought to its configuration), `Degraded` (the configuration cannot apply to some
    /// GPUs, or a wait outlived `repartition.progressDeadline`) and `Conflicted` (a
    /// policy of the same priority selects some of its GPUs). Each reason is stable for
    /// tools to match; each message names the GPUs and what to do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// How many nodes with GPUs its `nodeSelector` selects.
    #[serde(default)]
    pub matched_nodes: u32,
    /// How many GPUs the policy governs: selected by it and not by a policy of higher
    /// priority.
    #[serde(default)]
    pub matched_gpus: u32,
    /// How many devices its GPUs publish and how many of those claims hold, per device
    /// type and MIG profile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceUsage>,
    /// The share of the governed GPUs' compute held by claims, in percent (MIG compute
    /// slices, MPS thread percentages and whole GPUs counted alike).
    #[serde(default)]
    pub allocated_compute_percent: u32,
    /// The share of the governed GPUs' memory held by claims, in percent.
    #[serde(default)]
    pub allocated_memory_percent: u32,
    /// `allocatedComputePercent` written for `kubectl get`, e.g. `43%`; absent while the
    /// policy governs no GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_percent: Option<String>,
    /// (Adaptive policies only.) The claims of unschedulable pods that ask for a device
    /// shape one of `adaptive.strategies` offers, grouped by the shape each prefers:
    /// the demand the operator may move idle GPUs for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmet_claims: Vec<UnmetShape>,
    /// (Adaptive policies only.) How many of the governed GPUs have each strategy now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus_by_strategy: Vec<StrategyGpus>,
    /// (Adaptive policies only.) The last GPUs the operator moved between strategies for
    /// waiting claims, newest first, since the operator process started (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub last_changes: Vec<AdaptiveChange>,
}

/// How many governed GPUs have one strategy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StrategyGpus {
    /// The strategy the GPUs have now.
    pub strategy: SharingStrategy,
    /// How many governed GPUs have it.
    pub gpus: u32,
}

/// One GPU an Adaptive policy moved from one strategy to another.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdaptiveChange {
    /// The GPU, as `node/index` (its NVML index on that node).
    pub gpu: String,
    /// The strategy the GPU had before the move.
    pub from: SharingStrategy,
    /// The strategy the GPU was given.
    pub to: SharingStrategy,
    /// How many waiting claims asked for the strategy `to` when the move was decided.
    pub claims: u32,
    /// When the operator decided the move.
    pub time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// How it ended: `Applied` (the plugin runs the GPU as `to`), `HeldBack` (a claim
    /// was allocated on the old shape while the change was on its way, and the GPU
    /// keeps it), `Superseded` (the configuration changed again first) or `TimedOut`;
    /// absent while it is on its way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Seconds from the decision until the plugin ran the GPU as `to`, once `Applied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

/// The waiting claims that ask for one device shape.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnmetShape {
    /// The device shape, e.g. `MIG 1g.10gb`, `MPS share (25%, 4096 MiB)` or `whole GPU`.
    pub shape: String,
    /// How many devices of that shape the waiting claims ask for in all.
    pub devices: u32,
    /// How many waiting claims ask for it.
    pub claims: u32,
}

/// The devices of one kind the governed GPUs publish, and how many claims hold.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceUsage {
    /// The device type, as the DeviceClasses select it: `gpu` (whole), `mig`, `mps` or
    /// `timeslice`.
    #[serde(rename = "type")]
    pub device_type: String,
    /// The MIG profile of `mig` devices, e.g. `1g.10gb`; absent for other types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// How many such devices the GPUs advertise in their ResourceSlices.
    pub published: u32,
    /// How many of them the scheduler has allocated to claims.
    pub allocated: u32,
}
