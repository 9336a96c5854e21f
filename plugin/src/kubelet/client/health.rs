//! Client of the device health stream (`DRAResourceHealth`), as the kubelet watches it.

use std::{path::Path, time::Duration};

use futures::{StreamExt, stream::BoxStream};

use super::{ClientError, call, connect_unix};
use crate::kubelet::{
    health::DeviceHealthEntry,
    proto::{health_v1, health_v1alpha1},
    registration::{HEALTH_V1_SERVICE, HEALTH_V1ALPHA1_SERVICE},
};

/// Health stream version spoken by [`watch_health`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthVersion {
    /// `v1alpha1.DRAResourceHealth` (Kubernetes 1.34+).
    V1alpha1,
    /// `v1.DRAResourceHealth` (Kubernetes 1.37+).
    V1,
}

impl HealthVersion {
    /// What a 1.37 kubelet picks: v1 if offered, else v1alpha1; `None` if neither.
    pub fn negotiate(supported_versions: &[String]) -> Option<Self> {
        let offered = |name: &str| supported_versions.iter().any(|v| v == name);
        if offered(HEALTH_V1_SERVICE) {
            Some(Self::V1)
        } else if offered(HEALTH_V1ALPHA1_SERVICE) {
            Some(Self::V1alpha1)
        } else {
            None
        }
    }
}

/// Complete device health lists as the plugin streams them.
pub type HealthStream = BoxStream<'static, Result<Vec<DeviceHealthEntry>, ClientError>>;

/// Calls `NodeWatchResources` at `endpoint`; `timeout` bounds the call, not the stream.
pub async fn watch_health(
    endpoint: &Path,
    version: HealthVersion,
    timeout: Duration,
) -> Result<HealthStream, ClientError> {
    const CALL: &str = "NodeWatchResources";
    let channel = connect_unix(endpoint).await?;
    let status = |status| ClientError::Status { call: CALL, status };
    Ok(match version {
        HealthVersion::V1 => {
            let mut c =
                health_v1::dra_resource_health_client::DraResourceHealthClient::new(channel);
            let req = health_v1::NodeWatchResourcesRequest {};
            call(CALL, timeout, c.node_watch_resources(req))
                .await?
                .map(move |r| {
                    r.map(|r| r.devices.into_iter().map(Into::into).collect())
                        .map_err(status)
                })
                .boxed()
        }
        HealthVersion::V1alpha1 => {
            let mut c =
                health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel);
            let req = health_v1alpha1::NodeWatchResourcesRequest {};
            call(CALL, timeout, c.node_watch_resources(req))
                .await?
                .map(move |r| {
                    r.map(|r| r.devices.into_iter().map(Into::into).collect())
                        .map_err(status)
                })
                .boxed()
        }
    })
}
