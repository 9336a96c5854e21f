//! The device health stream (`DRAResourceHealth`, KEP-4680), v1alpha1 and v1.
//!
//! `NodeWatchResources` sends the complete device list first and then again each time
//! the driver publishes a new one on a `watch` channel. Devices missing from a list
//! become Unknown at the kubelet after their timeout, so the list must always be whole.

use futures::{StreamExt, stream::BoxStream};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use super::proto::{health_v1, health_v1alpha1};

/// Health of one device as the kubelet understands it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceHealthStatus {
    /// Not known (also what the kubelet assumes after a timeout).
    #[default]
    Unknown,
    /// Usable.
    Healthy,
    /// Not usable.
    Unhealthy,
}

/// One device's health, as sent in every `NodeWatchResources` response.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceHealthEntry {
    /// ResourceSlice pool of the device.
    pub pool_name: String,
    /// Device name within the pool.
    pub device_name: String,
    /// Current health.
    pub health: DeviceHealthStatus,
    /// Human-readable detail (the kubelet truncates past 1024 characters).
    pub message: String,
    /// When the health was last checked, in Unix seconds.
    pub last_updated: i64,
    /// How long the kubelet trusts this entry; `<= 0` means its default (30 s).
    pub health_check_timeout_seconds: i64,
}

/// Serves the health stream from a `watch` channel of complete device lists.
#[derive(Clone)]
pub struct HealthServer {
    devices: watch::Receiver<Vec<DeviceHealthEntry>>,
    stop: watch::Receiver<bool>,
}

impl HealthServer {
    /// Streams `devices` until `stop` becomes `true` or its sender is dropped.
    ///
    /// Open streams must end on shutdown: tonic's graceful shutdown waits for every
    /// in-flight response, and a watch stream never finishes by itself.
    pub fn new(
        devices: watch::Receiver<Vec<DeviceHealthEntry>>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self { devices, stop }
    }

    /// The tonic service for `v1alpha1.DRAResourceHealth`.
    pub fn v1alpha1(
        &self,
    ) -> health_v1alpha1::dra_resource_health_server::DraResourceHealthServer<Self> {
        health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(self.clone())
    }

    /// The tonic service for `v1.DRAResourceHealth`.
    pub fn v1(&self) -> health_v1::dra_resource_health_server::DraResourceHealthServer<Self> {
        health_v1::dra_resource_health_server::DraResourceHealthServer::new(self.clone())
    }

    /// The current list, then every new one, until stopped. Ends early if the driver
    /// drops the sender; the kubelet then reconnects and gets the last list again.
    fn updates(&self) -> impl futures::Stream<Item = Vec<DeviceHealthEntry>> + Send + 'static {
        let mut stop = self.stop.clone();
        let stopped = async move {
            // Err means the sender is gone, which is a stop as well.
            let _ = stop.wait_for(|stop| *stop).await;
        };
        WatchStream::new(self.devices.clone()).take_until(stopped)
    }
}

/// Wire conversions and the service, identical for both versions.
macro_rules! health_service {
    ($api:ident, $version:literal) => {
        impl From<DeviceHealthStatus> for $api::HealthStatus {
            fn from(status: DeviceHealthStatus) -> Self {
                match status {
                    DeviceHealthStatus::Unknown => Self::Unknown,
                    DeviceHealthStatus::Healthy => Self::Healthy,
                    DeviceHealthStatus::Unhealthy => Self::Unhealthy,
                }
            }
        }

        impl From<DeviceHealthEntry> for $api::DeviceHealth {
            fn from(e: DeviceHealthEntry) -> Self {
                Self {
                    device: Some($api::DeviceIdentifier {
                        pool_name: e.pool_name,
                        device_name: e.device_name,
                    }),
                    health: $api::HealthStatus::from(e.health).into(),
                    last_updated_time: e.last_updated,
                    health_check_timeout_seconds: e.health_check_timeout_seconds,
                    message: e.message,
                }
            }
        }

        impl From<$api::DeviceHealth> for DeviceHealthEntry {
            fn from(h: $api::DeviceHealth) -> Self {
                let device = h.device.unwrap_or_default();
                // Unrecognised numbers decode as Unknown, as the kubelet treats them.
                let health = match $api::HealthStatus::try_from(h.health) {
                    Ok($api::HealthStatus::Healthy) => DeviceHealthStatus::Healthy,
                    Ok($api::HealthStatus::Unhealthy) => DeviceHealthStatus::Unhealthy,
                    Ok($api::HealthStatus::Unknown) | Err(_) => DeviceHealthStatus::Unknown,
                };
                Self {
                    pool_name: device.pool_name,
                    device_name: device.device_name,
                    health,
                    message: h.message,
                    last_updated: h.last_updated_time,
                    health_check_timeout_seconds: h.health_check_timeout_seconds,
                }
            }
        }

        #[tonic::async_trait]
        impl $api::dra_resource_health_server::DraResourceHealth for HealthServer {
            type NodeWatchResourcesStream =
                BoxStream<'static, Result<$api::NodeWatchResourcesResponse, Status>>;

            async fn node_watch_resources(
                &self,
                _: Request<$api::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                tracing::info!(api = $version, "kubelet started watching device health");
                let stream = self.updates().map(|devices| {
                    let devices = devices.into_iter().map(Into::into).collect();
                    Ok($api::NodeWatchResourcesResponse { devices })
                });
                Ok(Response::new(stream.boxed()))
            }
        }
    };
}

health_service!(health_v1alpha1, "v1alpha1");
health_service!(health_v1, "v1");
