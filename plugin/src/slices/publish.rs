//! Reconciling the node's pool with the API server, as the Go `resourceslice` controller
//! does (dra.md §6.8): every slice owned by the Node, a new pool generation whenever the
//! contents change (so the scheduler never mixes old and new slices), obsolete slices
//! deleted, and fields the API server dropped detected instead of republished forever.
//!
//! Slices are written with create and update (PUT with the last known resourceVersion),
//! as the Go controller does, not with server-side apply: the plugin is their only
//! writer, so apply's merge buys nothing and costs the API server more on large slices
//! (`cargo xtask bench` shows the publish figures).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
};
use tessera_api::constants::{MANAGED_BY_LABEL, PLUGIN_FIELD_MANAGER};
use tracing::{info, warn};

use super::build::DesiredPool;

/// Publishing failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action} ResourceSlice {name}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// Slice name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// What a publish did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Pool generation now published (unchanged when nothing changed).
    pub generation: i64,
    /// Whether anything was written.
    pub changed: bool,
    /// Fields the API server did not store, e.g. `consumesCounters` when
    /// DRAPartitionableDevices is off. Non-empty means the cluster cannot use what we offer.
    pub dropped_fields: Vec<String>,
}

/// Publishes one node's pool.
pub struct Publisher {
    api: Api<ResourceSlice>,
    node_name: String,
    node_uid: String,
    driver: String,
    last: Option<(DesiredPool, i64)>,
    /// resourceVersion of each slice as our last write (or list) saw it: the precondition
    /// of the next update. A stale one costs a GET and a retry, never a lost write.
    versions: BTreeMap<String, String>,
    /// uid of each slice as our last write (or list) saw it: tells our slice from one
    /// deleted and created again under its name.
    uids: BTreeMap<String, String>,
}

impl Publisher {
    /// A publisher for `node_name` (whose UID makes the owner reference).
    pub fn new(client: Client, node_name: &str, node_uid: &str, driver: &str) -> Self {
        Self {
            api: Api::all(client),
            node_name: node_name.to_string(),
            node_uid: node_uid.to_string(),
            driver: driver.to_string(),
            last: None,
            versions: BTreeMap::new(),
            uids: BTreeMap::new(),
        }
    }

    /// Name of the `i`-th device slice. Position, not GPU, is in the name: the allocator
    /// reads slices in name order, and position 0 holds the GPU to fill first.
    pub fn device_slice_name(&self, i: usize) -> String {
        format!("{}-{i:02}", slice_prefix(&self.node_name, &self.driver))
    }

    fn counter_slice_name(&self, i: usize) -> String {
        format!(
            "{}-counters-{i}",
            slice_prefix(&self.node_name, &self.driver)
        )
    }

    /// Makes the API server hold exactly `desired`. Cheap when nothing changed.
    ///
    /// Only what differs from what the API server holds is written: slices that changed
    /// without moving devices between them (a prepare on one GPU, a spec change of some
    /// GPUs) are updated in place under the same pool generation; any other change writes
    /// every slice under a new generation, so the scheduler never mixes old and new slices
    /// (see [`plan`]). What the API server
    /// holds is known from our own last writes; only when that is forgotten (at start-up,
    /// after the kubelet wiped the slices, on a resync) is it listed first. Slices are
    /// written concurrently: the cost of a publish is the API server's.
    pub async fn publish(&mut self, desired: &DesiredPool) -> Result<Outcome, Error> {
        let Some((last, generation)) = &self.last else {
            return self.publish_unknown(desired).await;
        };
        if last == desired {
            return Ok(Outcome {
                generation: *generation,
                changed: false,
                dropped_fields: vec![],
            });
        }
        let generation = *generation;
        let before = self.render(last, generation);
        let after = self.render(desired, generation);
        match plan(&before, &after) {
            Plan::Unchanged => {
                self.last = Some((desired.clone(), generation));
                Ok(Outcome {
                    generation,
                    changed: false,
                    dropped_fields: vec![],
                })
            }
            Plan::InPlace(changed) => {
                self.update_in_place(desired, &after, &changed, generation)
                    .await
            }
            Plan::NewGeneration => {
                let held: Vec<String> = before.iter().map(ResourceExt::name_any).collect();
                self.replace_pool(desired, generation + 1, held).await
            }
        }
    }

    /// [`Publisher::publish`] when what the API server holds is not known: list it, then
    /// write what differs.
    async fn publish_unknown(&mut self, desired: &DesiredPool) -> Result<Outcome, Error> {
        let existing = self
            .api
            .list(&ListParams::default().fields(&format!(
                "spec.nodeName={},spec.driver={}",
                self.node_name, self.driver
            )))
            .await
            .map_err(|source| Error::Kube {
                action: "listing",
                name: "*".into(),
                source,
            })?;
        let mut existing = existing.items;
        existing.sort_by_key(ResourceExt::name_any);
        self.versions = existing
            .iter()
            .filter_map(|s| Some((s.name_any(), s.resource_version()?)))
            .collect();
        self.uids = existing
            .iter()
            .filter_map(|s| Some((s.name_any(), s.uid()?)))
            .collect();
        let generation = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let held: Vec<String> = existing.iter().map(ResourceExt::name_any).collect();
        // What is there counts only as one complete pool of one generation; anything else
        // (a half-written pool, slices of two generations) is replaced whole.
        let complete = !existing.is_empty()
            && existing.iter().all(|s| {
                s.spec.pool.generation == generation
                    && usize::try_from(s.spec.pool.resource_slice_count).ok()
                        == Some(existing.len())
            });
        if complete {
            let mut after = self.render(desired, generation);
            after.sort_by_key(ResourceExt::name_any);
            match plan(&existing, &after) {
                Plan::Unchanged => {
                    info!(node = %self.node_name, generation, slices = after.len(), "the published ResourceSlices are up to date");
                    self.last = Some((desired.clone(), generation));
                    return Ok(Outcome {
                        generation,
                        changed: false,
                        dropped_fields: vec![],
                    });
                }
                Plan::InPlace(changed) => {
                    return self
                        .update_in_place(desired, &after, &changed, generation)
                        .await;
                }
                Plan::NewGeneration => {}
            }
        }
        self.replace_pool(desired, generation + 1, held).await
    }

    /// Updates the slices at `changed` of `rendered`, under the same generation.
    async fn update_in_place(
        &mut self,
        desired: &DesiredPool,
        rendered: &[ResourceSlice],
        changed: &[usize],
        generation: i64,
    ) -> Result<Outcome, Error> {
        let slices: Vec<&ResourceSlice> = changed.iter().map(|i| &rendered[*i]).collect();
        let mut dropped = self.write_all(&slices).await?;
        dropped.sort();
        dropped.dedup();
        self.last = Some((desired.clone(), generation));
        Ok(Outcome {
            generation,
            changed: true,
            dropped_fields: dropped,
        })
    }

    /// Writes every slice of `desired` under `generation`, then deletes those of `held`
    /// the pool no longer has.
    async fn replace_pool(
        &mut self,
        desired: &DesiredPool,
        generation: i64,
        held: Vec<String>,
    ) -> Result<Outcome, Error> {
        let slices = self.render(desired, generation);
        let mut dropped = self.write_all(&slices.iter().collect::<Vec<_>>()).await?;
        let keep: BTreeSet<String> = slices.iter().map(ResourceExt::name_any).collect();
        let obsolete: Vec<String> = held.into_iter().filter(|n| !keep.contains(n)).collect();
        let api = &self.api;
        let deletes = obsolete.iter().map(|name| async move {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(source) => Err(Error::Kube {
                    action: "deleting",
                    name: name.clone(),
                    source,
                }),
            }
        });
        futures::future::try_join_all(deletes).await?;
        for name in &obsolete {
            self.versions.remove(name);
            self.uids.remove(name);
        }
        dropped.sort();
        dropped.dedup();
        if dropped.is_empty() {
            info!(node = %self.node_name, generation, slices = slices.len(), "published ResourceSlices");
        } else {
            warn!(node = %self.node_name, generation, fields = ?dropped, "the API server dropped ResourceSlice fields; is a DRA feature gate off?");
        }
        // Remember what we sent even when fields were dropped: re-sending the same thing
        // would be dropped again, forever.
        self.last = Some((desired.clone(), generation));
        Ok(Outcome {
            generation,
            changed: true,
            dropped_fields: dropped,
        })
    }

    /// Writes the slices concurrently; returns the fields the API server dropped.
    async fn write_all(&mut self, slices: &[&ResourceSlice]) -> Result<Vec<String>, Error> {
        let writes = slices.iter().map(|slice| {
            let known = self.versions.get(&slice.name_any()).cloned();
            self.write(slice, known)
        });
        let stored = futures::future::try_join_all(writes).await?;
        let mut dropped = Vec::new();
        for (sent, stored) in slices.iter().zip(stored) {
            dropped.extend(dropped_fields(sent, &stored));
            if let Some(version) = stored.resource_version() {
                self.versions.insert(stored.name_any(), version);
            }
            if let Some(uid) = stored.uid() {
                self.uids.insert(stored.name_any(), uid);
            }
        }
        Ok(dropped)
    }

    /// Makes the API server hold `slice`: an update when we know its resourceVersion, a
    /// create otherwise. Either may find the world other than we thought (the kubelet wiped
    /// our slices, someone edited one): a conflict re-reads the slice and updates it once
    /// more, a missing slice is created.
    async fn write(
        &self,
        slice: &ResourceSlice,
        known_version: Option<String>,
    ) -> Result<ResourceSlice, Error> {
        let name = slice.name_any();
        let pp = PostParams {
            field_manager: Some(PLUGIN_FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        let mut version = known_version;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (action, result) = match &version {
                Some(rv) => {
                    let mut update = slice.clone();
                    update.metadata.resource_version = Some(rv.clone());
                    ("updating", self.api.replace(&name, &pp, &update).await)
                }
                None => ("creating", self.api.create(&pp, slice).await),
            };
            match result {
                // 409: it exists (create) or changed since (update); 404: it is gone.
                // Either way look again; a third disagreement is left to the next pass.
                Err(kube::Error::Api(s)) if (s.code == 409 || s.code == 404) && attempts < 3 => {
                    version = self.current_version(&name).await?;
                }
                other => {
                    return other.map_err(|source| Error::Kube {
                        action,
                        name,
                        source,
                    });
                }
            }
        }
    }

    /// The slice's resourceVersion now; `None` when it does not exist.
    async fn current_version(&self, name: &str) -> Result<Option<String>, Error> {
        self.api
            .get_opt(name)
            .await
            .map(|s| s.and_then(|s| s.resource_version()))
            .map_err(|source| Error::Kube {
                action: "reading",
                name: name.to_string(),
                source,
            })
    }

    /// Whether the slice object `name` with `uid` is one this publisher last wrote or
    /// listed (a slice deleted and created again under the same name has a new uid).
    pub fn holds(&self, name: &str, uid: &str) -> bool {
        self.uids.get(name).is_some_and(|u| u == uid)
    }

    /// Forgets what was published, so the next `publish` writes again (after the kubelet
    /// wiped our slices, or on a periodic resync).
    pub fn invalidate(&mut self) {
        self.last = None;
        self.versions.clear();
        self.uids.clear();
    }

    fn render(&self, desired: &DesiredPool, generation: i64) -> Vec<ResourceSlice> {
        let count = i64::try_from(desired.slice_count()).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        let spec = |devices, counters| ResourceSliceSpec {
            driver: self.driver.clone(),
            node_name: Some(self.node_name.clone()),
            pool: ResourcePool {
                name: self.node_name.clone(),
                generation,
                resource_slice_count: count,
            },
            devices,
            shared_counters: counters,
            ..ResourceSliceSpec::default()
        };
        for (i, sets) in desired.counter_slices.iter().enumerate() {
            out.push(self.slice(self.counter_slice_name(i), spec(None, Some(sets.clone()))));
        }
        for (i, (_, devices)) in desired.device_slices.iter().enumerate() {
            out.push(self.slice(self.device_slice_name(i), spec(Some(devices.clone()), None)));
        }
        if out.is_empty() {
            // "No pool" and "an empty pool" differ: publish one empty slice.
            out.push(self.slice(self.device_slice_name(0), spec(Some(vec![]), None)));
        }
        out
    }

    fn slice(&self, name: String, spec: ResourceSliceSpec) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some([(MANAGED_BY_LABEL.to_string(), "tessera-plugin".to_string())].into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node_name.clone(),
                    uid: self.node_uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            spec,
        }
    }
}

/// How to go from the slices held to the slices wanted, both rendered under the held
/// generation and sorted by name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Plan {
    /// They are the same.
    Unchanged,
    /// Only the device slices at these indices of `wanted` differ, and can be updated in
    /// place under the same generation.
    InPlace(Vec<usize>),
    /// A new generation: every slice is written.
    NewGeneration,
}

/// Updating several slices in place is as safe as the one-slice update the Go controller
/// makes, when every mix of old and new slices the scheduler may see on the way is a
/// valid pool, as after a sequence of one-slice updates: the set of slices stays the
/// same, the counter slices do not change (every counter set a device consumes exists
/// throughout), and no device moves from one slice to another (so no name is ever in two
/// slices). Anything else gets a new generation, which the scheduler only uses once
/// complete.
fn plan(held: &[ResourceSlice], wanted: &[ResourceSlice]) -> Plan {
    let same_names = held
        .iter()
        .map(ResourceExt::name_any)
        .eq(wanted.iter().map(ResourceExt::name_any));
    if !same_names {
        return Plan::NewGeneration;
    }
    let changed: Vec<usize> = wanted
        .iter()
        .zip(held)
        .enumerate()
        .filter(|(_, (w, h))| w.spec != h.spec)
        .map(|(i, _)| i)
        .collect();
    match changed.len() {
        0 => return Plan::Unchanged,
        1 => return Plan::InPlace(changed),
        _ => {}
    }
    let counters_changed = changed.iter().any(|i| {
        held[*i].spec.shared_counters.is_some() || wanted[*i].spec.shared_counters.is_some()
    });
    if counters_changed || devices_move(held, wanted) {
        return Plan::NewGeneration;
    }
    Plan::InPlace(changed)
}

/// Whether some device is in one slice of `held` and another of `wanted`.
fn devices_move(held: &[ResourceSlice], wanted: &[ResourceSlice]) -> bool {
    let mut home: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, s) in held.iter().enumerate() {
        for d in s.spec.devices.iter().flatten() {
            home.insert(&d.name, i);
        }
    }
    wanted.iter().enumerate().any(|(i, s)| {
        s.spec
            .devices
            .iter()
            .flatten()
            .any(|d| home.get(d.name.as_str()).is_some_and(|h| *h != i))
    })
}

/// Fields present in what we sent but absent in what was stored.
fn dropped_fields(sent: &ResourceSlice, stored: &ResourceSlice) -> Vec<String> {
    let mut out = Vec::new();
    if sent.spec.shared_counters.is_some() && stored.spec.shared_counters.is_none() {
        out.push("sharedCounters".to_string());
    }
    let sent_devices = sent.spec.devices.as_deref().unwrap_or_default();
    let stored_devices = stored.spec.devices.as_deref().unwrap_or_default();
    for (a, b) in sent_devices.iter().zip(stored_devices) {
        if a.consumes_counters.is_some() && b.consumes_counters.is_none() {
            out.push("devices[].consumesCounters".into());
        }
        if a.allow_multiple_allocations.is_some() && b.allow_multiple_allocations.is_none() {
            out.push("devices[].allowMultipleAllocations".into());
        }
        if a.taints.is_some() && b.taints.is_none() {
            out.push("devices[].taints".into());
        }
        let policies = |d: &k8s_openapi::api::resource::v1::Device| {
            d.capacity
                .as_ref()
                .is_some_and(|c| c.values().any(|v| v.request_policy.is_some()))
        };
        if policies(a) && !policies(b) {
            out.push("devices[].capacity[].requestPolicy".into());
        }
    }
    out
}

/// The longest object name the API server takes (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Room left after the prefix for the longest suffix a slice name gets
/// (`-counters-<n>`, `-<nnn>`).
const SUFFIX_ROOM: usize = 24;

/// What every slice name of a node starts with: `<node>-<driver>`, or, when a node name
/// is so long that the names would pass the API server's 253 characters, a cut of it
/// followed by a digest of the whole, so names stay unique per node and sort in position
/// order within it.
fn slice_prefix(node: &str, driver: &str) -> String {
    use sha2::Digest;
    let full = format!("{node}-{driver}");
    if full.len() + SUFFIX_ROOM <= MAX_NAME {
        return full;
    }
    let digest = sha2::Sha256::digest(full.as_bytes());
    let tag: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    // Node names are DNS subdomains (ASCII); a cut must end a label with an alphanumeric.
    let keep = MAX_NAME - SUFFIX_ROOM - tag.len() - 1;
    let cut = full[..keep.min(full.len())].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{cut}-{tag}")
}

#[cfg(test)]
mod tests;
