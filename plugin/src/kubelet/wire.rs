//! Conversions between the DRA wire types (v1, v1beta1) and the version-free types of
//! [`super::driver`]. Used by the server ([`super::dra`]) and by [`super::client`].
//!
//! v1 and v1beta1 are wire-identical except for `Device.share_id` (v1 only), so the
//! claim and response conversions are generated once per version by a macro and only the
//! device conversions are written out.

use super::{
    driver::{ClaimRef, PrepareResults, PreparedDevice, UnprepareResults},
    proto::{dra_v1 as v1, dra_v1beta1 as v1beta1},
};

/// Claim and response conversions, identical for both versions.
macro_rules! wire_conversions {
    ($api:ident) => {
        impl From<$api::Claim> for ClaimRef {
            fn from(c: $api::Claim) -> Self {
                Self {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                }
            }
        }

        impl From<ClaimRef> for $api::Claim {
            fn from(c: ClaimRef) -> Self {
                Self {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                }
            }
        }

        impl From<PrepareResults> for $api::NodePrepareResourcesResponse {
            fn from(results: PrepareResults) -> Self {
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let entry = match result {
                            Ok(devices) => $api::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(Into::into).collect(),
                                error: String::new(),
                            },
                            Err(error) => $api::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, entry)
                    })
                    .collect();
                Self { claims }
            }
        }

        impl From<$api::NodePrepareResourcesResponse> for PrepareResults {
            fn from(resp: $api::NodePrepareResourcesResponse) -> Self {
                resp.claims
                    .into_iter()
                    .map(|(uid, entry)| {
                        // The wire has no Result: a non-empty error is the failure.
                        let result = if entry.error.is_empty() {
                            Ok(entry.devices.into_iter().map(Into::into).collect())
                        } else {
                            Err(entry.error)
                        };
                        (uid, result)
                    })
                    .collect()
            }
        }

        impl From<UnprepareResults> for $api::NodeUnprepareResourcesResponse {
            fn from(results: UnprepareResults) -> Self {
                let claims = results
                    .into_iter()
                    .map(|(uid, result)| {
                        let error = result.err().unwrap_or_default();
                        (uid, $api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Self { claims }
            }
        }

        impl From<$api::NodeUnprepareResourcesResponse> for UnprepareResults {
            fn from(resp: $api::NodeUnprepareResourcesResponse) -> Self {
                resp.claims
                    .into_iter()
                    .map(|(uid, entry)| {
                        let result = if entry.error.is_empty() {
                            Ok(())
                        } else {
                            Err(entry.error)
                        };
                        (uid, result)
                    })
                    .collect()
            }
        }
    };
}

wire_conversions!(v1);
wire_conversions!(v1beta1);

impl From<PreparedDevice> for v1::Device {
    fn from(d: PreparedDevice) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id,
        }
    }
}

impl From<v1::Device> for PreparedDevice {
    fn from(d: v1::Device) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id,
        }
    }
}

impl From<PreparedDevice> for v1beta1::Device {
    /// Drops `share_id`: v1beta1 has no field for it, and a kubelet that speaks only
    /// v1beta1 predates consumable capacity (KEP-5075), so it never allocates shares.
    fn from(d: PreparedDevice) -> Self {
        if let Some(share_id) = &d.share_id {
            tracing::warn!(
                pool = %d.pool_name,
                device = %d.device_name,
                %share_id,
                "dropping share_id: the kubelet speaks DRA v1beta1, which cannot carry it"
            );
        }
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
        }
    }
}

impl From<v1beta1::Device> for PreparedDevice {
    fn from(d: v1beta1::Device) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: None,
        }
    }
}
