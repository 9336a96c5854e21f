//! `kubectl tessera why POD`: why a pod's GPU claims wait, and what would let it run.
//!
//! For each claim of the pod that has no allocation, each shape it asks for (the forms
//! the operator models, `operator::demand`) is checked against this driver's published
//! devices by the free-device rules the operator's planner uses (`operator::free`):
//! no GPU offers the shape, every device of it is held, its hardware is used by other
//! partitions (the shared counters), its capacity is used up, or a taint keeps claims off
//! it; GPUs whose spec and status disagree are changing shape (an Adaptive move or a
//! policy edit in progress). For each GPU node it says whether the pod could run there
//! apart from devices, by the scheduler's filters the planner applies
//! (`operator::room`: CPU, memory, pod count, node selector and affinity, taints, cordon),
//! so free devices on nodes the pod cannot use are told apart. It only reads. [`explain`] is pure; the I/O is apart.

mod render;
#[cfg(test)]
mod tests;

use std::{collections::BTreeMap, io::Write, sync::Arc};

use anyhow::Context;
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::{ResourceClaim, ResourceSlice},
};
use serde::Serialize;
use tessera_api::{
    GpuNode, GpuSharingPolicy, claims::allocated_devices, constants::DRIVER_NAME,
    policy::SharingStrategy,
};
use tessera_operator::{
    demand::{Asks, Shape, asks},
    free::{ShapeDevices, explain as explain_shape},
    room::{Resources, Rooms, misfit},
    usage::Supply,
};

use crate::{ConnectionArgs, Output};

/// Claims named as holders before "and N more".
const HOLDERS: usize = 5;

/// `kubectl tessera why --help` examples.
pub const EXAMPLES: &str = "Examples:
  # A pod of the current context's namespace
  kubectl tessera why trainer-0
  # A pod of another namespace, with the device counts behind each verdict
  kubectl tessera why trainer-0 -n ml -o wide";

/// `kubectl tessera why` flags.
#[derive(Debug, clap::Args)]
pub struct WhyArgs {
    /// The pod.
    pub pod: String,
    /// Its namespace (default: the kubeconfig context's namespace, as kubectl).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Output format: table (the verdicts), wide (with the device counts behind each),
    /// json or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Connection flags.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// The answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    /// `namespace/name`.
    pub pod: String,
    /// The pod's phase.
    pub phase: String,
    /// What the scheduler said (`PodScheduled`), when it has not placed the pod.
    pub scheduler: Option<String>,
    /// One per claim of the pod.
    pub claims: Vec<ClaimWhy>,
    /// GPUs changing shape now (spec and status disagree), as `node GPU i: A -> B`.
    pub changing: Vec<String>,
    /// Whether the pod could run on each GPU node, devices aside.
    pub nodes: Vec<NodeFit>,
}

/// Whether the pod could run on one GPU node, devices aside.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFit {
    /// The node.
    pub node: String,
    /// Why the pod cannot run there; `None` when it can.
    pub misfit: Option<String>,
}

/// One claim.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimWhy {
    /// `namespace/name`.
    pub claim: String,
    /// Its allocation, `node: device, …`, once it has one.
    pub allocated: Option<String>,
    /// What it asks of Tessera, by request and alternative; empty once allocated.
    pub shapes: Vec<ShapeWhy>,
    /// Why nothing is checked: the claim asks no Tessera class, or in a form Tessera
    /// cannot model, or it does not exist yet.
    pub note: Option<String>,
}

/// One shape a request asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShapeWhy {
    /// The request's name.
    pub request: String,
    /// The shape, e.g. `MIG 3g.40gb`, and how many devices.
    pub shape: String,
    /// Devices needed.
    pub count: u32,
    /// What keeps each published device of the shape from the claim.
    pub published: u32,
    /// Free now.
    pub free: u32,
    /// Held by other claims.
    pub held: u32,
    /// Their hardware used by other partitions (counters).
    pub counters_used_up: u32,
    /// Shared devices with capacity or client slots used up.
    pub capacity_used_up: u32,
    /// Tainted (a fault, a GPU changing shape).
    pub tainted: u32,
    /// The verdict, in a sentence.
    pub verdict: String,
    /// What would let it run.
    pub remedies: Vec<String>,
}

/// Reads the cluster and prints the answer.
pub fn run(args: &WhyArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let cluster = crate::live::block_on(read(args))?;
    crate::live::print(out, args.output, &explain(&cluster), render::text)
}

/// What [`explain`] reads.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// The pod.
    pub pod: Pod,
    /// Every ResourceClaim (the pod's and those holding devices).
    pub claims: Vec<Arc<ResourceClaim>>,
    /// This driver's ResourceSlices.
    pub slices: Vec<Arc<ResourceSlice>>,
    /// Every policy.
    pub policies: Vec<GpuSharingPolicy>,
    /// Every GpuNode.
    pub gpunodes: Vec<GpuNode>,
    /// Every Node.
    pub nodes: Vec<Node>,
    /// Every pod bound to a node.
    pub bound: Vec<Pod>,
}

async fn read(args: &WhyArgs) -> anyhow::Result<Cluster> {
    use kube::{Api, api::ListParams};
    let (client, context_namespace) = args.connection.client().await?;
    let namespace = args.namespace.clone().unwrap_or(context_namespace);
    let pod = Api::<Pod>::namespaced(client.clone(), &namespace)
        .get_opt(&args.pod)
        .await
        .with_context(|| format!("reading pod {namespace}/{}", args.pod))?
        .with_context(|| format!("pod {namespace}/{} does not exist", args.pod))?;
    let claims = Api::<ResourceClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing ResourceClaims")?;
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
        .await
        .context("listing ResourceSlices")?;
    let policies = Api::<GpuSharingPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing GpuSharingPolicies (are Tessera's CRDs installed?)")?;
    let gpunodes = Api::<GpuNode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing GpuNodes")?;
    // Where the pod could run needs every Node and bound pod; a kubeconfig that may not
    // list them still gets the rest of the answer.
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let bound = Api::<Pod>::all(client)
        .list(
            &ListParams::default()
                .fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
        )
        .await;
    let (nodes, bound) = match (nodes, bound) {
        (Ok(n), Ok(b)) => (n.items, b.items),
        _ => (Vec::new(), Vec::new()),
    };
    Ok(Cluster {
        pod,
        claims: claims.items.into_iter().map(Arc::new).collect(),
        slices: slices.items.into_iter().map(Arc::new).collect(),
        policies: policies.items,
        gpunodes: gpunodes.items,
        nodes,
        bound,
    })
}

/// Why the pod's claims wait.
pub fn explain(c: &Cluster) -> Why {
    let ns = c.pod.metadata.namespace.clone().unwrap_or_default();
    let status = c.pod.status.as_ref();
    let scheduler = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .filter(|c| c.status != "True")
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.as_deref().unwrap_or("not scheduled"),
                c.message.as_deref().unwrap_or("")
            )
        });
    let supply = Supply::read(
        c.slices.iter().map(AsRef::as_ref),
        c.claims.iter().map(AsRef::as_ref),
        Default::default(),
    );
    let nodes = node_fits(c);
    let cannot: BTreeMap<&str, &str> = nodes
        .iter()
        .filter_map(|n| Some((n.node.as_str(), n.misfit.as_deref()?)))
        .collect();
    // The claim names the pod uses: generated ones from its status, named ones from its
    // spec.
    let generated = status
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| s.resource_claim_name.clone());
    let named = c
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|r| r.resource_claim_name.clone());
    let mut names: Vec<String> = generated.chain(named).collect();
    names.sort();
    names.dedup();
    let templates_pending = c
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|r| r.iter().any(|r| r.resource_claim_template_name.is_some()))
        && status
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .is_none_or(Vec::is_empty);
    let mut claims: Vec<ClaimWhy> = names
        .iter()
        .map(|name| {
            let found = c.claims.iter().find(|cl| {
                cl.metadata.namespace.as_deref() == Some(ns.as_str())
                    && cl.metadata.name.as_deref() == Some(name.as_str())
            });
            match found {
                Some(claim) => claim_why(claim, &supply, &c.policies, &cannot),
                None => ClaimWhy {
                    claim: format!("{ns}/{name}"),
                    note: Some("the claim does not exist (yet)".into()),
                    ..ClaimWhy::default()
                },
            }
        })
        .collect();
    if templates_pending {
        claims.push(ClaimWhy {
            claim: "(from a template)".into(),
            note: Some(
                "the resourceclaim controller has not made the pod's claims from their templates yet"
                    .into(),
            ),
            ..ClaimWhy::default()
        });
    }
    Why {
        pod: format!("{ns}/{}", c.pod.metadata.name.clone().unwrap_or_default()),
        phase: status
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into()),
        scheduler,
        claims,
        changing: changing(&c.gpunodes),
        nodes,
    }
}

/// Whether the pod could run on each GPU node (a node with a GpuNode), apart from devices.
/// Without the Node objects (a kubeconfig that cannot list them) nothing is said.
fn node_fits(c: &Cluster) -> Vec<NodeFit> {
    if c.nodes.is_empty() {
        return Vec::new();
    }
    let rooms = Rooms::read(
        &c.nodes,
        c.bound
            .iter()
            .filter(|p| p.metadata.uid != c.pod.metadata.uid),
        [&c.pod],
    );
    let Some(needs) = rooms.pods.values().next() else {
        return Vec::new();
    };
    let mut out: Vec<NodeFit> = c
        .gpunodes
        .iter()
        .filter_map(|g| g.metadata.name.clone())
        .map(|node| {
            let misfit = match rooms.nodes.get(&node) {
                Some(room) => {
                    misfit(needs, &node, room, &Resources::default()).map(|m| m.to_string())
                }
                None => Some("no Node object".into()),
            };
            NodeFit { node, misfit }
        })
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

fn claim_why(
    claim: &ResourceClaim,
    supply: &Supply,
    policies: &[GpuSharingPolicy],
    cannot: &BTreeMap<&str, &str>,
) -> ClaimWhy {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let results = allocated_devices(claim);
    if !results.is_empty() {
        let devices: Vec<String> = results
            .iter()
            .map(|r| format!("{}: {}", r.pool, r.device))
            .collect();
        return ClaimWhy {
            claim: name,
            allocated: Some(devices.join(", ")),
            ..ClaimWhy::default()
        };
    }
    let requests = match asks(&claim.spec) {
        Asks::Nothing => {
            return ClaimWhy {
                claim: name,
                note: Some("it asks none of Tessera's DeviceClasses; Tessera cannot tell".into()),
                ..ClaimWhy::default()
            };
        }
        Asks::Unmodelled(why) => {
            return ClaimWhy {
                claim: name,
                note: Some(format!(
                    "it asks Tessera's classes in a form Tessera does not model ({why}); see the README's Demand section for the forms it does"
                )),
                ..ClaimWhy::default()
            };
        }
        Asks::Shapes(requests) => requests,
    };
    let shapes = requests
        .iter()
        .flat_map(|r| {
            r.alternatives.iter().map(|(shape, count)| {
                shape_why(
                    &r.name,
                    shape,
                    *count,
                    &explain_shape(shape, supply),
                    policies,
                    cannot,
                )
            })
        })
        .collect();
    ClaimWhy {
        claim: name,
        shapes,
        ..ClaimWhy::default()
    }
}

fn shape_why(
    request: &str,
    shape: &Shape,
    count: u32,
    d: &ShapeDevices,
    policies: &[GpuSharingPolicy],
    cannot: &BTreeMap<&str, &str>,
) -> ShapeWhy {
    let strategy = shape.strategy();
    let out_of_reach: Vec<String> = d
        .free_on
        .iter()
        .filter_map(|n| Some(format!("{n}: {}", cannot.get(n.as_str())?)))
        .collect();
    let (verdict, remedies) = if d.published == 0 {
        (
            format!("no GPU offers {shape}"),
            no_offer_remedies(shape, strategy, policies),
        )
    } else if d.free >= count && !d.free_on.is_empty() && out_of_reach.len() == d.free_on.len() {
        let mut remedies = vec![
            "make room for the pod on one of those nodes (its CPU, memory or pods), or let it run there (node selector, affinity, tolerations)".to_string(),
        ];
        if !adaptive_offering(strategy, policies).is_empty() {
            remedies.push(
                "an Adaptive policy moves an idle GPU for it only on a node where it could run (see the nodes below)".into(),
            );
        }
        (
            format!(
                "{} free device(s) of this shape, but the pod cannot run on their nodes ({})",
                d.free,
                out_of_reach.join("; ")
            ),
            remedies,
        )
    } else if d.free >= count {
        let nodes: Vec<&str> = d.free_on.iter().map(String::as_str).collect();
        (
            format!(
                "{} free device(s) of this shape could hold it (on {})",
                d.free,
                nodes.join(", ")
            ),
            vec![
                "the scheduler has not placed the pod yet, or it waits for something other than a GPU: read the scheduler's message above (CPU, memory, node affinity, taints)".into(),
            ],
        )
    } else {
        let mut parts = Vec::new();
        for (n, what) in [
            (d.held, "held by other claims"),
            (
                d.counters_used_up,
                "on hardware other partitions use (overlapping placements, or a whole GPU with a partition on it)",
            ),
            (
                d.capacity_used_up,
                "shared and full (clients or capacity used up)",
            ),
            (
                d.tainted,
                "tainted (a GPU fault, or the GPU is changing shape)",
            ),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        let holders: Vec<&str> = d.holders.iter().map(String::as_str).take(HOLDERS).collect();
        let more = d.holders.len().saturating_sub(HOLDERS);
        let mut remedies = vec![format!(
            "it runs once a claim on those GPUs ends ({}{}): delete a pod that holds one, or wait",
            holders.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )];
        if d.tainted > 0 {
            remedies.push(
                "`kubectl tessera status` shows which GPU is unhealthy or changing shape".into(),
            );
        }
        if adaptive_offering(strategy, policies).is_empty() {
            remedies.push(format!(
                "more of them: a policy with strategy {} on more GPUs (or an Adaptive policy with {} among its strategies, which moves idle GPUs for waiting claims)",
                strategy.as_str(),
                strategy.as_str()
            ));
        }
        (
            format!(
                "every device of this shape is taken ({} published: {})",
                d.published,
                parts.join(", ")
            ),
            remedies,
        )
    };
    ShapeWhy {
        request: request.to_string(),
        shape: shape.to_string(),
        count,
        published: d.published,
        free: d.free,
        held: d.held,
        counters_used_up: d.counters_used_up,
        capacity_used_up: d.capacity_used_up,
        tainted: d.tainted,
        verdict,
        remedies,
    }
}

/// Adaptive policies that list `strategy`.
fn adaptive_offering(strategy: SharingStrategy, policies: &[GpuSharingPolicy]) -> Vec<String> {
    policies
        .iter()
        .filter(|p| p.spec.strategy == SharingStrategy::Adaptive)
        .filter(|p| {
            p.spec
                .adaptive
                .as_ref()
                .is_some_and(|a| a.strategies.contains(&strategy))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

fn no_offer_remedies(
    shape: &Shape,
    strategy: SharingStrategy,
    policies: &[GpuSharingPolicy],
) -> Vec<String> {
    let mut out = Vec::new();
    let fixed: Vec<String> = policies
        .iter()
        .filter(|p| p.spec.strategy == strategy)
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    if let Shape::Mig { profile: Some(p) } = shape {
        if !fixed.is_empty() {
            out.push(format!(
                "policies with strategy MIG ({}) offer no {p} now: it is not in their allowedProfiles, their static layout has none, or the GPUs they govern do not have that profile (`kubectl tessera profiles`)",
                fixed.join(", ")
            ));
        }
    } else if !fixed.is_empty() {
        out.push(format!(
            "policies with strategy {} ({}) govern no GPU now: check their nodeSelector and gpuSelector (`kubectl get gsp` shows NoMatchingNodes)",
            strategy.as_str(),
            fixed.join(", ")
        ));
    }
    let adaptive = adaptive_offering(strategy, policies);
    if adaptive.is_empty() {
        out.push(format!(
            "apply a GpuSharingPolicy with strategy {} for nodes whose GPUs can do it (config/samples has one per strategy), or add {} to an Adaptive policy's strategies",
            strategy.as_str(),
            strategy.as_str()
        ));
    } else {
        out.push(format!(
            "Adaptive policy {} moves an idle GPU to {} once the pod has waited --demand-dwell-seconds: `kubectl describe gsp` lists the claim under unmetClaims and the move under lastChanges; no move means no GPU of it is idle",
            adaptive.join(", "),
            strategy.as_str()
        ));
    }
    out
}

/// GPUs whose spec asks another strategy than the plugin applied.
fn changing(gpunodes: &[GpuNode]) -> Vec<String> {
    let mut out = Vec::new();
    for g in gpunodes {
        let Some(status) = &g.status else {
            continue;
        };
        for gpu in &status.gpus {
            let want = g
                .spec
                .gpus
                .iter()
                .find(|c| c.index == gpu.index)
                .map(|c| c.strategy)
                .filter(|s| *s != SharingStrategy::Adaptive);
            if let (Some(want), Some(now)) = (want, gpu.strategy)
                && want != now
            {
                out.push(format!(
                    "{} GPU {}: {} -> {}",
                    g.metadata.name.as_deref().unwrap_or_default(),
                    gpu.index,
                    now.as_str(),
                    want.as_str()
                ));
            }
        }
    }
    out
}
