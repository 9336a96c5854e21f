//! The claim half of the benchmark: MPS enabled on the bench node, claims created and
//! allocated by hand as the scheduler would, `NodePrepareResources` and
//! `NodeUnprepareResources` calls run one after the other or with several in flight, and
//! the checks that every call did the whole job (CDI specs, claim status).
//!
//! The claims go through in waves of at most [`MAX_CLIENTS`]: an MPS server takes at most
//! 48 clients on Volta and newer, the bench node's `maxClients` says so, and the `clients`
//! capacity makes the scheduler hold to it. A node holding a thousand MPS shares of one GPU
//! cannot exist, so it is not what this measures.

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
                "spec": {"gpus": [{"index": 0, "strategy": "MPS", "mps": {"maxClients": MAX_CLIENTS}}]}
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

/// MPS clients of the bench GPU, and so the most claims prepared at once.
pub(super) const MAX_CLIENTS: usize = 48;

/// Creates `n` claims and allocates each by hand, as the scheduler would: the MPS device
/// of the bench node, with a fresh share ID and what the scheduler would consume for a
/// request of 2 % of the threads and 256 MiB (one client slot of [`MAX_CLIENTS`]).
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
                    "consumedCapacity": {"clients": "1", "computePercent": "2", "memory": "256Mi"}
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

/// Latencies of one kind of call over all waves, and the time the calls took.
#[derive(Default)]
pub(super) struct Phase {
    /// Every call's latency, in call order within each wave.
    pub latencies: Vec<Duration>,
    /// Sum over the waves of the time from the first call to the last answer.
    pub wall: Duration,
    /// Largest size of the plugin's checkpoint directory after a half wave, in bytes.
    pub peak_checkpoint_bytes: u64,
}

/// Bytes in the plugin's checkpoint directory (one file per prepared claim).
fn checkpoint_bytes(node: &SimNode) -> u64 {
    std::fs::read_dir(node.checkpoint_dir().join("claims"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Prepares and unprepares every claim in waves of at most [`MAX_CLIENTS`], `in_flight`
/// calls at a time (1: one after the other), checking after each half of each wave that
/// the calls did their job. Returns the prepare and the unprepare phase.
pub(super) async fn waves(
    dra: &DraClient,
    node: &SimNode,
    claims: &[ClaimRef],
    in_flight: usize,
) -> anyhow::Result<(Phase, Phase)> {
    let (mut prepare, mut unprepare) = (Phase::default(), Phase::default());
    for wave in claims.chunks(MAX_CLIENTS) {
        let started = Instant::now();
        let took = run(wave, in_flight, |c| prepare_one(dra, c)).await?;
        prepare.wall += started.elapsed();
        prepare.latencies.extend(took);
        prepare.peak_checkpoint_bytes = prepare.peak_checkpoint_bytes.max(checkpoint_bytes(node));
        check_prepared_files(node, wave)?;
        let started = Instant::now();
        let took = run(wave, in_flight, |c| unprepare_one(dra, c)).await?;
        unprepare.wall += started.elapsed();
        unprepare.latencies.extend(took);
        check_unprepared(node, wave)?;
    }
    Ok((prepare, unprepare))
}

/// The latencies of the first `n` and of the last `n` calls of each wave: with few and
/// with many claims already prepared.
pub(super) fn by_claims_held(latencies: &[Duration], n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (mut few, mut many) = (Vec::new(), Vec::new());
    for wave in latencies.chunks(MAX_CLIENTS) {
        few.extend(wave.iter().take(n));
        if wave.len() == MAX_CLIENTS {
            many.extend(&wave[MAX_CLIENTS - n..]);
        }
    }
    (few, many)
}

/// The latencies of the first call of each wave, which starts the GPU's MPS daemon, and of
/// the others, which find it running.
pub(super) fn by_daemon_start(latencies: &[Duration]) -> (Vec<Duration>, Vec<Duration>) {
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for wave in latencies.chunks(MAX_CLIENTS) {
        if let Some((head, tail)) = wave.split_first() {
            first.push(*head);
            rest.extend(tail);
        }
    }
    (first, rest)
}

/// Runs `call` for each claim with `in_flight` calls outstanding at all times; every
/// latency in claim order (queueing in the plugin included, as the kubelet would see it).
async fn run<'a, F, Fut>(
    claims: &'a [ClaimRef],
    in_flight: usize,
    call: F,
) -> anyhow::Result<Vec<Duration>>
where
    F: Fn(&'a ClaimRef) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    stream::iter(claims.iter().map(call))
        .buffered(in_flight.max(1))
        .try_collect()
        .await
}

fn cdi_spec(node: &SimNode, c: &ClaimRef) -> PathBuf {
    node.cdi_dir()
        .join(format!("k8s.{DRIVER_NAME}-claim_{}.json", c.uid))
}

/// A counter or gauge of the plugin's `/metrics`.
fn metric(body: &str, name: &str) -> anyhow::Result<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("the plugin's /metrics has no {name}"))
}

/// Waits until the plugin has no `status.devices` write queued or in flight, so the next
/// phase is not measured against the API server still working off this one's writes.
/// Fails if any write failed; returns how many were skipped so far (the claim was
/// unprepared or deleted before its turn).
pub(super) async fn wait_status_writes_settled(node: &SimNode) -> anyhow::Result<u64> {
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let (code, body) = node.http_get("/metrics").await?;
        ensure!(code == 200, "the plugin's /metrics answered {code}");
        let pending = metric(&body, "tessera_plugin_claim_status_writes_pending")?;
        if pending == 0.0 {
            let failures = metric(&body, "tessera_plugin_claim_status_write_failures_total")?;
            ensure!(
                failures == 0.0,
                "{failures} status.devices writes failed (see the plugin's log: {})",
                node.log_path().display()
            );
            // A whole number well below 2^53: the cast is exact.
            return Ok(metric(&body, "tessera_plugin_claim_status_writes_skipped_total")? as u64);
        }
        ensure!(
            Instant::now() < deadline,
            "{pending} status.devices writes still pending after 2 minutes (see {})",
            node.log_path().display()
        );
        // Finely: the time to drain is reported.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Every claim of a wave has its CDI spec on disk: the prepare did the whole job.
fn check_prepared_files(node: &SimNode, claims: &[ClaimRef]) -> anyhow::Result<()> {
    if let Some(c) = claims.iter().find(|c| !cdi_spec(node, c).is_file()) {
        bail!(
            "prepare of {c} succeeded but {} does not exist",
            cdi_spec(node, c).display()
        );
    }
    Ok(())
}

/// After the first phase, from claims without any status: every claim prepared once, so
/// each queued exactly one `status.devices` write, and each was either written or skipped
/// (the claim was unprepared before its turn). Checks that the written ones name the MPS
/// device the plugin prepared; returns how many were written.
pub(super) async fn check_claim_status(
    node: &SimNode,
    client: &Client,
    claims: &[ClaimRef],
    skipped: u64,
) -> anyhow::Result<usize> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let listed = api.list(&ListParams::default()).await?;
    let mut written = 0;
    for c in &listed.items {
        let Some(devices) = c.status.as_ref().and_then(|s| s.devices.as_ref()) else {
            continue;
        };
        written += 1;
        let ours = devices
            .iter()
            .find(|d| d.driver == DRIVER_NAME)
            .with_context(|| format!("claim {} has status.devices, none of ours", c.name_any()))?;
        let kind = ours
            .data
            .as_ref()
            .and_then(|d| d.0.get("type"))
            .and_then(|t| t.as_str());
        ensure!(
            ours.device == MPS_DEVICE && kind == Some("mps"),
            "claim {} has status.devices {ours:?}, not the MPS device prepared",
            c.name_any()
        );
    }
    let skipped = usize::try_from(skipped)?;
    ensure!(
        written + skipped == claims.len(),
        "{written} claims have status.devices and {skipped} writes were skipped, of {} claims prepared: writes were lost (see {})",
        claims.len(),
        node.log_path().display()
    );
    Ok(written)
}

/// Every claim's CDI spec is gone again.
fn check_unprepared(node: &SimNode, claims: &[ClaimRef]) -> anyhow::Result<()> {
    if let Some(c) = claims.iter().find(|c| cdi_spec(node, c).exists()) {
        bail!(
            "unprepare of {c} succeeded but {} still exists",
            cdi_spec(node, c).display()
        );
    }
    Ok(())
}
