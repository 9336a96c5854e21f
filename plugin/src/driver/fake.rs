//! An in-memory [`ClaimApi`] for the driver's tests.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::ClaimApi;

/// Claims by `namespace/name`, the status patches applied, and the answer every status
/// write gets.
#[derive(Default)]
pub(crate) struct FakeClaims {
    pub claims: Mutex<BTreeMap<String, ResourceClaim>>,
    pub patches: Mutex<Vec<(String, serde_json::Value)>>,
    /// When set, `get` and `apply_status` fail with this HTTP status.
    pub fail_with: Mutex<Option<u16>>,
}

impl FakeClaims {
    pub fn insert(&self, claim: ResourceClaim) {
        let key = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        self.claims.lock().unwrap().insert(key, claim);
    }

    pub fn remove(&self, namespace: &str, name: &str) {
        self.claims
            .lock()
            .unwrap()
            .remove(&format!("{namespace}/{name}"));
    }

    fn failure(&self) -> Option<kube::Error> {
        let code = (*self.fail_with.lock().unwrap())?;
        Some(kube::Error::Api(
            kube::core::Status::failure("injected", "")
                .with_code(code)
                .boxed(),
        ))
    }
}

impl ClaimApi for Arc<FakeClaims> {
    fn cached(&self, _: &str, _: &str) -> Option<Arc<ResourceClaim>> {
        None
    }

    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, kube::Result<Option<ResourceClaim>>> {
        let result = match self.failure() {
            Some(e) => Err(e),
            None => Ok(self
                .claims
                .lock()
                .unwrap()
                .get(&format!("{namespace}/{name}"))
                .cloned()),
        };
        Box::pin(async move { result })
    }

    fn apply_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> BoxFuture<'static, kube::Result<()>> {
        let result = match self.failure() {
            Some(e) => Err(e),
            None => {
                self.patches
                    .lock()
                    .unwrap()
                    .push((format!("{namespace}/{name}"), patch));
                Ok(())
            }
        };
        Box::pin(async move { result })
    }
}
