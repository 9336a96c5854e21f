//! The kubelet's side of the APIs, for tests and the bench that call the plugin directly
//! (the end-to-end test bed runs the real kubelet for everything else).
//!
//! Behaves like the kubelet (kubernetes `pkg/kubelet/cm/dra/plugin/dra_plugin.go`):
//! it picks the DRA version from the plugin's `supported_versions` and bounds every call
//! with a timeout ([`KUBELET_CALL_TIMEOUT`] is the kubelet's).

use std::{
    future::Future,
    path::{Path, PathBuf},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::{
    Response, Status,
    transport::{Channel, Endpoint, Uri},
};

use super::{
    driver::{ClaimRef, PrepareResults, UnprepareResults},
    proto::{
        dra_v1, dra_v1beta1,
        registration::{self, PluginInfo, registration_client},
    },
    registration::{DRA_V1_SERVICE, DRA_V1BETA1_SERVICE},
};

mod health;

pub use health::{HealthStream, HealthVersion, watch_health};

/// The kubelet's per-call timeout for DRA calls (`defaultClientCallTimeout`).
pub const KUBELET_CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// Errors of the client calls.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be dialled.
    #[error("failed to connect to {}", .path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The call did not finish in time.
    #[error("{call} timed out after {timeout:?}")]
    Timeout {
        /// The gRPC method.
        call: &'static str,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The server answered with an error status.
    #[error("{call} failed: {status}")]
    Status {
        /// The gRPC method.
        call: &'static str,
        /// The status.
        status: Status,
    },
    /// The plugin offers no service this client speaks.
    #[error(
        "the plugin supports none of the {what} services this client speaks (it offers {offered:?})"
    )]
    NoSupportedVersion {
        /// "DRA" or "health".
        what: &'static str,
        /// The plugin's `supported_versions`.
        offered: Vec<String>,
    },
}

/// Dials a Unix socket. The URI is a placeholder that tonic requires; the connector
/// ignores it and dials `path` (again on every reconnect).
pub async fn connect_unix(path: &Path) -> Result<Channel, ClientError> {
    let dial = path.to_owned();
    let connector = tower::service_fn(move |_: Uri| {
        let dial = dial.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(dial).await?)) }
    });
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(connector)
        .await
        .map_err(|source| ClientError::Connect {
            path: path.to_owned(),
            source,
        })
}

/// Runs one unary call under `timeout`.
async fn call<T>(
    call: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<Response<T>, Status>>,
) -> Result<T, ClientError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(ClientError::Status { call, status }),
        Err(_) => Err(ClientError::Timeout { call, timeout }),
    }
}

/// Client of `pluginregistration.Registration` (the plugin's `-reg.sock`).
#[derive(Clone, Debug)]
pub struct RegistrationClient {
    inner: registration_client::RegistrationClient<Channel>,
    timeout: Duration,
}

impl RegistrationClient {
    /// Connects to a registration socket; every call is bounded by `timeout`.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let channel = connect_unix(path).await?;
        Ok(Self {
            inner: registration_client::RegistrationClient::new(channel),
            timeout,
        })
    }

    /// `GetInfo`: who the plugin is and where its DRA endpoint is.
    pub async fn get_info(&self) -> Result<PluginInfo, ClientError> {
        let mut inner = self.inner.clone();
        call(
            "GetInfo",
            self.timeout,
            inner.get_info(registration::InfoRequest {}),
        )
        .await
    }

    /// `NotifyRegistrationStatus`. The plugin answers a rejection
    /// (`registered = false`) with an error status.
    pub async fn notify(
        &self,
        registered: bool,
        error: impl Into<String>,
    ) -> Result<(), ClientError> {
        let status = registration::RegistrationStatus {
            plugin_registered: registered,
            error: error.into(),
        };
        let mut inner = self.inner.clone();
        call(
            "NotifyRegistrationStatus",
            self.timeout,
            inner.notify_registration_status(status),
        )
        .await
        .map(|_| ())
    }
}

/// DRA node service version spoken by a [`DraClient`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraVersion {
    /// `v1.DRAPlugin` (Kubernetes 1.34+).
    V1,
    /// `v1beta1.DRAPlugin` (Kubernetes 1.32+).
    V1beta1,
}

impl DraVersion {
    /// What the kubelet picks: the first entry of the plugin's list that it supports.
    pub fn negotiate(supported_versions: &[String]) -> Option<Self> {
        supported_versions.iter().find_map(|v| match v.as_str() {
            DRA_V1_SERVICE => Some(Self::V1),
            DRA_V1BETA1_SERVICE => Some(Self::V1beta1),
            _ => None,
        })
    }
}

/// Client of the DRA node service at a plugin's endpoint.
#[derive(Clone, Debug)]
pub struct DraClient {
    channel: Channel,
    version: DraVersion,
    timeout: Duration,
}

impl DraClient {
    /// Connects to `endpoint` speaking `version`; every call is bounded by `timeout`.
    pub async fn connect(
        endpoint: &Path,
        version: DraVersion,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            channel: connect_unix(endpoint).await?,
            version,
            timeout,
        })
    }

    /// Connects as the kubelet does after `GetInfo`: to `info.endpoint`, with the version
    /// negotiated from `info.supported_versions`.
    pub async fn from_info(info: &PluginInfo, timeout: Duration) -> Result<Self, ClientError> {
        let version = DraVersion::negotiate(&info.supported_versions).ok_or_else(|| {
            ClientError::NoSupportedVersion {
                what: "DRA",
                offered: info.supported_versions.clone(),
            }
        })?;
        Self::connect(Path::new(&info.endpoint), version, timeout).await
    }

    /// The negotiated version.
    pub fn version(&self) -> DraVersion {
        self.version
    }

    /// `NodePrepareResources`; per-claim results keyed by claim UID.
    pub async fn prepare(&self, claims: Vec<ClaimRef>) -> Result<PrepareResults, ClientError> {
        const CALL: &str = "NodePrepareResources";
        let channel = self.channel.clone();
        Ok(match self.version {
            DraVersion::V1 => {
                let req = dra_v1::NodePrepareResourcesRequest {
                    claims: claims.into_iter().map(Into::into).collect(),
                };
                let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
                call(CALL, self.timeout, c.node_prepare_resources(req))
                    .await?
                    .into()
            }
            DraVersion::V1beta1 => {
                let req = dra_v1beta1::NodePrepareResourcesRequest {
                    claims: claims.into_iter().map(Into::into).collect(),
                };
                let mut c = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel);
                call(CALL, self.timeout, c.node_prepare_resources(req))
                    .await?
                    .into()
            }
        })
    }

    /// `NodeUnprepareResources`; per-claim results keyed by claim UID.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> Result<UnprepareResults, ClientError> {
        const CALL: &str = "NodeUnprepareResources";
        let channel = self.channel.clone();
        Ok(match self.version {
            DraVersion::V1 => {
                let req = dra_v1::NodeUnprepareResourcesRequest {
                    claims: claims.into_iter().map(Into::into).collect(),
                };
                let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
                call(CALL, self.timeout, c.node_unprepare_resources(req))
                    .await?
                    .into()
            }
            DraVersion::V1beta1 => {
                let req = dra_v1beta1::NodeUnprepareResourcesRequest {
                    claims: claims.into_iter().map(Into::into).collect(),
                };
                let mut c = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel);
                call(CALL, self.timeout, c.node_unprepare_resources(req))
                    .await?
                    .into()
            }
        })
    }
}
