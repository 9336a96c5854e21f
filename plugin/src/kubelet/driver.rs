//! The seam between the kubelet-facing gRPC layer and the driver logic.
//!
//! The gRPC servers in this module tree speak both DRA wire versions (v1, v1beta1) and
//! translate them into these version-free types; the driver (slices, prepare logic,
//! checkpoint, CDI) implements [`DraDriver`] and never sees protobuf.

use std::{collections::HashMap, future::Future};

use serde::{Deserialize, Serialize};

/// A claim as the kubelet names it in `NodePrepareResources` / `NodeUnprepareResources`.
///
/// The gRPC layer only passes claims whose three fields are all non-empty.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimRef {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// UID of the ResourceClaim; the key of every per-claim result.
    pub uid: String,
    /// Name of the ResourceClaim.
    pub name: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One device prepared for a claim (`Device` in the DRA node API).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// Request names from the claim the device was allocated for, without any
    /// `/<subrequest>` suffix; empty means "all requests".
    pub request_names: Vec<String>,
    /// ResourceSlice pool of the device. Required.
    pub pool_name: String,
    /// Device name within the pool. Required.
    pub device_name: String,
    /// Fully qualified CDI device IDs (`vendor/class=name`) to inject.
    pub cdi_device_ids: Vec<String>,
    /// Consumable-capacity share ID (KEP-5075). Only the v1 API carries it; it is dropped
    /// when the kubelet speaks v1beta1.
    pub share_id: Option<String>,
}

/// Per-claim prepare results, keyed by claim UID. `Err` holds the message the kubelet
/// shows for that claim.
pub type PrepareResults = HashMap<String, Result<Vec<PreparedDevice>, String>>;

/// Per-claim unprepare results, keyed by claim UID.
pub type UnprepareResults = HashMap<String, Result<(), String>>;

/// What the DRA driver does for the kubelet. Implemented by the plugin proper.
///
/// Both calls may be repeated for the same claims (kubelet or plugin restarts), so they
/// must be idempotent. Claims are unique by UID within one call.
pub trait DraDriver: Send + Sync + 'static {
    /// Prepare every claim. The result map must hold an entry per claim UID; an error
    /// string fails that claim only. A missing entry is reported to the kubelet as
    /// "internal: no result for claim", which makes it retry.
    fn prepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = PrepareResults> + Send;

    /// Undo [`DraDriver::prepare`]. A claim that was never prepared must yield `Ok(())`.
    /// Same map rules as `prepare`.
    fn unprepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = UnprepareResults> + Send;
}
