//! Faults that race a GPU's change of shape against the scheduler and the plugin: a
//! policy edit landing while a claim of the old shape is being allocated, the plugin
//! restarted while such a change is pending, an Adaptive move racing a pod of the shape
//! the GPU is leaving (half of them asking through an extended resource, which has no
//! claim until the scheduler binds it), and a MIG instance the driver refuses to destroy
//! when the plugin's start-up recovery rolls back a half-made claim.

use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use rand::{Rng, seq::IndexedRandom};
use serde_json::json;
use tessera_api::GpuNode;

use super::{Campaign, Fault, NAMESPACE, SETTLE};
use crate::{
    cluster::{self, GpuRequest},
    wait::eventually,
};

/// The node whose policy the edits cycle, and that policy.
pub(super) const EDITED_NODE: &str = "chaos-dev";
const EDITED_POLICY: &str = "dev-time-slicing";
/// The node under the Adaptive policy, and that policy.
pub(super) const ADAPTIVE_NODE: &str = "chaos-research";
pub(super) const ADAPTIVE_POLICY: &str = "research-adaptive";

/// The shapes the edited policy cycles through: its strategy, and the merge patch that
/// makes it (the blocks of other strategies removed, as the API server's rules want).
fn edits() -> [(&'static str, serde_json::Value); 3] {
    [
        (
            "MIG",
            json!({"spec": {"strategy": "MIG", "mig": {"mode": "Dynamic"}, "timeSlicing": null}}),
        ),
        (
            "Exclusive",
            json!({"spec": {"strategy": "Exclusive", "mig": null, "timeSlicing": null}}),
        ),
        (
            "TimeSlicing",
            json!({"spec": {"strategy": "TimeSlicing", "mig": null,
                "timeSlicing": {"interval": "Long", "maxClients": 4}}}),
        ),
    ]
}

/// A pod request of the shape `strategy` names, on any GPU that offers it.
fn request_for(strategy: &str) -> GpuRequest<'static> {
    match strategy {
        "MIG" => GpuRequest {
            class: "mig.tessera.dev",
            selector: Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
            capacity: None,
        },
        "MPS" => GpuRequest {
            class: "mps.tessera.dev",
            selector: None,
            capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
        },
        "TimeSlicing" => GpuRequest {
            class: "timeslice.tessera.dev",
            selector: None,
            capacity: None,
        },
        _ => GpuRequest {
            class: "gpu.tessera.dev",
            selector: None,
            capacity: None,
        },
    }
}

/// The DeviceClass of a strategy, for a pod that asks through its extended resource.
fn class_for(strategy: &str) -> &'static str {
    request_for(strategy).class
}

impl Campaign<'_> {
    /// The strategy the edited policy has now.
    async fn edited_strategy(&self) -> anyhow::Result<String> {
        let policies: Api<tessera_api::GpuSharingPolicy> = Api::all(self.client.clone());
        let p = policies.get(EDITED_POLICY).await?;
        Ok(p.spec.strategy.as_str().to_string())
    }

    /// A pod of the edited node's current shape arrives (its claim is being allocated),
    /// and a random 0–500 ms later the policy moves on to its next shape; with `restart`,
    /// the node's plugin is killed and restarted right after the edit, while the change is
    /// fenced. Recovery is the edit to the GPU offering the new shape, or to its status
    /// naming the claim that holds it in the old one.
    pub(super) async fn edit_policy(&mut self, restart: bool) -> anyhow::Result<()> {
        let now = self.edited_strategy().await?;
        let cycle = edits();
        let pos = cycle.iter().position(|(s, _)| *s == now).unwrap_or(2);
        let (next, patch) = cycle[(pos + 1) % cycle.len()].clone();
        self.create_pod_on(
            &format!("edit-{}", now.to_lowercase()),
            request_for(&now),
            Some(EDITED_NODE),
        )
        .await?;
        let wait = Duration::from_millis(self.rng.random_range(0..500));
        tokio::time::sleep(wait).await;
        let policies: Api<tessera_api::GpuSharingPolicy> = Api::all(self.client.clone());
        let t0 = Instant::now();
        policies
            .patch(
                EDITED_POLICY,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .with_context(|| format!("editing {EDITED_POLICY} to {next}"))?;
        let fault = if restart {
            // Once the operator has taken the edit in, the change is pending on the node:
            // fenced, or held back by the claim just allocated. A restart now must fence it
            // again from what the plugin recorded, not apply it on empty caches.
            self.policy_observed(EDITED_POLICY).await?;
            self.node_mut(EDITED_NODE)?.restart().await?;
            self.serving(EDITED_NODE).await?;
            Fault::PluginRestartMidChange
        } else {
            Fault::PolicyEdit
        };
        // The statuses below speak of the edit once the operator has taken it in.
        self.policy_observed(EDITED_POLICY).await?;
        let gpunodes: Api<GpuNode> = Api::all(self.client.clone());
        eventually(
            &format!("{EDITED_NODE} to offer {next}, or a status to say which claims hold it"),
            SETTLE,
            || async {
                let g = gpunodes.get(EDITED_NODE).await.ok()?;
                let status = g.status?;
                let offers = status
                    .gpus
                    .first()
                    .and_then(|g| g.strategy)
                    .is_some_and(|s| s.as_str() == next);
                let waits =
                    |conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
                        conditions.iter().any(|c| {
                            c.status == "True"
                                && c.type_ == tessera_api::conditions::types::PROGRESSING
                                && c.reason == tessera_api::conditions::reasons::WAITING_FOR_CLAIMS
                                || c.status == "False"
                                    && c.type_ == tessera_api::conditions::types::APPLIED
                                    && c.reason == tessera_api::conditions::reasons::REPARTITIONING
                        })
                    };
                let policy = policies.get(EDITED_POLICY).await.ok()?;
                let held = waits(&status.conditions)
                    || policy.status.is_some_and(|p| waits(&p.conditions));
                (offers || held).then_some(())
            },
        )
        .await?;
        self.report.recovered(fault.name(), t0.elapsed());
        Ok(())
    }

    /// Waits until the operator has resolved the policy's latest generation.
    async fn policy_observed(&self, policy: &str) -> anyhow::Result<()> {
        let policies: Api<tessera_api::GpuSharingPolicy> = Api::all(self.client.clone());
        eventually(
            &format!("the operator to take in the edit of {policy}"),
            SETTLE,
            || async {
                let p = policies.get(policy).await.ok()?;
                let seen = p.status.as_ref()?.observed_generation;
                (seen.is_some() && seen == p.metadata.generation).then_some(())
            },
        )
        .await?;
        Ok(())
    }

    /// A pod held to the Adaptive node asks for the shape its GPU does not offer now, so
    /// the planner moves the GPU once it is idle; a random 0–500 ms later a pod of the
    /// shape the GPU is leaving arrives for the same node and races the move. Half the
    /// time both ask through their class's extended resource instead of a claim.
    /// Recovery is the first pod to arrive running, or either of them running once the
    /// GPU could not be moved (the other shape's pods hold it).
    pub(super) async fn race_adaptive_move(&mut self) -> anyhow::Result<()> {
        let gpunodes: Api<GpuNode> = Api::all(self.client.clone());
        let now = gpunodes
            .get(ADAPTIVE_NODE)
            .await?
            .spec
            .gpus
            .first()
            .map(|c| c.strategy.as_str().to_string())
            .unwrap_or_else(|| "MIG".into());
        let wanted = if now == "MIG" { "MPS" } else { "MIG" };
        let extended = self.rng.random_bool(0.5);
        let t0 = Instant::now();
        let first = self.pod_for_adaptive(wanted, extended).await?;
        let wait = Duration::from_millis(self.rng.random_range(0..500));
        tokio::time::sleep(wait).await;
        let second = self.pod_for_adaptive(&now, extended).await?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        eventually(
            &format!("{first} or {second} to run on {ADAPTIVE_NODE}"),
            SETTLE,
            || async {
                for name in [&first, &second] {
                    let running = pods.get_opt(name).await.ok().flatten().is_some_and(|p| {
                        p.status.and_then(|s| s.phase).as_deref() == Some("Running")
                    });
                    if running {
                        return Some(());
                    }
                }
                None
            },
        )
        .await?;
        if extended {
            self.report.extended_resource_pods += 2;
        }
        self.report
            .recovered(Fault::AdaptiveMove.name(), t0.elapsed());
        Ok(())
    }

    /// A pod for the Adaptive node asking for `strategy`'s shape, by claim or by the
    /// class's extended resource (KEP-5004).
    async fn pod_for_adaptive(&mut self, strategy: &str, extended: bool) -> anyhow::Result<String> {
        let prefix = if extended { "ext" } else { "adapt" };
        let shape = strategy.to_lowercase();
        if !extended {
            return self
                .create_pod_on(
                    &format!("{prefix}-{shape}"),
                    request_for(strategy),
                    Some(ADAPTIVE_NODE),
                )
                .await;
        }
        self.next_pod += 1;
        let name = format!("{prefix}-{shape}-{}", self.next_pod);
        let resource = format!("deviceclass.resource.kubernetes.io/{}", class_for(strategy));
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "affinity": cluster::on_node(ADAPTIVE_NODE),
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {resource: "1"}}}]
            }
        }))?;
        Api::<Pod>::namespaced(self.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating pod {name}"))?;
        self.live.push(name.clone());
        self.report.pods_created += 1;
        Ok(name)
    }

    /// The plugin dies right after making a MIG instance for a new pod (its claim's
    /// record says "prepare started"), and the driver refuses to destroy that instance
    /// once: the restarted plugin's recovery cannot roll the claim back. It must keep the
    /// record, serve the node's other GPUs, and settle the claim at the kubelet's retry.
    /// Recovery is the restart to the pod running.
    pub(super) async fn refuse_destroy_at_start_up(&mut self) -> anyhow::Result<()> {
        let all = super::shapes();
        let shape = all
            .iter()
            .filter(|s| s.name.starts_with("mig"))
            .collect::<Vec<_>>()
            .choose(&mut self.rng)
            .copied()
            .context("no MIG shape")?;
        let node = shape.node;
        // Room for the pod: one running on the node leaves first, if one does.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let running = pods
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter_map(|p| p.metadata.name)
            .find(|n| self.live.contains(n));
        if let Some(old) = running {
            self.live.retain(|p| p != &old);
            self.delete_pod(&old).await?;
            eventually(&format!("{old} to be gone"), SETTLE, || async {
                matches!(pods.get_opt(&old).await, Ok(None)).then_some(())
            })
            .await?;
        }
        std::fs::write(
            self.node_mut(node)?.faults_path(),
            json!({
                "abortAfter": [{"operation": "create-compute-instance"}],
                "fail": [{"operation": "destroy-compute-instance", "count": 1,
                          "message": "In use by another client"}]
            })
            .to_string(),
        )?;
        let request = GpuRequest {
            class: shape.class,
            selector: shape.selector,
            capacity: shape.capacity.clone(),
        };
        let pod = self.create_pod_on(shape.name, request, Some(node)).await?;
        let died = {
            let n = self.node_mut(node)?;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if !n.plugin_running() {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if !died {
            // The pod found no room on that node: nothing was made to refuse.
            std::fs::write(self.node_mut(node)?.faults_path(), "{}")?;
            self.report.destroy_refusals_not_reached += 1;
            return Ok(());
        }
        let t0 = Instant::now();
        self.node_mut(node)?.restart().await?;
        self.serving(node).await?;
        // The room made above may have gone to a pod that was already waiting for this
        // node: then the abort interrupted that pod's prepare, not ours, and ours waits
        // for room. Whichever it was, every pod bound to the node must run once the
        // kubelet retries its prepare on the restarted plugin.
        let bound = eventually(
            &format!("every pod bound to {node} running"),
            SETTLE,
            || {
                let (pods, pod) = (pods.clone(), pod.clone());
                async move {
                    let list = pods.list(&kube::api::ListParams::default()).await.ok()?;
                    let bound: Vec<&Pod> = list
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .filter(|p| {
                            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                        })
                        .collect();
                    bound
                        .iter()
                        .all(|p| {
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        })
                        .then(|| {
                            bound
                                .iter()
                                .any(|p| p.metadata.name.as_deref() == Some(&pod))
                        })
                }
            },
        )
        .await?;
        // Disarm what the retry did not use, so it cannot fire in a later step.
        std::fs::write(self.node_mut(node)?.faults_path(), "{}")?;
        if !bound {
            self.report.destroy_refusals_for_another_pod += 1;
        }
        self.report
            .recovered(Fault::DestroyRefused.name(), t0.elapsed());
        Ok(())
    }

    /// A pod `<prefix>-<n>` whose one claim asks `req`, held to `node` when given.
    async fn create_pod_on(
        &mut self,
        prefix: &str,
        req: GpuRequest<'_>,
        node: Option<&str>,
    ) -> anyhow::Result<String> {
        self.next_pod += 1;
        let name = format!("{prefix}-{}", self.next_pod);
        cluster::create_claim_pod_on(&self.client, NAMESPACE, &name, req, node).await?;
        self.live.push(name.clone());
        self.report.pods_created += 1;
        Ok(name)
    }
}
