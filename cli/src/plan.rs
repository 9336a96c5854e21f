//! `kubectl tessera plan -f POLICY`: what applying policies would do, before they are
//! applied. The cluster is read once and resolved twice by the operator's own pure
//! resolution (`tessera_operator::resolve`), as it stands and with the file's policies
//! applied; the difference is the plan: which GPUs would change shape now, which wait for
//! the claims that hold them, which cannot take the configuration, and which would be
//! left in a priority tie. It only reads, so a GitOps pipeline can print it for a merge
//! request. (The API server's own checks are `kubectl apply --dry-run=server -f`.)

mod render;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    path::PathBuf,
};

use anyhow::Context;
use k8s_openapi::api::{
    core::v1::Node,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use serde::{Deserialize, Serialize};
use tessera_api::{
    GpuNode, GpuSharingPolicy, constants::DRIVER_NAME, gpunode::GpuConfig, policy::SharingStrategy,
};
use tessera_operator::{
    resolve::{NodeView, PolicyView, Resolution, Snapshot, resolve},
    usage::Supply,
};

use crate::{ConnectionArgs, Output};

/// `kubectl tessera plan --help` examples.
pub const EXAMPLES: &str = "Examples:
  # What a policy edit would reshape, before it is merged
  kubectl tessera plan -f config/samples/05-adaptive.yaml
  # Several files, from a pipeline, as JSON
  kubectl tessera plan -f inference.yaml -f training.yaml -o json
  # From standard input
  kustomize build overlays/prod | kubectl tessera plan -f -";

/// `kubectl tessera plan` flags.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Policy manifests to preview (YAML, several documents each; `-` reads standard
    /// input). Objects of other kinds are skipped.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Output format: table, wide (with the product and the policy before and after),
    /// json or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Connection flags.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// The plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Each policy of the files.
    pub policies: Vec<PolicyPlan>,
    /// Each GPU the files would affect, by node and index.
    pub gpus: Vec<GpuPlan>,
}

/// What one policy of the files would become.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyPlan {
    /// Its name.
    pub name: String,
    /// `created`, `changed` or `unchanged`.
    pub change: String,
    /// GPUs it governs now.
    pub gpus_before: u32,
    /// GPUs it would govern.
    pub gpus_after: u32,
    /// Nodes it would select that have GPUs.
    pub nodes_after: u32,
    /// What would stand in its way: priority ties, selectors that cannot be evaluated.
    pub problems: Vec<String>,
}

/// What would happen to one GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuPlan {
    /// `node/index`.
    pub gpu: String,
    /// Its product.
    pub product: String,
    /// Its configuration now, e.g. `MIG Dynamic` or `default` (no policy).
    pub now: String,
    /// The policy that governs it now.
    pub policy_now: Option<String>,
    /// The configuration it would get.
    pub after: String,
    /// The policy that would govern it.
    pub policy_after: Option<String>,
    /// `reshaped` (changes as soon as it is applied), `held` (waits for the claims that
    /// hold the GPU), `notApplicable` (the GPU cannot take it and keeps what it has),
    /// `conflicted` (a priority tie: it keeps what it has) or `governed` (only which
    /// policy governs it changes).
    pub outcome: String,
    /// The claims that would hold it back (`held`).
    pub claims: Vec<String>,
    /// Why it cannot take the configuration, or with whom it ties.
    pub detail: Option<String>,
}

/// What [`plan`] reads from the cluster.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Every policy.
    pub policies: Vec<GpuSharingPolicy>,
    /// Every Node (for their labels).
    pub nodes: Vec<Node>,
    /// Every GpuNode.
    pub gpunodes: Vec<GpuNode>,
    /// This driver's ResourceSlices.
    pub slices: Vec<ResourceSlice>,
    /// Every ResourceClaim.
    pub claims: Vec<ResourceClaim>,
}

/// Reads the files and the cluster and prints the plan.
pub fn run(args: &PlanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut changed = Vec::new();
    for file in &args.files {
        changed.extend(read_policies(file)?);
    }
    anyhow::ensure!(
        !changed.is_empty(),
        "no GpuSharingPolicy in {}",
        args.files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cluster = crate::live::block_on(read(&args.connection))?;
    crate::live::print(out, args.output, &plan(&cluster, &changed), render::table)
}

/// The GpuSharingPolicies of a manifest file (`-`: standard input).
pub fn read_policies(path: &std::path::Path) -> anyhow::Result<Vec<GpuSharingPolicy>> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        s
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    parse_policies(&text).with_context(|| format!("in {}", path.display()))
}

/// The GpuSharingPolicies among the YAML documents of `text`.
pub fn parse_policies(text: &str) -> anyhow::Result<Vec<GpuSharingPolicy>> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .with_context(|| format!("document {} is not YAML", i + 1))?;
        if value.is_null() || value.get("kind").and_then(|k| k.as_str()) != Some("GpuSharingPolicy")
        {
            continue;
        }
        let policy: GpuSharingPolicy = serde_yaml::from_value(value)
            .with_context(|| format!("document {} is not a valid GpuSharingPolicy", i + 1))?;
        anyhow::ensure!(
            policy.metadata.name.is_some(),
            "document {} has no metadata.name",
            i + 1
        );
        out.push(policy);
    }
    Ok(out)
}

async fn read(connection: &ConnectionArgs) -> anyhow::Result<Cluster> {
    use kube::{Api, api::ListParams};
    let (client, _) = connection.client().await?;
    let lp = ListParams::default();
    Ok(Cluster {
        policies: Api::<GpuSharingPolicy>::all(client.clone())
            .list(&lp)
            .await
            .context("listing GpuSharingPolicies (are Tessera's CRDs installed?)")?
            .items,
        nodes: Api::<Node>::all(client.clone())
            .list(&lp)
            .await
            .context("listing Nodes")?
            .items,
        gpunodes: Api::<GpuNode>::all(client.clone())
            .list(&lp)
            .await
            .context("listing GpuNodes")?
            .items,
        slices: Api::<ResourceSlice>::all(client.clone())
            .list(&ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")))
            .await
            .context("listing ResourceSlices")?
            .items,
        claims: Api::<ResourceClaim>::all(client)
            .list(&lp)
            .await
            .context("listing ResourceClaims")?
            .items,
    })
}

/// What resolution reads, built from the cluster's objects as the operator builds it:
/// Node labels, each GpuNode's spec and the GPUs its plugin reports, and the claims that
/// hold each GPU (allocated, or prepared by its plugin).
pub fn snapshot(cluster: &Cluster, policies: &[GpuSharingPolicy]) -> Snapshot {
    let supply = Supply::read(
        cluster.slices.iter(),
        cluster.claims.iter(),
        BTreeMap::new(),
    );
    let labels: BTreeMap<&str, BTreeMap<String, String>> = cluster
        .nodes
        .iter()
        .filter_map(|n| {
            Some((
                n.metadata.name.as_deref()?,
                n.metadata.labels.clone().unwrap_or_default(),
            ))
        })
        .collect();
    let nodes = cluster
        .gpunodes
        .iter()
        .filter_map(|g| {
            let name = g.metadata.name.clone()?;
            let gpus = g
                .status
                .as_ref()
                .map(|s| s.gpus.clone())
                .unwrap_or_default();
            Some((
                name.clone(),
                NodeView {
                    labels: labels.get(name.as_str()).cloned(),
                    spec: g.spec.clone(),
                    users: NodeView::claims_holding(supply.claims_on(&name), &gpus),
                    gpus,
                },
            ))
        })
        .collect();
    let mut policies: Vec<PolicyView> = policies
        .iter()
        .map(|p| PolicyView {
            name: p.metadata.name.clone().unwrap_or_default(),
            generation: p.metadata.generation,
            spec: p.spec.clone(),
        })
        .collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    Snapshot {
        policies,
        nodes,
        ..Snapshot::default()
    }
}

/// The plan of applying `changed` to `cluster` (pure).
pub fn plan(cluster: &Cluster, changed: &[GpuSharingPolicy]) -> Plan {
    let name = |p: &GpuSharingPolicy| p.metadata.name.clone().unwrap_or_default();
    let mut after_policies: Vec<GpuSharingPolicy> = cluster
        .policies
        .iter()
        .filter(|p| !changed.iter().any(|c| name(c) == name(p)))
        .cloned()
        .collect();
    after_policies.extend(changed.iter().cloned());
    let before_snapshot = snapshot(cluster, &cluster.policies);
    let after_snapshot = snapshot(cluster, &after_policies);
    let before = resolve(&before_snapshot);
    let after = resolve(&after_snapshot);
    let policies = changed
        .iter()
        .map(|p| {
            let existing = cluster.policies.iter().find(|q| name(q) == name(p));
            policy_plan(p, existing, &before, &after)
        })
        .collect();
    Plan {
        policies,
        gpus: gpu_plans(&after_snapshot, &before, &after, changed),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn policy_plan(
    p: &GpuSharingPolicy,
    existing: Option<&GpuSharingPolicy>,
    before: &Resolution,
    after: &Resolution,
) -> PolicyPlan {
    let name = p.metadata.name.clone().unwrap_or_default();
    let outcome = after.policies.get(&name).cloned().unwrap_or_default();
    let mut problems: Vec<String> = outcome
        .conflicts
        .iter()
        .map(|(other, gpus)| {
            format!(
                "priority {} ties with {other} on {} GPU(s): they keep what they have",
                p.spec.priority,
                gpus.len()
            )
        })
        .collect();
    problems.extend(outcome.selector_error.clone());
    if outcome.matched_nodes.is_empty() {
        problems.push("its nodeSelector selects no node with GPUs".into());
    }
    PolicyPlan {
        change: match existing {
            None => "created",
            Some(e) if e.spec == p.spec => "unchanged",
            Some(_) => "changed",
        }
        .into(),
        gpus_before: count(before.policies.get(&name).map_or(0, |o| o.governed.len())),
        gpus_after: count(outcome.governed.len()),
        nodes_after: count(outcome.matched_nodes.len()),
        problems,
        name,
    }
}

fn gpu_plans(
    snapshot: &Snapshot,
    before: &Resolution,
    after: &Resolution,
    changed: &[GpuSharingPolicy],
) -> Vec<GpuPlan> {
    let changed_names: BTreeSet<String> = changed
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    // Per GPU, what the new resolution says about it, from any policy's outcome.
    let mut held: BTreeMap<&str, (&str, &BTreeSet<String>)> = BTreeMap::new();
    let mut infeasible: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    let mut tied: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut governor: BTreeMap<&str, &str> = BTreeMap::new();
    for (policy, o) in &after.policies {
        for (gpu, (claims, _)) in &o.waiting {
            held.insert(gpu, (policy, claims));
        }
        for (gpu, why) in &o.infeasible {
            infeasible.insert(gpu, (policy, why));
        }
        for (other, gpus) in &o.conflicts {
            for gpu in gpus {
                tied.entry(gpu).or_default().insert(other);
                tied.entry(gpu).or_default().insert(policy);
            }
        }
        for gpu in &o.governed {
            governor.insert(gpu, policy);
        }
    }
    let strategy_of = |policy: &str| {
        snapshot
            .policies
            .iter()
            .find(|p| p.name == policy)
            .map(|p| p.spec.strategy)
    };
    let mut out = Vec::new();
    for (node, view) in &snapshot.nodes {
        let entry = |r: &Resolution, index: u32| -> Option<GpuConfig> {
            r.specs
                .get(node)?
                .gpus
                .iter()
                .find(|g| g.index == index)
                .cloned()
        };
        for gpu in &view.gpus {
            let key = format!("{node}/{}", gpu.index);
            let (now, then) = (entry(before, gpu.index), entry(after, gpu.index));
            let mut plan = GpuPlan {
                gpu: key.clone(),
                product: gpu.product_name.clone(),
                now: describe(now.as_ref()),
                policy_now: now.as_ref().and_then(|e| e.policy.clone()),
                after: describe(then.as_ref()),
                policy_after: governor.get(key.as_str()).map(|p| (*p).to_string()),
                ..GpuPlan::default()
            };
            let involves_change = |p: &str| changed_names.contains(p);
            if let Some((policy, claims)) = held.get(key.as_str()) {
                if !involves_change(policy)
                    && !changed_names
                        .iter()
                        .any(|c| plan.policy_now.as_deref() == Some(c))
                {
                    continue;
                }
                plan.outcome = "held".into();
                plan.after = strategy_of(policy)
                    .map_or_else(|| plan.after.clone(), |s| s.as_str().to_string());
                plan.claims = claims.iter().cloned().collect();
            } else if let Some((policy, why)) = infeasible.get(key.as_str()) {
                if !involves_change(policy) {
                    continue;
                }
                plan.outcome = "notApplicable".into();
                plan.detail = Some((*why).to_string());
            } else if let Some(policies) = tied.get(key.as_str()) {
                if !policies.iter().any(|p| involves_change(p)) {
                    continue;
                }
                plan.outcome = "conflicted".into();
                plan.detail = Some(format!(
                    "priority tie between {}",
                    policies.iter().copied().collect::<Vec<_>>().join(", ")
                ));
            } else if shape(now.as_ref()) != shape(then.as_ref()) {
                plan.outcome = "reshaped".into();
            } else if plan.policy_now != plan.policy_after {
                plan.outcome = "governed".into();
            } else {
                continue;
            }
            out.push(plan);
        }
    }
    out
}

/// An entry without what does not change the GPU's shape: who governs it, its UUID, what
/// the scheduler may switch it to.
fn shape(entry: Option<&GpuConfig>) -> Option<GpuConfig> {
    entry.map(|g| GpuConfig {
        policy: None,
        uuid: None,
        alternatives: Vec::new(),
        ..g.clone()
    })
}

/// A GPU's configuration in a few words.
fn describe(entry: Option<&GpuConfig>) -> String {
    let Some(e) = entry else {
        return "default".into();
    };
    match e.strategy {
        SharingStrategy::Mig => match &e.mig {
            Some(m) if !m.instances.is_empty() => {
                let mut profiles: Vec<&str> =
                    m.instances.iter().map(|i| i.profile.as_str()).collect();
                profiles.sort_unstable();
                format!("MIG static {}", profiles.join("+"))
            }
            Some(m) if !m.allowed_profiles.is_empty() => format!(
                "MIG dynamic {}",
                m.allowed_profiles
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => "MIG dynamic".into(),
        },
        SharingStrategy::Mps => format!(
            "MPS {} clients",
            e.mps
                .as_ref()
                .map_or(tessera_api::defaults::MPS_MAX_CLIENTS, |m| m.max_clients)
        ),
        SharingStrategy::TimeSlicing => format!(
            "TimeSlicing {} clients",
            e.time_slicing
                .as_ref()
                .map_or(tessera_api::defaults::TIME_SLICING_MAX_CLIENTS, |t| t
                    .max_clients)
        ),
        s => s.as_str().to_string(),
    }
}
