//! What Tessera's binaries (`tessera-plugin`, `tessera-operator`) run the same way.
//!
//! - [`http`]: the small endpoint serving `/metrics`, `/healthz` and `/readyz`.
//! - [`client`]: the API client, from a kubeconfig or the pod's ServiceAccount.
//! - [`process`]: logging set-up and the shutdown signal.

pub mod client;
pub mod http;
pub mod process;
