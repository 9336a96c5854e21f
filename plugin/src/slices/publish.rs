//! Reconciling the node's pool with the API server, as the Go `resourceslice` controller
//! does (dra.md §6.8): every slice owned by the Node, a new pool generation whenever the
//! contents change (so the scheduler never mixes old and new slices), obsolete slices
//! deleted, and fields the API server dropped detected instead of republished forever.

use std::collections::BTreeSet;

use k8s_openapi::{
    api::resource::v1::{ResourcePool, ResourceSlice, ResourceSliceSpec},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams},
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
        }
    }

    /// Name of the `i`-th device slice. Position, not GPU, is in the name: the allocator
    /// reads slices in name order, and position 0 holds the GPU to fill first.
    pub fn device_slice_name(&self, i: usize) -> String {
        format!("{}-{}-{i:02}", self.node_name, self.driver)
    }

    fn counter_slice_name(&self, i: usize) -> String {
        format!("{}-{}-counters-{i}", self.node_name, self.driver)
    }

    /// Makes the API server hold exactly `desired`. Cheap when nothing changed.
    ///
    /// When exactly one slice changed (a prepare on one GPU whose position did not move) it
    /// is updated in place under the same pool generation, as the Go controller does; any
    /// other change writes every slice under a new generation, so the scheduler never
    /// mixes old and new slices. Slices are written concurrently: the cost of a publish is
    /// the API server's, one round trip per slice.
    pub async fn publish(&mut self, desired: &DesiredPool) -> Result<Outcome, Error> {
        if let Some((last, generation)) = &self.last {
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
            let same_names = before
                .iter()
                .map(ResourceExt::name_any)
                .eq(after.iter().map(ResourceExt::name_any));
            let changed: Vec<&ResourceSlice> = after
                .iter()
                .zip(&before)
                .filter(|(a, b)| a.spec != b.spec)
                .map(|(a, _)| a)
                .collect();
            if same_names && changed.len() == 1 {
                let dropped = self.apply_all(&changed).await?;
                self.last = Some((desired.clone(), generation));
                return Ok(Outcome {
                    generation,
                    changed: true,
                    dropped_fields: dropped,
                });
            }
        }
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
        let generation = existing
            .items
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0)
            + 1;
        let slices = self.render(desired, generation);
        let mut dropped = self.apply_all(&slices.iter().collect::<Vec<_>>()).await?;
        let keep: BTreeSet<String> = slices.iter().map(ResourceExt::name_any).collect();
        for old in existing.items {
            let name = old.name_any();
            if !keep.contains(&name) {
                match self.api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => {
                        return Err(Error::Kube {
                            action: "deleting",
                            name,
                            source,
                        });
                    }
                }
            }
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

    /// Server-side applies the slices concurrently; returns the fields the API server
    /// dropped.
    async fn apply_all(&self, slices: &[&ResourceSlice]) -> Result<Vec<String>, Error> {
        let pp = PatchParams::apply(PLUGIN_FIELD_MANAGER).force();
        let writes = slices.iter().map(|slice| {
            let pp = pp.clone();
            async move {
                let name = slice.name_any();
                let stored = self
                    .api
                    .patch(&name, &pp, &Patch::Apply(*slice))
                    .await
                    .map_err(|source| Error::Kube {
                        action: "applying",
                        name,
                        source,
                    })?;
                Ok::<_, Error>(dropped_fields(slice, &stored))
            }
        });
        let dropped = futures::future::try_join_all(writes).await?;
        Ok(dropped.into_iter().flatten().collect())
    }

    /// Forgets what was published, so the next `publish` writes again (after the kubelet
    /// wiped our slices, or on a periodic resync).
    pub fn invalidate(&mut self) {
        self.last = None;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::resource::v1::{
            CapacityRequestPolicy, Counter, CounterSet, Device, DeviceCapacity,
            DeviceCounterConsumption, DeviceTaint,
        },
        apimachinery::pkg::api::resource::Quantity,
    };

    use super::*;

    fn q(v: &str) -> Quantity {
        Quantity(v.into())
    }

    /// A device using every optional field the DRA feature gates guard.
    fn gated_device(name: &str) -> Device {
        Device {
            name: name.into(),
            consumes_counters: Some(vec![DeviceCounterConsumption {
                counter_set: "gpu-0-counters".into(),
                counters: [("compute-slices".to_string(), Counter { value: q("1") })].into(),
            }]),
            allow_multiple_allocations: Some(true),
            capacity: Some(
                [(
                    "memory".to_string(),
                    DeviceCapacity {
                        value: q("80Gi"),
                        request_policy: Some(CapacityRequestPolicy {
                            default: Some(q("1Gi")),
                            valid_range: None,
                            valid_values: None,
                        }),
                    },
                )]
                .into(),
            ),
            taints: Some(vec![DeviceTaint {
                key: "gpu.tessera.dev/unhealthy".into(),
                value: Some("xid-79".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Device::default()
        }
    }

    /// What an API server without the gates stores for [`gated_device`].
    fn stripped(d: &Device) -> Device {
        let mut d = d.clone();
        d.consumes_counters = None;
        d.allow_multiple_allocations = None;
        d.taints = None;
        for c in d.capacity.iter_mut().flat_map(BTreeMap::values_mut) {
            c.request_policy = None;
        }
        d
    }

    fn slice(devices: Option<Vec<Device>>, counters: Option<Vec<CounterSet>>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some("node-a-gpu.tessera.dev-00".into()),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: "gpu.tessera.dev".into(),
                node_name: Some("node-a".into()),
                pool: ResourcePool {
                    name: "node-a".into(),
                    generation: 1,
                    resource_slice_count: 2,
                },
                devices,
                shared_counters: counters,
                ..ResourceSliceSpec::default()
            },
        }
    }

    fn counter_sets() -> Vec<CounterSet> {
        vec![CounterSet {
            name: "gpu-0-counters".into(),
            counters: [("compute-slices".to_string(), Counter { value: q("7") })].into(),
        }]
    }

    #[test]
    fn fields_the_api_server_did_not_store_are_reported() {
        let sent = slice(Some(vec![gated_device("gpu-0")]), None);
        let stored = slice(Some(vec![stripped(&gated_device("gpu-0"))]), None);
        assert_eq!(
            dropped_fields(&sent, &stored),
            [
                "devices[].consumesCounters",
                "devices[].allowMultipleAllocations",
                "devices[].taints",
                "devices[].capacity[].requestPolicy",
            ]
        );
    }

    #[test]
    fn dropped_shared_counters_are_reported() {
        let sent = slice(None, Some(counter_sets()));
        let stored = slice(None, None);
        assert_eq!(dropped_fields(&sent, &stored), ["sharedCounters"]);
    }

    #[test]
    fn each_dropped_field_is_reported_on_its_own() {
        let sent = gated_device("gpu-0");
        type Strip = fn(&mut Device);
        let cases: [(&str, Strip); 4] = [
            ("devices[].consumesCounters", |d| d.consumes_counters = None),
            ("devices[].allowMultipleAllocations", |d| {
                d.allow_multiple_allocations = None;
            }),
            ("devices[].taints", |d| d.taints = None),
            ("devices[].capacity[].requestPolicy", |d| {
                for c in d.capacity.iter_mut().flat_map(BTreeMap::values_mut) {
                    c.request_policy = None;
                }
            }),
        ];
        for (field, strip) in cases {
            let mut stored = sent.clone();
            strip(&mut stored);
            assert_eq!(
                dropped_fields(
                    &slice(Some(vec![sent.clone()]), None),
                    &slice(Some(vec![stored]), None)
                ),
                [field]
            );
        }
    }

    #[test]
    fn a_faithfully_stored_slice_drops_nothing() {
        let devices = slice(
            Some(vec![gated_device("gpu-0"), gated_device("gpu-1")]),
            None,
        );
        assert!(dropped_fields(&devices, &devices.clone()).is_empty());
        let counters = slice(None, Some(counter_sets()));
        assert!(dropped_fields(&counters, &counters.clone()).is_empty());
    }

    #[test]
    fn fields_we_did_not_send_are_not_reported() {
        let plain = stripped(&gated_device("gpu-0"));
        let sent = slice(Some(vec![plain.clone()]), None);
        assert!(dropped_fields(&sent, &sent.clone()).is_empty());
        // The server adding something (defaulting) is not a drop either.
        let stored = slice(Some(vec![gated_device("gpu-0")]), Some(counter_sets()));
        assert!(dropped_fields(&sent, &stored).is_empty());
    }

    #[test]
    fn a_drop_on_any_device_of_the_slice_is_reported() {
        let sent = slice(
            Some(vec![gated_device("gpu-0"), gated_device("gpu-1")]),
            None,
        );
        let mut second = gated_device("gpu-1");
        second.consumes_counters = None;
        let stored = slice(Some(vec![gated_device("gpu-0"), second]), None);
        assert_eq!(
            dropped_fields(&sent, &stored),
            ["devices[].consumesCounters"]
        );
    }

    /// A real client pointed at an address nothing listens on; no test here sends a
    /// request, the publisher only needs one to exist.
    fn publisher(node: &str) -> Publisher {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).expect("client");
        Publisher::new(client, node, "uid-1", "gpu.tessera.dev")
    }

    #[tokio::test]
    async fn device_slice_names_sort_in_position_order() {
        let p = publisher("node-a");
        let names: Vec<String> = (0..12).map(|i| p.device_slice_name(i)).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "the allocator reads slices in name order");
        assert_eq!(names[0], "node-a-gpu.tessera.dev-00");
        assert_eq!(names[11], "node-a-gpu.tessera.dev-11");
    }

    #[tokio::test]
    async fn rendered_slices_follow_the_desired_pool() {
        let p = publisher("node-a");
        let desired = DesiredPool {
            counter_slices: vec![counter_sets()],
            device_slices: vec![
                (1, vec![gated_device("gpu-1")]),
                (0, vec![gated_device("gpu-0")]),
            ],
        };
        let slices = p.render(&desired, 7);
        let names: Vec<String> = slices.iter().map(ResourceExt::name_any).collect();
        assert_eq!(
            names,
            [
                "node-a-gpu.tessera.dev-counters-0",
                "node-a-gpu.tessera.dev-00",
                "node-a-gpu.tessera.dev-01"
            ]
        );
        for s in &slices {
            assert_eq!(s.spec.pool.generation, 7);
            assert_eq!(s.spec.pool.resource_slice_count, 3);
            assert_eq!(s.spec.pool.name, "node-a");
            assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
            assert!(
                s.spec.devices.is_some() != s.spec.shared_counters.is_some(),
                "a slice holds devices or counters, never both"
            );
            let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
        }
        assert_eq!(slices[1].spec.devices.as_ref().unwrap()[0].name, "gpu-1");
    }

    #[tokio::test]
    async fn an_empty_pool_renders_one_empty_slice() {
        let slices = publisher("node-a").render(&DesiredPool::default(), 1);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
        assert_eq!(slices[0].spec.devices.as_deref(), Some(&[][..]));
    }
}
