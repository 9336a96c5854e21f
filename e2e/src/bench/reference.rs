//! Reference figures, measured alone, to read the plugin's latency against: the API calls
//! the plugin makes around a prepare (reading a claim when its watch cache has not seen
//! it, writing its status), the checkpoint's durable disk write, and the API server's own
//! account of its time.

use std::{path::Path, time::Instant};

use anyhow::Context;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tessera_api::constants::{DRIVER_NAME, PLUGIN_FIELD_MANAGER};
use tessera_plugin::kubelet::ClaimRef;

use super::{CLAIM_NODE, MPS_DEVICE, Metric, NS};

/// Reference: one GET of a claim from this process, what a prepare costs when the claim
/// is not in the plugin's watch cache yet.
pub(super) async fn api_round_trip(
    client: &Client,
    claim: &ClaimRef,
    rounds: usize,
) -> anyhow::Result<Metric> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        api.get(&claim.name).await?;
        samples.push(started.elapsed());
    }
    Ok(Metric::new(
        "ref: GET claim (API round trip)",
        &samples,
        None,
    ))
}

/// Reference: the write that follows a prepare off the kubelet's path, the server-side
/// apply of the claim's `status.devices` as the plugin's field manager. The share alternates between two values
/// so that every apply really changes the object, as the plugin's first write does.
pub(super) async fn api_status_write(
    client: &Client,
    claim: &ClaimRef,
    rounds: usize,
) -> anyhow::Result<Metric> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pp = PatchParams::apply(PLUGIN_FIELD_MANAGER).force();
    // A status entry must name an allocated device, share ID included.
    let share_id = api
        .get(&claim.name)
        .await?
        .status
        .and_then(|s| s.allocation?.devices?.results?.into_iter().next()?.share_id)
        .with_context(|| format!("{claim} has no allocated share"))?;
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let patch = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": NS},
            "status": {"devices": [{"driver": DRIVER_NAME, "pool": CLAIM_NODE, "device": MPS_DEVICE,
                "shareID": share_id, "data": {"type": "mps", "activeThreadPercentage": 1 + round % 2}}]}
        });
        let started = Instant::now();
        api.patch_status(&claim.name, &pp, &Patch::Apply(&patch))
            .await
            .with_context(|| format!("applying the status of {claim}"))?;
        samples.push(started.elapsed());
    }
    Ok(Metric::new(
        "ref: apply claim status (API write)",
        &samples,
        None,
    ))
}

/// Reference: writing one claim's checkpoint file as the checkpoint store does (temp file,
/// fsync, rename, fsync the directory) on the same file system. The plugin does this twice
/// per prepare (plus the CDI spec).
pub(super) fn durable_write(dir: &Path, bytes: u64, rounds: usize) -> anyhow::Result<Metric> {
    use std::io::Write;
    let data = vec![b'x'; usize::try_from(bytes).unwrap_or(0).max(1)];
    let path = dir.join("bench-durable-write.json");
    let tmp = dir.join("bench-durable-write.json.tmp");
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()?;
        samples.push(started.elapsed());
    }
    std::fs::remove_file(&path)?;
    Ok(Metric::new(
        &format!("ref: write+fsync {bytes} B"),
        &samples,
        None,
    ))
}

/// The API server's own time for one kind of request so far, from its
/// `apiserver_request_duration_seconds` histogram: (total seconds, requests). Two readings
/// apart give the mean server-side time of the requests in between, which tells the
/// server's work from everything else in a client-side figure.
pub(super) async fn apiserver_time(
    client: &Client,
    verb: &str,
    resource: &str,
) -> anyhow::Result<(f64, u64)> {
    let body = crate::cluster::apiserver_metrics(client).await?;
    let series = |name: &str| -> f64 {
        body.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .filter(|l| {
                l.contains(&format!("verb=\"{verb}\""))
                    && l.contains(&format!("resource=\"{resource}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let seconds = series("apiserver_request_duration_seconds_sum");
    let count = series("apiserver_request_duration_seconds_count");
    // A count well below 2^53: the cast is exact.
    Ok((seconds, count as u64))
}
