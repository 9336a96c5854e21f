//! The DRA node service (`DRAPlugin`), one implementation serving v1 and v1beta1.
//!
//! Mirrors the request handling of `k8s.io/dynamic-resource-allocation/kubeletplugin`
//! (dra.md §3.2): a gRPC error only for a request that is malformed as a whole, which a
//! decodable request never is here; every claim of the request gets an entry; a claim
//! with an empty namespace/uid/name fails alone and never reaches the driver; duplicate
//! claims reach the driver once.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use tonic::{Request, Response, Status};
use tracing::{Instrument, info_span};

use super::{
    driver::{ClaimRef, DraDriver, PrepareResults, UnprepareResults},
    proto::{dra_v1 as v1, dra_v1beta1 as v1beta1},
};

/// Error reported for a claim the driver returned no result for; the kubelet retries it.
pub const NO_RESULT: &str = "internal: no result for claim";

/// Serves `NodePrepareResources` / `NodeUnprepareResources` for both wire versions by
/// translating them into calls of a [`DraDriver`].
pub struct DraNodeServer<D> {
    driver: Arc<D>,
}

// Manual impl: a derive would require `D: Clone`, but only the Arc is cloned.
impl<D> Clone for DraNodeServer<D> {
    fn clone(&self) -> Self {
        Self {
            driver: Arc::clone(&self.driver),
        }
    }
}

impl<D: DraDriver> DraNodeServer<D> {
    /// Wraps a driver.
    pub fn new(driver: Arc<D>) -> Self {
        Self { driver }
    }

    /// The tonic service for `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`.
    pub fn v1(&self) -> v1::dra_plugin_server::DraPluginServer<Self> {
        v1::dra_plugin_server::DraPluginServer::new(self.clone())
    }

    /// The tonic service for `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`.
    pub fn v1beta1(&self) -> v1beta1::dra_plugin_server::DraPluginServer<Self> {
        v1beta1::dra_plugin_server::DraPluginServer::new(self.clone())
    }

    /// Screens the claims, asks the driver about the valid ones and completes the map.
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let Screened { valid, rejected } = screen(claims);
        let from_driver = if valid.is_empty() {
            // Liveness probes send empty requests; do not bother the driver.
            HashMap::new()
        } else {
            self.driver.prepare(valid.clone()).await
        };
        let mut results = complete(&valid, rejected, from_driver, "prepare");
        for result in results.values_mut() {
            if let Ok(devices) = result
                && devices
                    .iter()
                    .any(|d| d.pool_name.is_empty() || d.device_name.is_empty())
            {
                // pool_name and device_name are required on the wire; the kubelet would
                // fail the pod later with a less helpful message.
                *result = Err(
                    "internal: driver returned a device without pool or device name".to_owned(),
                );
            }
        }
        results
    }

    /// Same as [`Self::prepare`] for unprepare.
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let Screened { valid, rejected } = screen(claims);
        let from_driver = if valid.is_empty() {
            HashMap::new()
        } else {
            self.driver.unprepare(valid.clone()).await
        };
        complete(&valid, rejected, from_driver, "unprepare")
    }
}

/// The claims of one request, split into those the driver sees and those it must not.
struct Screened {
    /// Well-formed claims, unique by UID, in request order.
    valid: Vec<ClaimRef>,
    /// Error per malformed claim, keyed by UID or `<namespace>/<name>` without one.
    rejected: HashMap<String, String>,
}

fn screen(claims: Vec<ClaimRef>) -> Screened {
    let mut seen = HashSet::new();
    let mut valid = Vec::new();
    let mut rejected = HashMap::new();
    for claim in claims {
        let empty: Vec<&str> = [
            ("namespace", &claim.namespace),
            ("uid", &claim.uid),
            ("name", &claim.name),
        ]
        .into_iter()
        .filter(|(_, value)| value.is_empty())
        .map(|(field, _)| field)
        .collect();
        if empty.is_empty() {
            if seen.insert(claim.uid.clone()) {
                valid.push(claim);
            }
            continue;
        }
        let key = if claim.uid.is_empty() {
            format!("{}/{}", claim.namespace, claim.name)
        } else {
            claim.uid.clone()
        };
        rejected.insert(key, format!("invalid claim: empty {}", empty.join(", ")));
    }
    // A UID that also arrived malformed is ambiguous: its entry must be the rejection,
    // so the driver must not act on it either.
    valid.retain(|claim| !rejected.contains_key(&claim.uid));
    Screened { valid, rejected }
}

/// Builds the response map: the driver's result for each valid claim (or [`NO_RESULT`]),
/// plus the rejections. Results for claims that were not asked about are dropped.
fn complete<T>(
    valid: &[ClaimRef],
    rejected: HashMap<String, String>,
    mut from_driver: HashMap<String, Result<T, String>>,
    op: &'static str,
) -> HashMap<String, Result<T, String>> {
    let mut results = HashMap::with_capacity(valid.len() + rejected.len());
    for claim in valid {
        let span =
            info_span!("claim", uid = %claim.uid, namespace = %claim.namespace, name = %claim.name);
        let _entered = span.enter();
        let result = from_driver
            .remove(&claim.uid)
            .unwrap_or_else(|| Err(NO_RESULT.to_owned()));
        match &result {
            Ok(_) => tracing::info!(op, "claim succeeded"),
            Err(error) => tracing::warn!(op, %error, "claim failed"),
        }
        results.insert(claim.uid.clone(), result);
    }
    for uid in from_driver.keys() {
        tracing::warn!(op, %uid, "driver returned a result for a claim not in the request");
    }
    for (key, error) in rejected {
        tracing::warn!(op, claim = %key, %error, "claim rejected");
        results.insert(key, Err(error));
    }
    results
}

/// Handler bodies shared by both versions; `$api` is the generated module.
macro_rules! dra_service {
    ($api:ident, $version:literal) => {
        #[tonic::async_trait]
        impl<D: DraDriver> $api::dra_plugin_server::DraPlugin for DraNodeServer<D> {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims: Vec<ClaimRef> = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(Into::into)
                    .collect();
                let span = info_span!(
                    "NodePrepareResources",
                    api = $version,
                    claims = claims.len()
                );
                let results = self.prepare(claims).instrument(span).await;
                Ok(Response::new(results.into()))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let claims: Vec<ClaimRef> = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(Into::into)
                    .collect();
                let span = info_span!(
                    "NodeUnprepareResources",
                    api = $version,
                    claims = claims.len()
                );
                let results = self.unprepare(claims).instrument(span).await;
                Ok(Response::new(results.into()))
            }
        }
    };
}

dra_service!(v1, "v1");
dra_service!(v1beta1, "v1beta1");
