//! Whether a waiting pod could run on a node, devices aside (pure).
//!
//! Moving an idle GPU to the shape a pod waits for helps only if the scheduler can then
//! put the pod on that GPU's node: a GPU switched on a node whose CPU is taken, whose
//! labels the pod's node selector refuses or whose taints it does not tolerate leaves the
//! pod waiting and the demand looking met. This module applies the kube-scheduler's
//! filters that do not concern devices, as its plugins define them
//! (`pkg/scheduler/framework/plugins/{noderesources/fit.go, nodeaffinity,
//! tainttoleration, nodeunschedulable}`):
//!
//! - **NodeResourcesFit**: one more pod within `allocatable.pods`; the pod's CPU and
//!   memory requests within what allocatable leaves after the requests of the pods bound
//!   there (their actual requests, not the scoring's non-zero defaults; a resource the
//!   pod does not request is not checked). A pod's request is the scheduler's
//!   (`resourcehelper.PodRequests`): pod-level `resources` when set, else the larger of
//!   its containers' sum (sidecar init containers included) and each init container
//!   with the sidecars started before it, plus `overhead`.
//! - **NodeAffinity**: `nodeSelector` labels, and the required node affinity's terms
//!   (any term; every expression of a term; `In`, `NotIn`, `Exists`, `DoesNotExist`,
//!   `Gt`, `Lt`; `matchFields` on `metadata.name`).
//! - **TaintToleration**: every `NoSchedule`/`NoExecute` taint tolerated.
//! - **NodeUnschedulable**: a cordoned node only for a pod that tolerates
//!   `node.kubernetes.io/unschedulable:NoSchedule`.
//!
//! What the caches do not know is not held against a node: a node without a Node object
//! or a pod the caches do not hold fits.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelector, NodeSelectorRequirement, NodeStatus, Pod, PodSpec, PodStatus,
    ResourceRequirements, Taint, Toleration,
};
use tessera_api::quantity::{parse_bytes, parse_cpu_milli};

const MIB: u64 = 1 << 20;

/// The taint the scheduler treats a cordoned node as carrying.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// The resources the fit check counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Millicores.
    pub cpu_milli: u64,
    /// Bytes.
    pub memory_bytes: u64,
    /// Pods.
    pub pods: u64,
}

impl Resources {
    fn add(&mut self, other: &Self) {
        self.cpu_milli = self.cpu_milli.saturating_add(other.cpu_milli);
        self.memory_bytes = self.memory_bytes.saturating_add(other.memory_bytes);
        self.pods = self.pods.saturating_add(other.pods);
    }

    fn max(&mut self, other: &Self) {
        self.cpu_milli = self.cpu_milli.max(other.cpu_milli);
        self.memory_bytes = self.memory_bytes.max(other.memory_bytes);
    }

    fn of(r: Option<&ResourceRequirements>) -> Self {
        let requests = r.and_then(|r| r.requests.as_ref());
        let get = |k: &str| requests.and_then(|q| q.get(k)).map(|q| q.0.as_str());
        Self {
            cpu_milli: get("cpu").and_then(parse_cpu_milli).unwrap_or(0),
            memory_bytes: get("memory")
                .and_then(parse_bytes)
                .and_then(|b| u64::try_from(b).ok())
                .unwrap_or(0),
            pods: 0,
        }
    }
}

/// What a pod requests of its node, by the scheduler's rule (see the module docs); one
/// pod.
pub fn pod_requests(pod: &Pod) -> Resources {
    let Some(spec) = pod.spec.as_ref() else {
        return Resources {
            pods: 1,
            ..Resources::default()
        };
    };
    let mut out = match spec.resources.as_ref().filter(|r| r.requests.is_some()) {
        Some(pod_level) => Resources::of(Some(pod_level)),
        None => {
            let of = |c: &Container| Resources::of(c.resources.as_ref());
            let mut sum = Resources::default();
            for c in &spec.containers {
                sum.add(&of(c));
            }
            let mut sidecars = Resources::default();
            let mut init_max = Resources::default();
            for c in spec.init_containers.iter().flatten() {
                if c.restart_policy.as_deref() == Some("Always") {
                    sum.add(&of(c));
                    sidecars.add(&of(c));
                } else {
                    let mut with = of(c);
                    with.add(&sidecars);
                    init_max.max(&with);
                }
            }
            sum.max(&init_max);
            sum
        }
    };
    if let Some(overhead) = spec.overhead.as_ref() {
        out.add(&Resources::of(Some(&ResourceRequirements {
            requests: Some(overhead.clone()),
            ..ResourceRequirements::default()
        })));
    }
    out.pods = 1;
    out
}

/// What a node offers pods, and what the pods bound to it already take.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeRoom {
    /// The node's labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Cordoned.
    pub unschedulable: bool,
    /// `status.allocatable`.
    pub allocatable: Resources,
    /// The requests of the pods bound to it that have not ended.
    pub requested: Resources,
}

impl NodeRoom {
    /// The node as its object describes it, with nothing bound yet.
    pub fn of(node: &Node) -> Self {
        let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let get = |k: &str| allocatable.and_then(|a| a.get(k)).map(|q| q.0.as_str());
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            allocatable: Resources {
                cpu_milli: get("cpu").and_then(parse_cpu_milli).unwrap_or(0),
                memory_bytes: get("memory")
                    .and_then(parse_bytes)
                    .and_then(|b| u64::try_from(b).ok())
                    .unwrap_or(0),
                pods: get("pods").and_then(|p| p.parse().ok()).unwrap_or(0),
            },
            requested: Resources::default(),
        }
    }
}

/// What a pod asks of a node besides devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodNeeds {
    /// Its requests ([`pod_requests`]).
    pub requests: Resources,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The required node affinity.
    pub required: Option<NodeSelector>,
    /// Its tolerations.
    pub tolerations: Vec<Toleration>,
}

impl PodNeeds {
    /// What `pod` asks.
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        Self {
            requests: pod_requests(pod),
            node_selector: spec
                .and_then(|s| s.node_selector.clone())
                .unwrap_or_default(),
            required: spec
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .clone()
                }),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        }
    }
}

/// Why a pod cannot run on a node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Misfit {
    /// Not enough CPU left.
    #[error("{want}m CPU asked, {left}m left")]
    Cpu {
        /// Millicores asked.
        want: u64,
        /// Millicores left.
        left: u64,
    },
    /// Not enough memory left.
    #[error("{} MiB of memory asked, {} MiB left", want.div_ceil(MIB), left / MIB)]
    Memory {
        /// Bytes asked.
        want: u64,
        /// Bytes left.
        left: u64,
    },
    /// The node holds as many pods as it may.
    #[error("the node holds its {0} pods")]
    Pods(u64),
    /// The node selector or required node affinity refuses the node.
    #[error("the pod's node selector or affinity does not select the node")]
    Affinity,
    /// A `NoSchedule`/`NoExecute` taint the pod does not tolerate.
    #[error("untolerated taint {0}")]
    Taint(String),
    /// The node is cordoned.
    #[error("the node is cordoned")]
    Unschedulable,
}

/// Why `pod` cannot run on `node` named `name` once `extra` (other pods planned there) is
/// taken too; `None` when it can.
pub fn misfit(pod: &PodNeeds, name: &str, node: &NodeRoom, extra: &Resources) -> Option<Misfit> {
    if node.unschedulable
        && !pod.tolerations.iter().any(|t| {
            tolerates(
                t,
                &Taint {
                    key: UNSCHEDULABLE_TAINT.into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                },
            )
        })
    {
        return Some(Misfit::Unschedulable);
    }
    if !pod
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        || pod
            .required
            .as_ref()
            .is_some_and(|s| !selects(s, name, &node.labels))
    {
        return Some(Misfit::Affinity);
    }
    if let Some(t) = node
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !pod.tolerations.iter().any(|tol| tolerates(tol, t)))
    {
        return Some(Misfit::Taint(format!(
            "{}{}:{}",
            t.key,
            t.value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default(),
            t.effect
        )));
    }
    let mut taken = node.requested;
    taken.add(extra);
    let left = |total: u64, used: u64| total.saturating_sub(used);
    if node.allocatable.pods < taken.pods.saturating_add(pod.requests.pods) {
        return Some(Misfit::Pods(node.allocatable.pods));
    }
    let cpu_left = left(node.allocatable.cpu_milli, taken.cpu_milli);
    if pod.requests.cpu_milli > 0 && pod.requests.cpu_milli > cpu_left {
        return Some(Misfit::Cpu {
            want: pod.requests.cpu_milli,
            left: cpu_left,
        });
    }
    let memory_left = left(node.allocatable.memory_bytes, taken.memory_bytes);
    if pod.requests.memory_bytes > 0 && pod.requests.memory_bytes > memory_left {
        return Some(Misfit::Memory {
            want: pod.requests.memory_bytes,
            left: memory_left,
        });
    }
    None
}

/// `v1helper.TolerationsTolerateTaint` for one toleration.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// Whether a required `NodeSelector` selects the node: any of its terms; a term with
/// nothing in it selects nothing.
fn selects(s: &NodeSelector, name: &str, labels: &BTreeMap<String, String>) -> bool {
    s.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs.iter().all(|r| requirement(r, labels.get(&r.key)))
            && fields
                .iter()
                .all(|r| r.key == "metadata.name" && requirement(r, Some(&name.to_string())))
    })
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), [want]) = (value.and_then(|v| number(v)), values) else {
                return false;
            };
            let Some(want) = number(want) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}

/// Drops what [`NodeRoom::of`] does not read from a cached Node (its images, conditions
/// and annotations are most of a real node's size).
pub fn strip_node(node: &mut Node) {
    node.metadata.annotations = None;
    node.status = node.status.take().map(|s| NodeStatus {
        allocatable: s.allocatable,
        ..NodeStatus::default()
    });
}

/// Drops what [`pod_requests`] and [`Rooms::read`] do not read from a cached bound pod:
/// every pod of the cluster is cached, so each keeps only its node, requests and phase.
pub fn strip_bound_pod(pod: &mut Pod) {
    pod.metadata.annotations = None;
    pod.metadata.labels = None;
    pod.metadata.owner_references = None;
    let slim = |c: &Container| Container {
        name: c.name.clone(),
        resources: c.resources.as_ref().map(|r| ResourceRequirements {
            requests: r.requests.clone(),
            ..ResourceRequirements::default()
        }),
        restart_policy: c.restart_policy.clone(),
        ..Container::default()
    };
    pod.spec = pod.spec.take().map(|s| PodSpec {
        node_name: s.node_name,
        containers: s.containers.iter().map(slim).collect(),
        init_containers: s.init_containers.map(|cs| cs.iter().map(slim).collect()),
        overhead: s.overhead,
        resources: s.resources,
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        ..PodStatus::default()
    });
}

/// The nodes' room and the waiting pods' needs, from the caches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rooms {
    /// By node name.
    pub nodes: BTreeMap<String, NodeRoom>,
    /// Waiting pods, by `namespace/name`.
    pub pods: BTreeMap<String, PodNeeds>,
}

impl Rooms {
    /// `nodes` with the requests of `bound` (pods bound to them that have not ended)
    /// taken, and what `waiting` pods need.
    pub fn read<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        bound: impl IntoIterator<Item = &'a Pod>,
        waiting: impl IntoIterator<Item = &'a Pod>,
    ) -> Self {
        let mut out = Self {
            nodes: nodes
                .into_iter()
                .filter_map(|n| Some((n.metadata.name.clone()?, NodeRoom::of(n))))
                .collect(),
            pods: BTreeMap::new(),
        };
        for pod in bound {
            let ended = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed");
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_ref());
            if let (false, Some(room)) = (ended, node.and_then(|n| out.nodes.get_mut(n))) {
                room.requested.add(&pod_requests(pod));
            }
        }
        for pod in waiting {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            out.pods.insert(format!("{ns}/{name}"), PodNeeds::of(pod));
        }
        out
    }
}

/// The room one pass plans with: what the planned pods take on each node.
#[derive(Debug)]
pub struct Ledger<'r> {
    rooms: &'r Rooms,
    taken: BTreeMap<String, Resources>,
}

impl<'r> Ledger<'r> {
    /// Nothing taken yet.
    pub fn new(rooms: &'r Rooms) -> Self {
        Self {
            rooms,
            taken: BTreeMap::new(),
        }
    }

    /// Whether every pod of `pods` (the pods of one claim: they all run where it is
    /// allocated) fits `node` together with what was taken there before.
    pub fn fits(&self, pods: &BTreeSet<String>, node: &str) -> bool {
        let Some(room) = self.rooms.nodes.get(node) else {
            return true;
        };
        let mut extra = self.taken.get(node).copied().unwrap_or_default();
        for p in pods {
            let Some(needs) = self.rooms.pods.get(p) else {
                continue;
            };
            if misfit(needs, node, room, &extra).is_some() {
                return false;
            }
            extra.add(&needs.requests);
        }
        true
    }

    /// Takes what `pods` request on `node`.
    pub fn take(&mut self, pods: &BTreeSet<String>, node: &str) {
        let taken = self.taken.entry(node.to_string()).or_default();
        for p in pods {
            if let Some(needs) = self.rooms.pods.get(p) {
                taken.add(&needs.requests);
            }
        }
    }
}

#[cfg(test)]
mod tests;
