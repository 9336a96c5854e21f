//! Writing the binding-condition verdicts of [`crate::latent`] into the claims'
//! `status.devices`, where the scheduler's PreBind reads them.

use k8s_openapi::{
    api::resource::v1::ResourceClaim,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{Api, Client, api::Patch};
use serde_json::json;
use tessera_api::constants::{
    PLUGIN_BINDING_FIELD_MANAGER, SWITCH_FAILED_CONDITION, SWITCHED_CONDITION,
};
use tessera_kit::client::apply_params;

use crate::latent::LatentClaim;

/// What to report for one latent device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The GPU now offers the device ready.
    Switched(String),
    /// The GPU cannot be switched, and why.
    Failed(String),
}

/// Server-side applies the verdict's condition to the claim's `status.devices` entry of
/// its device, as [`PLUGIN_BINDING_FIELD_MANAGER`]. The claim's UID is a precondition: a
/// claim deleted and made again under the same name is not told.
pub async fn report(
    client: &Client,
    driver: &str,
    pool: &str,
    claim: &LatentClaim,
    verdict: &Verdict,
) -> kube::Result<()> {
    let (type_, reason, message) = match verdict {
        Verdict::Switched(m) => (SWITCHED_CONDITION, "GpuSwitched", m),
        Verdict::Failed(m) => (SWITCH_FAILED_CONDITION, "GpuNotSwitched", m),
    };
    let condition = Condition {
        type_: type_.to_string(),
        status: "True".into(),
        reason: reason.into(),
        message: message.clone(),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    };
    let mut entry = json!({
        "driver": driver, "pool": pool, "device": claim.device,
        "conditions": [condition],
    });
    if let Some(s) = &claim.share_id {
        entry["shareID"] = json!(s);
    }
    let patch = json!({
        "apiVersion": <ResourceClaim as k8s_openapi::Resource>::API_VERSION,
        "kind": <ResourceClaim as k8s_openapi::Resource>::KIND,
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": [entry]}
    });
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    api.patch_status(
        &claim.name,
        &apply_params(PLUGIN_BINDING_FIELD_MANAGER),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}
