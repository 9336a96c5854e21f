//! Every name another component or a user's manifest must agree on, in one place.

/// API group of Tessera's custom resources.
pub const GROUP: &str = "tessera.dev";
/// The only served version.
pub const VERSION: &str = "v1alpha1";
/// DRA driver name: ResourceSlices, DeviceClass selectors, CDI kind and attribute domain.
pub const DRIVER_NAME: &str = "gpu.tessera.dev";

/// Server-side-apply field manager of the operator (`GpuNode.spec`, policy status).
pub const OPERATOR_FIELD_MANAGER: &str = "tessera-operator";
/// Server-side-apply field manager of the node plugin (`GpuNode.status`, slices, claim status).
pub const PLUGIN_FIELD_MANAGER: &str = "tessera-plugin";

/// DeviceClass for whole GPUs.
pub const DEVICE_CLASS_GPU: &str = "gpu.tessera.dev";
/// DeviceClass for MIG partitions (select a profile with the `profile` attribute).
pub const DEVICE_CLASS_MIG: &str = "mig.tessera.dev";
/// DeviceClass for MPS shares (request compute and memory capacity).
pub const DEVICE_CLASS_MPS: &str = "mps.tessera.dev";
/// DeviceClass for time-sliced GPUs.
pub const DEVICE_CLASS_TIMESLICE: &str = "timeslice.tessera.dev";

/// Values of the `type` device attribute the DeviceClasses select on.
pub mod device_type {
    /// A whole GPU.
    pub const GPU: &str = "gpu";
    /// A MIG partition at one placement.
    pub const MIG: &str = "mig";
    /// An MPS share of one GPU.
    pub const MPS: &str = "mps";
    /// A time-sliced GPU.
    pub const TIMESLICE: &str = "timeslice";
}

/// Values of the `isolation` device attribute: what keeps a claim's work apart from other
/// claims' work on the same GPU, so a claim can require it in CEL
/// (`device.attributes["gpu.tessera.dev"].isolation in ["exclusive", "hardware"]`).
/// docs/concepts/sharing.md says what each guarantees.
pub mod isolation {
    /// A whole GPU: no other claim's work runs on it.
    pub const EXCLUSIVE: &str = "exclusive";
    /// A MIG partition: its own SMs, memory, caches and memory bandwidth, enforced by the
    /// hardware; faults stay in the partition.
    pub const HARDWARE: &str = "hardware";
    /// An MPS share: the claim's own MPS server caps its SMs and pinned device memory; the
    /// claims' servers take turns on the GPU; a fatal fault can reach the GPU's other
    /// claims; not a security boundary.
    pub const MPS_LIMITS: &str = "mps-limits";
    /// A time-sliced GPU: the claims take turns with nothing capped; any claim can use all
    /// the memory.
    pub const NONE: &str = "none";
}

/// Taint key on every device of a GPU that reported a fatal fault or cannot be read; its
/// value says why (`xid-79`, `gpu-lost`, `gpu-unreadable`), its effect is `NoSchedule`.
pub const UNHEALTHY_TAINT_KEY: &str = "gpu.tessera.dev/unhealthy";

/// Device taint (`NoSchedule`) on a GPU's devices while it changes shape: no new
/// allocation lands on the old shape while the plugin checks that none did.
pub const RECONFIGURING_TAINT_KEY: &str = "gpu.tessera.dev/reconfiguring";

/// Binding condition (KEP-5007) of a device that stands for a shape its GPU does not have
/// yet: the plugin sets it `True` in the claim's `status.devices` once it has switched the
/// GPU, and the scheduler binds the pod then.
pub const SWITCHED_CONDITION: &str = "gpu.tessera.dev/switched";
/// Binding failure condition of the same devices: `True` when the plugin cannot switch the
/// GPU; the scheduler then frees the allocation and schedules the pod again.
pub const SWITCH_FAILED_CONDITION: &str = "gpu.tessera.dev/switch-failed";
/// Field manager of the plugin's binding-condition writes, apart from
/// [`PLUGIN_FIELD_MANAGER`]'s `status.devices` entries so neither write drops the other's
/// fields.
pub const PLUGIN_BINDING_FIELD_MANAGER: &str = "tessera-plugin-binding";

/// CDI vendor of a driver's devices: `k8s.<driver name>`, as the reference drivers use.
pub fn cdi_vendor(driver_name: &str) -> String {
    format!("k8s.{driver_name}")
}

/// CDI class of the per-claim devices (`k8s.gpu.tessera.dev/claim=<uid>-<device>`).
pub const CDI_CLASS: &str = "claim";

/// Label carried by every object Tessera creates, so they can be listed and cleaned up.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Every MIG profile name of the GPU models Tessera knows (the union of the catalogue's
/// tables in `tessera-gpu`; a test there keeps the two equal). The API server refuses
/// other names at `kubectl apply`; whether a GPU has the profile is judged by the operator.
pub const MIG_PROFILES: &[&str] = &[
    "1g.5gb",
    "1g.5gb+me",
    "1g.10gb",
    "1g.10gb+me",
    "1g.18gb",
    "1g.18gb+me",
    "1g.20gb",
    "1g.35gb",
    "2g.10gb",
    "2g.20gb",
    "2g.35gb",
    "3g.20gb",
    "3g.40gb",
    "3g.71gb",
    "4g.20gb",
    "4g.40gb",
    "4g.71gb",
    "7g.40gb",
    "7g.80gb",
    "7g.141gb",
];
