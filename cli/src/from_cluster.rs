//! `kubectl tessera simulate --from-cluster`: a live cluster as the simulator's workload,
//! so a platform team can ask what another sharing policy would need for what runs now.
//!
//! - Nodes: every node with a `GpuNode`, with its allocatable CPU and memory and the
//!   number of GPUs its plugin reports (the modelled GPU model is `--gpu-model`).
//! - Pods: every pod not yet finished that is bound to one of those nodes or waits with
//!   a claim on one of Tessera's DeviceClasses, with its containers' CPU and memory
//!   requests, arriving in creation order (seconds after the first), with no departure.
//! - GPU share, from what each claim asks (the operator's demand model): a whole GPU is
//!   1000 milli-GPU each; a MIG profile its compute slices over the model's (3g of 7:
//!   428); an MPS share its `computePercent` × 10, or 1000 / `--mps-max-clients` when it
//!   names none; a time-slice 1000 / 4 (the plugin's default clients). Several shares of
//!   one pod add up (at most one GPU); a pod with whole GPUs counts those. A claim in a
//!   form the operator cannot model is left out and reported.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::ResourceClaim,
};
use tessera_api::{
    GpuNode,
    quantity::{parse_cpu_milli, parse_mib},
};
use tessera_gpu::find_model;
use tessera_operator::demand::{Asks, Shape, asks};
use tessera_simulate::workload::{NodeSpec, PodSpec, WHOLE_GPU_MILLI, Workload};

/// The time-slicing clients a GPU takes when its policy names none.
const TIME_SLICE_CLIENTS: u32 = tessera_api::defaults::TIME_SLICING_MAX_CLIENTS;

/// What the cluster's objects become, with what was left out and why.
#[derive(Debug, Default)]
pub struct FromCluster {
    /// The workload.
    pub workload: Workload,
    /// One line per pod or claim left out.
    pub left_out: Vec<String>,
}

/// Reads the cluster the connection flags name.
pub fn read(
    connection: &crate::ConnectionArgs,
    model: &str,
    mps_max_clients: u32,
) -> anyhow::Result<FromCluster> {
    use kube::{Api, api::ListParams};
    let (nodes, gpunodes, pods, claims) = crate::live::block_on(async {
        let (client, _) = connection.client().await?;
        let lp = ListParams::default();
        anyhow::Ok((
            Api::<Node>::all(client.clone())
                .list(&lp)
                .await
                .context("listing Nodes")?,
            Api::<GpuNode>::all(client.clone())
                .list(&lp)
                .await
                .context("listing GpuNodes (are Tessera's CRDs installed?)")?,
            Api::<Pod>::all(client.clone())
                .list(&lp)
                .await
                .context("listing Pods")?,
            Api::<ResourceClaim>::all(client)
                .list(&lp)
                .await
                .context("listing ResourceClaims")?,
        ))
    })?;
    convert(
        &nodes.items,
        &gpunodes.items,
        &pods.items,
        &claims.items,
        model,
        mps_max_clients,
    )
}

/// The workload of these objects, for GPUs of `model`.
pub fn convert(
    nodes: &[Node],
    gpunodes: &[GpuNode],
    pods: &[Pod],
    claims: &[ResourceClaim],
    model: &str,
    mps_max_clients: u32,
) -> anyhow::Result<FromCluster> {
    let model = find_model(model)?;
    let gpus_of: BTreeMap<&str, u32> = gpunodes
        .iter()
        .filter_map(|g| {
            let n = g.status.as_ref().map_or(0, |s| s.gpu_count);
            Some((g.metadata.name.as_deref()?, n))
        })
        .collect();
    let mut out = FromCluster::default();
    for n in nodes {
        let Some(name) = n.metadata.name.as_deref() else {
            continue;
        };
        let Some(gpus) = gpus_of.get(name).copied() else {
            continue;
        };
        let allocatable = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let get = |k: &str| allocatable.and_then(|a| a.get(k)).map(|q| q.0.as_str());
        out.workload.nodes.push(NodeSpec {
            name: name.to_string(),
            cpu_milli: get("cpu").and_then(parse_cpu_milli).unwrap_or(0),
            memory_mib: get("memory").and_then(parse_mib).unwrap_or(0),
            gpus,
        });
    }
    out.workload.nodes.sort_by(|a, b| a.name.cmp(&b.name));

    let claim_of = |ns: &str, name: &str| {
        claims.iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(name)
        })
    };
    let compute_slices = model.mig.as_ref().map(|l| l.compute_slices);
    let mig_milli = |profile: Option<&str>| -> u32 {
        let slices = profile
            .and_then(|p| model.mig.as_ref()?.profile_by_name(p))
            .map(|p| u32::from(p.compute_slices))
            .or_else(|| profile?.split('g').next()?.parse().ok())
            .unwrap_or(1);
        let of = compute_slices.map_or(7, u32::from).max(1);
        (slices * WHOLE_GPU_MILLI / of).min(WHOLE_GPU_MILLI)
    };
    let mut live: Vec<(&Pod, u32, u32)> = Vec::new();
    for p in pods {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let pod_name = format!("{ns}/{}", p.metadata.name.as_deref().unwrap_or_default());
        let names = p
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|s| s.resource_claim_name.clone())
            .chain(
                p.spec
                    .as_ref()
                    .and_then(|s| s.resource_claims.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.resource_claim_name.clone()),
            );
        let (mut whole, mut shared, mut ours) = (0u32, 0u32, false);
        for name in names {
            let Some(claim) = claim_of(ns, &name) else {
                continue;
            };
            match asks(&claim.spec) {
                Asks::Nothing => {}
                Asks::Unmodelled(why) => {
                    out.left_out
                        .push(format!("{pod_name}: claim {name} left out: {why}"));
                }
                Asks::Shapes(requests) => {
                    ours = true;
                    for r in &requests {
                        // The simulator replays one shape per request: the first choice.
                        let Some((shape, count)) = r.alternatives.first() else {
                            continue;
                        };
                        match shape {
                            Shape::Whole => whole += count,
                            Shape::Mig { profile } => {
                                shared += count * mig_milli(profile.as_deref());
                            }
                            Shape::Mps {
                                compute_percent, ..
                            } => {
                                shared += count
                                    * compute_percent
                                        .map_or(WHOLE_GPU_MILLI / mps_max_clients.max(1), |c| {
                                            c.min(100) * 10
                                        });
                            }
                            Shape::TimeSlice => {
                                shared += count * (WHOLE_GPU_MILLI / TIME_SLICE_CLIENTS);
                            }
                        }
                    }
                }
            }
        }
        let on_gpu_node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| gpus_of.contains_key(n));
        if !ours && !on_gpu_node {
            continue;
        }
        let (gpus, milli) = if whole > 0 {
            (whole, WHOLE_GPU_MILLI)
        } else if shared > 0 {
            (1, shared.min(WHOLE_GPU_MILLI))
        } else {
            (0, 0)
        };
        live.push((p, gpus, milli));
    }
    let created = |p: &Pod| {
        p.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
    };
    let first = live
        .iter()
        .filter_map(|(p, _, _)| created(p))
        .min()
        .unwrap_or(0);
    live.sort_by_key(|(p, _, _)| (created(p), p.metadata.name.clone()));
    for (p, gpus, milli) in live {
        let (cpu, mem) = requests(p);
        out.workload.pods.push(PodSpec {
            name: format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            ),
            cpu_milli: cpu,
            memory_mib: mem,
            gpus,
            gpu_milli: milli,
            arrival: created(p).map_or(0, |t| u64::try_from(t - first).unwrap_or(0)),
            departure: None,
        });
    }
    Ok(out)
}

/// The pod's CPU (millicores) and memory (MiB) requests, as the scheduler counts them.
fn requests(p: &Pod) -> (u64, u64) {
    let r = tessera_operator::room::pod_requests(p);
    (r.cpu_milli, r.memory_bytes.div_ceil(1024 * 1024))
}

#[cfg(test)]
mod tests;
