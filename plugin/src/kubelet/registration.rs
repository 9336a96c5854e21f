//! The plugin registration service (`pluginregistration.Registration`).
//!
//! Mirrors `k8s.io/dynamic-resource-allocation/kubeletplugin/registrationserver.go`: the
//! kubelet calls `GetInfo` when it discovers the registration socket (and again after
//! its own restarts and as a health check), then `NotifyRegistrationStatus` with its
//! verdict, which we record for the plugin's readiness.

use std::{fmt, path::PathBuf};

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::{Registration, RegistrationServer as GrpcRegistrationServer},
};

/// `PluginInfo.type` for a DRA driver.
pub const PLUGIN_TYPE_DRA: &str = "DRAPlugin";
/// Service name of the DRA node service v1 in `supported_versions`.
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";
/// Service name of the DRA node service v1beta1 in `supported_versions`.
pub const DRA_V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
/// Service name of the health stream v1alpha1 (Kubernetes 1.34+).
pub const HEALTH_V1ALPHA1_SERVICE: &str = "v1alpha1.DRAResourceHealth";
/// Service name of the health stream v1 (Kubernetes 1.37+).
pub const HEALTH_V1_SERVICE: &str = "v1.DRAResourceHealth";

/// The `supported_versions` we advertise, in preference order (dra.md §2.1). The health
/// services are listed only when they are served: a kubelet would otherwise try to watch
/// a service that answers "unimplemented".
pub fn supported_versions(serve_health: bool) -> Vec<String> {
    let mut versions = vec![DRA_V1_SERVICE, DRA_V1BETA1_SERVICE];
    if serve_health {
        versions.extend([HEALTH_V1ALPHA1_SERVICE, HEALTH_V1_SERVICE]);
    }
    versions.into_iter().map(str::to_owned).collect()
}

/// What the kubelet last told us about our registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationState {
    /// No verdict yet: the registration socket is (re-)created and awaits the kubelet.
    Pending,
    /// The kubelet accepted the plugin.
    Registered,
    /// The kubelet rejected the plugin with this error.
    Failed(String),
}

impl RegistrationState {
    /// True once the kubelet has accepted the plugin.
    pub fn is_registered(&self) -> bool {
        matches!(self, Self::Registered)
    }
}

impl fmt::Display for RegistrationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pending => f.write_str("waiting for the kubelet to register the plugin"),
            Self::Registered => f.write_str("registered"),
            Self::Failed(error) => write!(f, "registration failed: {error}"),
        }
    }
}

/// Answers the kubelet's registration calls.
#[derive(Clone)]
pub struct RegistrationServer {
    info: PluginInfo,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationServer {
    /// A server announcing `driver_name` at `dra_endpoint` (the absolute DRA socket path).
    pub fn new(driver_name: &str, dra_endpoint: PathBuf, serve_health: bool) -> Self {
        let info = PluginInfo {
            r#type: PLUGIN_TYPE_DRA.to_owned(),
            name: driver_name.to_owned(),
            endpoint: dra_endpoint.to_string_lossy().into_owned(),
            supported_versions: supported_versions(serve_health),
        };
        Self {
            info,
            state: watch::Sender::new(RegistrationState::Pending),
        }
    }

    /// Follows the kubelet's verdicts; starts at [`RegistrationState::Pending`].
    pub fn state(&self) -> watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }

    /// Forgets the last verdict, e.g. after re-creating the registration socket.
    pub fn reset(&self) {
        self.state.send_replace(RegistrationState::Pending);
    }

    /// The tonic service.
    pub fn service(&self) -> GrpcRegistrationServer<Self> {
        GrpcRegistrationServer::new(self.clone())
    }
}

#[tonic::async_trait]
impl Registration for RegistrationServer {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(endpoint = %self.info.endpoint, "kubelet asked for plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            self.state.send_replace(RegistrationState::Registered);
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            tracing::error!(driver = %self.info.name, error = %status.error, "kubelet rejected the plugin");
            self.state
                .send_replace(RegistrationState::Failed(status.error.clone()));
            // The Go library answers a rejection with an error too (a plain Go error,
            // hence code Unknown); the kubelet only logs it.
            Err(Status::unknown(format!(
                "failed registration process: {}",
                status.error
            )))
        }
    }
}
