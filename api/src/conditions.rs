//! Condition types and reasons used in Tessera statuses.
//!
//! Conditions are `metav1.Condition`s. Writers keep `lastTransitionTime` unless `status`
//! flips and always set `observedGeneration`, so readers can tell stale from current.

/// Condition types.
pub mod types {
    /// The object is fully applied and healthy.
    pub const READY: &str = "Ready";
    /// Work toward the desired state is under way (e.g. a GPU is being repartitioned).
    pub const PROGRESSING: &str = "Progressing";
    /// Something is wrong that needs a person (unhealthy GPU, unsupported layout).
    pub const DEGRADED: &str = "Degraded";
    /// Another policy with a higher or equal priority governs some of the same GPUs.
    pub const CONFLICTED: &str = "Conflicted";
    /// (GpuNode) the plugin applied the spec to the hardware.
    pub const APPLIED: &str = "Applied";
}

/// Condition reasons (PascalCase, stable: tooling may match on them).
pub mod reasons {
    /// Everything matches the desired state.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// The policy matches no node.
    pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";
    /// A GPU is changing shape.
    pub const REPARTITIONING: &str = "Repartitioning";
    /// A higher-priority policy governs some of the matched GPUs.
    pub const OVERRIDDEN: &str = "OverriddenByHigherPriority";
    /// Two policies of equal priority select the same GPU.
    pub const PRIORITY_TIE: &str = "PriorityTie";
    /// A GPU reported a fault.
    pub const GPU_UNHEALTHY: &str = "GpuUnhealthy";
    /// The requested layout does not fit the GPU's MIG geometry.
    pub const LAYOUT_INVALID: &str = "LayoutInvalid";
    /// The API server dropped ResourceSlice fields because a feature gate is off.
    pub const FIELDS_DROPPED: &str = "ApiServerDroppedFields";
    /// Part of the GpuNode spec cannot apply to the GPU (e.g. MIG on a GPU without MIG).
    pub const CONFIG_NOT_APPLICABLE: &str = "ConfigNotApplicable";
    /// A GPU's live MIG instances do not fit Tessera's model of its geometry; it offers no
    /// partitions until they are gone.
    pub const UNEXPECTED_GEOMETRY: &str = "UnexpectedMigGeometry";
    /// MIG instances Tessera did not create take part of a GPU, which is not offered.
    pub const FOREIGN_INSTANCES: &str = "ForeignMigInstances";
    /// An A100-class GPU needs a reset before a MIG mode change takes effect.
    pub const MIG_MODE_PENDING_RESET: &str = "MigModePendingReset";
    /// A GPU's new configuration waits for the claims allocated on it to end.
    pub const WAITING_FOR_CLAIMS: &str = "WaitingForClaims";
    /// A GPU waited longer than `repartition.progressDeadline` for its claims to end (the
    /// name Deployments give a stalled rollout: reported, nothing undone).
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// The policy's `nodeSelector` cannot be evaluated.
    pub const INVALID_SELECTOR: &str = "InvalidSelector";
    /// The policy's configuration cannot apply to some selected GPUs.
    pub const CONFIG_NOT_APPLICABLE_TO_GPU: &str = "NotApplicableToGpu";
    /// The policy governs GPUs and nothing stands in its way.
    pub const GOVERNING: &str = "Governing";
}
