//! The API client of a Tessera binary.

use std::path::PathBuf;

use kube::{Client, Config, config::KubeConfigOptions};

/// The client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or used.
    #[error("reading kubeconfig {}", .path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was given and this is not a pod.
    #[error("no --kubeconfig and not running in a pod")]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be built from the configuration.
    #[error("making the API client")]
    Client(#[source] kube::Error),
}

/// A client from `kubeconfig`, else from the pod's ServiceAccount.
pub async fn client(kubeconfig: Option<PathBuf>) -> Result<Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let read = match kube::config::Kubeconfig::read_from(&path) {
                Ok(kc) => Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await,
                Err(e) => Err(e),
            };
            read.map_err(|source| Error::Kubeconfig { path, source })?
        }
        None => Config::incluster().map_err(Error::InCluster)?,
    };
    Client::try_from(config).map_err(Error::Client)
}

/// Parameters of a server-side apply by `manager` that takes the fields it sends.
///
/// Field validation is off (`fieldValidation=Ignore`): what Tessera applies is serialized
/// from the same types the CRDs are generated from, so the API server's strict check (a
/// second parse of every apply body, with warnings nobody reads) only costs it CPU, and a
/// controller applying on a thousand nodes spends most of its time waiting on that CPU.
/// An unknown field still cannot be stored: the schema prunes it.
pub fn apply_params(manager: &str) -> kube::api::PatchParams {
    kube::api::PatchParams::apply(manager)
        .force()
        .validation_ignore()
}
