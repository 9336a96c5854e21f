//! Kubelet-facing gRPC layer: plugin registration, the DRA node service (v1 and
//! v1beta1) and the device health stream (v1alpha1 and v1), served on Unix sockets.
//!
//! The plugin proper implements [`DraDriver`] and calls [`serve`] (or [`start`] and
//! [`KubeletServer::serve_until`] when it needs to know that both sockets listen).
//! [`client`] speaks the other side, for tests and the bench. [`authority`] lets the
//! kubelet's own registration client through h2's `:authority` check.
//!
//! Mirrors `k8s.io/dynamic-resource-allocation/kubeletplugin` (`draplugin.go`,
//! `registrationserver.go`, `nonblockinggrpcserver.go`).

pub mod authority;
pub mod client;
mod config;
mod dra;
mod driver;
mod health;
pub mod proto;
mod registration;
mod serve;
pub mod sockets;
mod wire;

pub use config::{
    DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, DEFAULT_REREGISTER_POLL, KubeletArgs,
    KubeletServerConfig,
};
pub use dra::{DraNodeServer, NO_RESULT};
pub use driver::{ClaimRef, DraDriver, PrepareResults, PreparedDevice, UnprepareResults};
pub use health::{DeviceHealthEntry, DeviceHealthStatus, HealthServer};
pub use registration::{
    DRA_V1_SERVICE, DRA_V1BETA1_SERVICE, HEALTH_V1_SERVICE, HEALTH_V1ALPHA1_SERVICE,
    PLUGIN_TYPE_DRA, RegistrationServer, RegistrationState, supported_versions,
};
pub use serve::{KubeletServer, ServeError, serve, start};
