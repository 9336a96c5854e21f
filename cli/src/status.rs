//! `kubectl tessera status`: the live cluster's GPUs as Tessera sees them. Per node and
//! GPU: the strategy and the policy that governs it, health, the memory-slice map with
//! each MIG instance, its profile and the pod that holds it, the placements still free,
//! MPS shares as bars of compute and memory, and the pods on whole and time-sliced GPUs.
//!
//! It only reads (GpuNodes, this driver's ResourceSlices, ResourceClaims), so a read-only
//! kubeconfig does. [`view`] is a pure function of those objects; the I/O is apart.

mod render;
#[cfg(test)]
mod tests;

use std::{collections::BTreeMap, io::Write};

use anyhow::Context;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::Serialize;
use tessera_api::{
    GpuNode,
    constants::DRIVER_NAME,
    gpunode::{GpuHealth, GpuState, InstanceOrigin},
};
use tessera_gpu::{
    find_model,
    geometry::{Occupancy, Placement},
};

use crate::{ConnectionArgs, Output};

/// `kubectl tessera status --help` examples.
pub const EXAMPLES: &str = "Examples:
  # Every GPU node
  kubectl tessera status
  # One node, with GPU UUIDs
  kubectl tessera status --node gpu-node-1 -o wide
  # For a script, against another cluster
  kubectl tessera status -o json --context prod";

/// `kubectl tessera status` flags.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Only this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Output format: table (a picture per node), wide (with GPU UUIDs), json or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Connection flags.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// The cluster's GPUs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    /// Nodes with a GpuNode, by name.
    pub nodes: Vec<NodeView>,
}

/// One node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// `Ready` and `Applied` as `Type=Status (Reason)`; a false one with its message.
    pub conditions: Vec<String>,
    /// Its GPUs, by index.
    pub gpus: Vec<GpuView>,
}

/// One GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    /// Index on the node.
    pub index: u32,
    /// NVML product name.
    pub product: String,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// The strategy the plugin applied (`MIG`, `MPS`, …); absent before it applied one.
    pub strategy: Option<String>,
    /// The policy the operator resolved for the GPU; absent: the plugin's default.
    pub policy: Option<String>,
    /// `Healthy`, `Unhealthy` or `Unknown`, with the driver's reason.
    pub health: String,
    /// MIG: the memory-slice map.
    pub mig: Option<MigView>,
    /// MPS: the shares.
    pub mps: Option<MpsView>,
    /// Claims allocated devices of this GPU, with the pods that use them.
    pub claims: Vec<ClaimUse>,
}

/// A MIG GPU's memory slices.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigView {
    /// Memory slices of the GPU.
    pub memory_slices: u8,
    /// Live instances, by start.
    pub instances: Vec<InstanceView>,
    /// Placements a new instance could take now, by profile (`1g.10gb` → starts).
    pub free: BTreeMap<String, Vec<u8>>,
}

/// A live MIG instance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    /// Profile name.
    pub profile: String,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
    /// `namespace/name` of the claim using it.
    pub claim: Option<String>,
    /// `namespace/name` of the pods using that claim.
    pub pods: Vec<String>,
    /// Whether Tessera did not create it (it is reported and never destroyed).
    pub external: bool,
    /// Whether it belongs to the GPU's static layout.
    pub static_layout: bool,
}

/// An MPS GPU's shares.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsView {
    /// Whether the control daemon runs.
    pub daemon_running: bool,
    /// Framebuffer memory of the GPU, MiB (the bars' scale).
    pub memory_mib: u64,
    /// One per claim.
    pub shares: Vec<ShareView>,
}

/// One MPS share.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareView {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// `namespace/name` of its pods.
    pub pods: Vec<String>,
    /// Enforced active thread percentage.
    pub compute_percent: u32,
    /// Enforced pinned memory limit, MiB.
    pub memory_mib: u64,
}

/// A claim with devices of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimUse {
    /// `namespace/name`.
    pub claim: String,
    /// Its devices on this GPU.
    pub devices: Vec<String>,
    /// `namespace/name` of the pods it is reserved for.
    pub pods: Vec<String>,
}

/// Reads the cluster and prints it.
pub fn run(args: &StatusArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let (gpunodes, slices, claims) = crate::live::block_on(read(args))?;
    let mut view = view(&gpunodes, &slices, &claims);
    if let Some(node) = &args.node {
        view.nodes.retain(|n| &n.name == node);
        anyhow::ensure!(
            !view.nodes.is_empty(),
            "node {node} has no GpuNode: it runs no tessera-plugin, or it is not a node of this cluster"
        );
    }
    crate::live::print(out, args.output, &view, render::table)
}

async fn read(
    args: &StatusArgs,
) -> anyhow::Result<(Vec<GpuNode>, Vec<ResourceSlice>, Vec<ResourceClaim>)> {
    use kube::{Api, api::ListParams};
    let (client, _) = args.connection.client().await?;
    let gpunodes = Api::<GpuNode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing GpuNodes (are Tessera's CRDs installed?)")?;
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
        .await
        .context("listing ResourceSlices")?;
    let claims = Api::<ResourceClaim>::all(client)
        .list(&ListParams::default())
        .await
        .context("listing ResourceClaims")?;
    Ok((gpunodes.items, slices.items, claims.items))
}

/// The cluster as `kubectl tessera status` shows it.
pub fn view(
    gpunodes: &[GpuNode],
    slices: &[ResourceSlice],
    claims: &[ResourceClaim],
) -> ClusterView {
    // (pool, device) → GPU index, from the devices' `index` attribute.
    let mut gpu_of: BTreeMap<(String, String), u32> = BTreeMap::new();
    for s in slices {
        for d in s.spec.devices.iter().flatten() {
            let index = d
                .attributes
                .as_ref()
                .and_then(|a| a.get("index"))
                .and_then(|v| v.int)
                .and_then(|i| u32::try_from(i).ok());
            if let Some(i) = index {
                gpu_of.insert((s.spec.pool.name.clone(), d.name.clone()), i);
            }
        }
    }
    // (node, GPU index) → claims using it; claim → its pods.
    let mut uses: BTreeMap<(String, u32), Vec<ClaimUse>> = BTreeMap::new();
    let mut pods_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in claims {
        let ns = c.metadata.namespace.clone().unwrap_or_default();
        let name = format!("{ns}/{}", c.metadata.name.clone().unwrap_or_default());
        let status = c.status.as_ref();
        let pods: Vec<String> = status
            .and_then(|s| s.reserved_for.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.resource == "pods")
            .map(|r| format!("{ns}/{}", r.name))
            .collect();
        pods_of.insert(name.clone(), pods.clone());
        let results = status
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        let mut by_gpu: BTreeMap<(String, u32), Vec<String>> = BTreeMap::new();
        for r in results
            .into_iter()
            .flatten()
            .filter(|r| r.driver == DRIVER_NAME)
        {
            if let Some(i) = gpu_of.get(&(r.pool.clone(), r.device.clone())) {
                by_gpu
                    .entry((r.pool.clone(), *i))
                    .or_default()
                    .push(r.device.clone());
            }
        }
        for (key, devices) in by_gpu {
            uses.entry(key).or_default().push(ClaimUse {
                claim: name.clone(),
                devices,
                pods: pods.clone(),
            });
        }
    }
    let mut nodes: Vec<NodeView> = gpunodes
        .iter()
        .map(|g| node_view(g, &uses, &pods_of))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    ClusterView { nodes }
}

fn node_view(
    g: &GpuNode,
    uses: &BTreeMap<(String, u32), Vec<ClaimUse>>,
    pods_of: &BTreeMap<String, Vec<String>>,
) -> NodeView {
    let name = g.metadata.name.clone().unwrap_or_default();
    let status = g.status.clone().unwrap_or_default();
    let conditions = status
        .conditions
        .iter()
        .map(|c| {
            if c.status == "True" {
                format!("{}=True ({})", c.type_, c.reason)
            } else {
                format!("{}={} ({}): {}", c.type_, c.status, c.reason, c.message)
            }
        })
        .collect();
    let mut gpus: Vec<GpuView> = status
        .gpus
        .iter()
        .map(|s| {
            let spec = g.spec.gpus.iter().find(|c| c.index == s.index);
            let allowed = spec
                .and_then(|c| c.mig.as_ref())
                .map(|m| {
                    m.allowed_profiles
                        .iter()
                        .map(|p| p.as_str().to_string())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            GpuView {
                index: s.index,
                product: s.product_name.clone(),
                uuid: s.uuid.clone(),
                strategy: s.strategy.map(|x| x.as_str().to_string()),
                policy: spec.and_then(|c| c.policy.clone()),
                health: health(s),
                mig: s.mig_enabled.then(|| mig_view(s, &allowed, pods_of)),
                mps: s.mps.as_ref().map(|m| MpsView {
                    daemon_running: m.daemon_running,
                    memory_mib: s.memory_mi_b,
                    shares: m
                        .clients
                        .iter()
                        .map(|c| {
                            let claim = format!("{}/{}", c.claim.namespace, c.claim.name);
                            ShareView {
                                pods: pods_of.get(&claim).cloned().unwrap_or_default(),
                                claim,
                                compute_percent: c.active_thread_percentage,
                                memory_mib: c.pinned_memory_limit_mi_b,
                            }
                        })
                        .collect(),
                }),
                claims: uses
                    .get(&(name.clone(), s.index))
                    .cloned()
                    .unwrap_or_default(),
            }
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    NodeView {
        name,
        conditions,
        gpus,
    }
}

fn health(s: &GpuState) -> String {
    let word = match s.health {
        GpuHealth::Healthy => "Healthy",
        GpuHealth::Unhealthy => "Unhealthy",
        GpuHealth::Unknown => "Unknown",
    };
    match &s.health_message {
        Some(m) if s.health != GpuHealth::Healthy => format!("{word}: {m}"),
        _ => word.to_string(),
    }
}

/// The memory-slice map of a MIG GPU and the placements still free (of the profiles its
/// spec allows, every profile when it names none), by the GPU model's geometry.
fn mig_view(s: &GpuState, allowed: &[String], pods_of: &BTreeMap<String, Vec<String>>) -> MigView {
    let mut instances: Vec<InstanceView> = s
        .instances
        .iter()
        .map(|i| {
            let claim = i
                .claim
                .as_ref()
                .map(|c| format!("{}/{}", c.namespace, c.name));
            InstanceView {
                profile: i.profile.clone(),
                start: i.placement_start,
                size: i.placement_size,
                pods: claim
                    .as_ref()
                    .and_then(|c| pods_of.get(c).cloned())
                    .unwrap_or_default(),
                claim,
                external: i.origin == InstanceOrigin::External,
                static_layout: i.static_layout,
            }
        })
        .collect();
    instances.sort_by_key(|i| i.start);
    let Some(layout) = find_model(&s.product_name)
        .ok()
        .and_then(|m| m.mig.as_ref())
    else {
        return MigView {
            memory_slices: 0,
            instances,
            free: BTreeMap::new(),
        };
    };
    let live: Vec<Placement> = s
        .instances
        .iter()
        .filter_map(|i| {
            let p = layout.profile_by_name(&i.profile)?;
            Some(Placement {
                profile_id: p.profile_id,
                start: u8::try_from(i.placement_start).ok()?,
            })
        })
        .collect();
    let occupancy = Occupancy::from_placements(layout, &live).unwrap_or_default();
    let free = layout
        .profiles
        .iter()
        .filter(|p| allowed.is_empty() || allowed.contains(&p.name))
        .filter_map(|p| {
            let starts: Vec<u8> = p
                .starts
                .iter()
                .filter(|start| {
                    occupancy.can_place(
                        layout,
                        Placement {
                            profile_id: p.profile_id,
                            start: *start,
                        },
                    )
                })
                .collect();
            (!starts.is_empty()).then(|| (p.name.clone(), starts))
        })
        .collect();
    MigView {
        memory_slices: layout.memory_slices,
        instances,
        free,
    }
}
