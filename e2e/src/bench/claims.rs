//! The claim half of the benchmark: MPS enabled on the bench node, claims created and
//! allocated by hand as the scheduler would, `NodePrepareResources` and
//! `NodeUnprepareResources` calls run one after the other or with several in flight, and
//! the checks that every call did the whole job (CDI specs, claim status).

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_api::constants::{DEVICE_CLASS_MPS, DRIVER_NAME, OPERATOR_FIELD_MANAGER};
use tessera_plugin::kubelet::{ClaimRef, client::DraClient};

use super::{CLAIM_NODE, MPS_DEVICE, NS, SETUP_WAIT};
use crate::{cluster, plugin::SimNode};

/// The operator's job, done by hand: GPU 0 shared with MPS. Waits until the plugin
/// republished its slice with the MPS device, so the claims name a device it offers.
pub(super) async fn enable_mps(client: &Client) -> anyhow::Result<()> {
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    gpunodes
        .patch(
            CLAIM_NODE,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": CLAIM_NODE},
                "spec": {"gpus": [{"index": 0, "strategy": "MPS", "mps": {"maxClients": 48}}]}
            })),
        )
        .await
        .context("setting GPU 0 of the bench node to MPS")?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    // One GPU: its devices live in the first device slice.
    let name = format!("{CLAIM_NODE}-{DRIVER_NAME}-00");
    cluster::wait_for(
        &slices,
        &name,
        |s: Option<&ResourceSlice>| {
            s.and_then(|s| s.spec.devices.as_ref())
                .is_some_and(|d| d.iter().any(|d| d.name == MPS_DEVICE))
        },
        &format!("the slice to offer {MPS_DEVICE}"),
        SETUP_WAIT,
    )
    .await?;
    Ok(())
}

/// Creates `n` claims and allocates each by hand, as the scheduler would: the MPS device
/// of the bench node, with a fresh share ID and a small consumed capacity.
pub(super) async fn create_claims(
    client: &Client,
    n: usize,
    in_flight: usize,
) -> anyhow::Result<Vec<ClaimRef>> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let one = |i: usize| {
        let api = api.clone();
        async move {
            let name = format!("bench-{i:05}");
            let claim: ResourceClaim = serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_MPS}}]}}
            }))?;
            let mut created = api
                .create(&PostParams::default(), &claim)
                .await
                .with_context(|| format!("creating claim {name}"))?;
            created.status = Some(serde_json::from_value(json!({"allocation": {
                "devices": {"results": [{
                    "request": "gpu", "driver": DRIVER_NAME, "pool": CLAIM_NODE,
                    "device": MPS_DEVICE, "shareID": uuid::Uuid::new_v4().to_string(),
                    "consumedCapacity": {"computePercent": "1", "memory": "256Mi"}
                }]},
                // The plugin's node-bound token may only write the status of claims
                // allocated on its node.
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [CLAIM_NODE]}]}]}
            }}))?);
            let stored = api
                .replace_status(&name, &PostParams::default(), &created)
                .await
                .with_context(|| format!("allocating claim {name}"))?;
            anyhow::Ok(ClaimRef {
                namespace: NS.into(),
                uid: stored.uid().context("a stored claim has no UID")?,
                name,
            })
        }
    };
    let mut claims: Vec<ClaimRef> = stream::iter((0..n).map(one))
        .buffer_unordered(in_flight)
        .try_collect()
        .await?;
    // Stable order, so the sequential phase walks them as created.
    claims.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(claims)
}

/// One `NodePrepareResources` call for one claim (as the kubelet sends for a pod with one
/// claim); its latency, and an error unless the plugin prepared exactly the MPS device.
pub(super) async fn prepare_one(dra: &DraClient, c: &ClaimRef) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let res = dra.prepare(vec![c.clone()]).await?;
    let took = started.elapsed();
    match res.get(&c.uid) {
        Some(Ok(devices))
            if devices.len() == 1
                && devices[0].device_name == MPS_DEVICE
                && !devices[0].cdi_device_ids.is_empty() =>
        {
            Ok(took)
        }
        Some(Ok(devices)) => bail!("prepare of {c} returned unexpected devices: {devices:?}"),
        Some(Err(e)) => bail!("prepare of {c} failed: {e}"),
        None => bail!("prepare of {c} returned no result for it: {res:?}"),
    }
}

/// One `NodeUnprepareResources` call for one claim; its latency, or the plugin's error.
pub(super) async fn unprepare_one(dra: &DraClient, c: &ClaimRef) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let res = dra.unprepare(vec![c.clone()]).await?;
    let took = started.elapsed();
    match res.get(&c.uid) {
        Some(Ok(())) => Ok(took),
        Some(Err(e)) => bail!("unprepare of {c} failed: {e}"),
        None => bail!("unprepare of {c} returned no result for it: {res:?}"),
    }
}

/// Runs `call` for each claim, one after the other; every latency and the wall time.
pub(super) async fn sequential<'a, F, Fut>(
    claims: &'a [ClaimRef],
    call: F,
) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(&'a ClaimRef) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let started = Instant::now();
    let mut out = Vec::with_capacity(claims.len());
    for c in claims {
        out.push(call(c).await?);
    }
    Ok((out, started.elapsed()))
}

/// Runs `call` for each claim with `in_flight` calls outstanding at all times; every
/// latency (queueing in the plugin included, as the kubelet would see it) and the wall time.
pub(super) async fn concurrent<'a, F, Fut>(
    claims: &'a [ClaimRef],
    in_flight: usize,
    call: F,
) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(&'a ClaimRef) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let started = Instant::now();
    let out: Vec<Duration> = stream::iter(claims.iter().map(call))
        .buffer_unordered(in_flight)
        .try_collect()
        .await?;
    Ok((out, started.elapsed()))
}

fn cdi_spec(node: &SimNode, c: &ClaimRef) -> PathBuf {
    node.cdi_dir()
        .join(format!("k8s.{DRIVER_NAME}-claim_{}.json", c.uid))
}

/// Every claim has its CDI spec on disk and `status.devices` written by the plugin: the
/// calls did the whole job, not a shortcut.
pub(super) async fn check_prepared(
    node: &SimNode,
    client: &Client,
    claims: &[ClaimRef],
) -> anyhow::Result<()> {
    if let Some(c) = claims.iter().find(|c| !cdi_spec(node, c).is_file()) {
        bail!(
            "prepare of {c} succeeded but {} does not exist",
            cdi_spec(node, c).display()
        );
    }
    // status.devices is written off the kubelet's path: give the writes time to land.
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = api.list(&ListParams::default()).await?;
        let with_status = listed
            .items
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.devices.as_ref())
                    .is_some_and(|d| d.iter().any(|d| d.device == MPS_DEVICE))
            })
            .count();
        if with_status == claims.len() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "only {with_status} of {} claims have status.devices written by the plugin (see its log: {})",
            claims.len(),
            node.log_path().display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Every claim's CDI spec is gone again.
pub(super) fn check_unprepared(node: &SimNode, claims: &[ClaimRef]) -> anyhow::Result<()> {
    if let Some(c) = claims.iter().find(|c| cdi_spec(node, c).exists()) {
        bail!(
            "unprepare of {c} succeeded but {} still exists",
            cdi_spec(node, c).display()
        );
    }
    Ok(())
}
