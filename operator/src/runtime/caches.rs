//! What a pass reads: the watch caches of the objects resolution reads, and the views a
//! pass takes of them (demand, rooms, supply, the resolution snapshot).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        core::v1::{Node, ObjectReference, Pod},
        resource::v1::{DeviceClass, ResourceClaim, ResourceSlice},
    },
    jiff::Timestamp,
};
use kube::{Client, Resource, ResourceExt, runtime::watcher};
use tessera_api::{
    GpuNode, GpuSharingPolicy, constants::DRIVER_NAME, policy::GpuSharingPolicyStatus,
};
use tokio::sync::Notify;

use super::Error;
use crate::{
    demand::{self, Demand},
    resolve::{NodeView, PolicyView, Snapshot},
    room::{Rooms, strip_bound_pod, strip_node},
    spec_writes::SpecWrites,
    usage::{GpuSize, Supply},
    watch::Cache,
};

/// A policy's status as the cache holds it, the resourceVersion it was seen at, and the
/// object to tell events of.
pub(super) type StoredPolicy = (
    Option<GpuSharingPolicyStatus>,
    Option<String>,
    ObjectReference,
);

/// What a pass read from the caches, besides the resolution snapshot.
pub(super) struct Observed {
    /// What the GPUs publish and what claims hold.
    pub supply: Supply,
    /// Where the waiting pods could run, devices aside.
    pub rooms: Rooms,
    /// The claims unschedulable pods wait for, less those that could be placed already.
    pub demand: Demand,
    /// Each GpuNode, to tell events of.
    pub gpunodes: BTreeMap<String, ObjectReference>,
    /// Each policy's stored status.
    pub policies: BTreeMap<String, StoredPolicy>,
}

/// The watch caches.
#[derive(Clone)]
pub struct Caches {
    policies: Cache<GpuSharingPolicy>,
    gpunodes: Cache<GpuNode>,
    /// Nodes, with what the fit check reads ([`crate::room`]).
    nodes: Cache<Node>,
    claims: Cache<ResourceClaim>,
    slices: Cache<ResourceSlice>,
    /// Pods no node is bound to: where unmet demand shows.
    pods: Cache<Pod>,
    /// Pods bound to a node that have not ended, with only what the fit check reads:
    /// what the nodes have left.
    bound: Cache<Pod>,
    /// DeviceClasses: the extended resource names pods may ask Tessera's by.
    classes: Cache<DeviceClass>,
}

impl Caches {
    /// Starts the watches; `changed` is notified on every event.
    pub fn start(client: &Client, changed: Arc<Notify>) -> Self {
        let all = watcher::Config::default;
        fn keep<K>(_: &mut K) {}
        Self {
            policies: Cache::start(client, all(), keep, changed.clone()),
            gpunodes: Cache::start(client, all(), keep, changed.clone()),
            nodes: Cache::start(client, all(), strip_node, changed.clone()),
            claims: Cache::start(client, all(), keep, changed.clone()),
            slices: Cache::start(
                client,
                all().fields(&format!("spec.driver={DRIVER_NAME}")),
                keep,
                changed.clone(),
            ),
            pods: Cache::start(
                client,
                all().fields("spec.nodeName="),
                keep,
                changed.clone(),
            ),
            bound: Cache::start(
                client,
                all().fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
                strip_bound_pod,
                changed.clone(),
            ),
            classes: Cache::start(client, all(), keep, changed),
        }
    }

    /// Waits until every cache holds a full list.
    pub async fn ready(&self) -> Result<(), Error> {
        self.policies
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("GpuSharingPolicy"))?;
        self.gpunodes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("GpuNode"))?;
        self.nodes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("Node"))?;
        self.claims
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("ResourceClaim"))?;
        self.slices
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("ResourceSlice"))?;
        self.pods
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("Pod"))?;
        self.bound
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("Pod (bound)"))?;
        self.classes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("DeviceClass"))
    }

    /// What a pass reads: see [`Observed`] and [`Self::snapshot`].
    pub(super) fn observe(
        &self,
        dwell: Duration,
        waiting: &BTreeMap<(String, u32), Instant>,
        written: &SpecWrites,
    ) -> (Observed, Snapshot) {
        let supply = self.supply();
        let rooms = self.rooms();
        let demand = self.demand(dwell).without_placeable(&supply, &rooms);
        let snapshot = self.snapshot(waiting, &supply, written);
        let seen = Observed {
            supply,
            rooms,
            demand,
            gpunodes: self.gpunode_refs(),
            policies: self.stored_policies(),
        };
        (seen, snapshot)
    }

    /// The claims unschedulable pods wait for, now.
    fn demand(&self, dwell: Duration) -> Demand {
        let pods = self.pods.state();
        let pods: Vec<&Pod> = pods.iter().collect();
        let claims = self.claims.state();
        let by_name: BTreeMap<(&str, &str), &ResourceClaim> = claims
            .iter()
            .map(|c| {
                (
                    (
                        c.metadata.namespace.as_deref().unwrap_or_default(),
                        c.metadata.name.as_deref().unwrap_or_default(),
                    ),
                    c,
                )
            })
            .collect();
        let classes = self.classes.state();
        let extended = demand::extended_names(classes.iter().map(|c| {
            (
                c.metadata.name.as_deref().unwrap_or_default(),
                c.spec.extended_resource_name.as_deref(),
            )
        }));
        demand::demand(
            &pods,
            |ns, name| by_name.get(&(ns, name)).copied(),
            &extended,
            Timestamp::now(),
            dwell,
        )
    }

    /// Where the waiting pods could run, devices aside.
    fn rooms(&self) -> Rooms {
        let nodes = self.nodes.state();
        let bound = self.bound.state();
        let waiting = self.pods.state();
        Rooms::read(nodes.iter(), bound.iter(), waiting.iter())
    }

    pub(super) fn pod_ref(&self, key: &str) -> Option<ObjectReference> {
        let (ns, name) = key.split_once('/')?;
        let pod = self.pods.get(ns, name)?;
        Some(pod.0.as_ref().ok()?.object_ref(&()))
    }

    /// What the GPUs publish and what claims hold: which GPUs are busy, and the policies'
    /// usage figures.
    fn supply(&self) -> Supply {
        let mut sizes = BTreeMap::new();
        for gpunode in self.gpunodes.state().iter() {
            let node = gpunode.name_any();
            for g in gpunode.status.iter().flat_map(|s| &s.gpus) {
                let compute_slices = tessera_gpu::find_model(&g.product_name)
                    .ok()
                    .and_then(|m| m.mig.as_ref())
                    .map(|l| u32::from(l.compute_slices));
                sizes.insert(
                    (node.clone(), g.index),
                    GpuSize {
                        memory_mib: g.memory_mi_b,
                        compute_slices,
                    },
                );
            }
        }
        let (slices, claims) = (self.slices.state(), self.claims.state());
        Supply::read(slices.iter(), claims.iter(), sizes)
    }

    /// What resolution reads, now. `waiting` holds when each waiting GPU started to wait;
    /// `supply` says which claims are allocated where; `written` are the spec writes of
    /// this process: one whose echo has not arrived is what resolution starts from, not
    /// the stale cached spec.
    fn snapshot(
        &self,
        waiting: &BTreeMap<(String, u32), Instant>,
        supply: &Supply,
        written: &SpecWrites,
    ) -> Snapshot {
        let labels: BTreeMap<String, BTreeMap<String, String>> = self
            .nodes
            .state()
            .iter()
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect();
        let nodes = self
            .gpunodes
            .state()
            .iter()
            .map(|g| {
                let name = g.name_any();
                let spec = written
                    .pending(&name, &g.metadata)
                    .cloned()
                    .unwrap_or_else(|| g.spec.clone());
                let gpus = g
                    .status
                    .as_ref()
                    .map(|s| s.gpus.clone())
                    .unwrap_or_default();
                let view = NodeView {
                    labels: labels.get(&name).cloned(),
                    spec,
                    users: NodeView::claims_holding(supply.claims_on(&name), &gpus),
                    gpus,
                };
                (name, view)
            })
            .collect();
        let mut policies: Vec<PolicyView> = self
            .policies
            .state()
            .iter()
            .map(|p| PolicyView {
                name: p.name_any(),
                generation: p.metadata.generation,
                spec: p.spec.clone(),
            })
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        Snapshot {
            policies,
            nodes,
            waiting: waiting
                .iter()
                .map(|(k, since)| (k.clone(), since.elapsed()))
                .collect(),
            adaptive: BTreeMap::new(),
            cooling: BTreeSet::new(),
        }
    }

    /// Each GpuNode's metadata as cached.
    pub(super) fn gpunode_meta(
        &self,
    ) -> BTreeMap<String, k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta> {
        self.gpunodes
            .state()
            .iter()
            .map(|g| (g.name_any(), g.metadata.clone()))
            .collect()
    }

    /// Each GpuNode, to tell events of.
    fn gpunode_refs(&self) -> BTreeMap<String, ObjectReference> {
        self.gpunodes
            .state()
            .iter()
            .map(|g| (g.name_any(), g.object_ref(&())))
            .collect()
    }

    /// Each policy's stored status (see [`StoredPolicy`]).
    fn stored_policies(&self) -> BTreeMap<String, StoredPolicy> {
        self.policies
            .state()
            .iter()
            .map(|p| {
                (
                    p.name_any(),
                    (p.status.clone(), p.resource_version(), p.object_ref(&())),
                )
            })
            .collect()
    }
}
