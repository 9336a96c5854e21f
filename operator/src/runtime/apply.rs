//! The apply stage: every write a pass makes, behind the leadership check, and what this
//! process wrote whose echo has not come back through the watch yet.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::SystemTime,
};

use futures::{StreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tessera_api::{
    GpuNode, GpuNodeSpec, GpuSharingPolicy, constants::OPERATOR_FIELD_MANAGER,
    policy::GpuSharingPolicyStatus,
};
use tessera_kit::client::apply_params;
use tracing::info;

use super::{Error, planner::SpecWrite};
use crate::{events, leadership::Leadership, metrics::Metrics, spec_writes::SpecWrites};

/// API writes a pass has in flight at once.
pub(super) const WRITES_IN_FLIGHT: usize = 16;

/// What the spec writes of a pass did.
pub(super) struct Applied {
    /// The GpuNodes whose spec was written.
    pub written: BTreeSet<String>,
    /// For each written GpuNode, one line per GPU that changed shape.
    pub reconfigured: Vec<(String, Vec<String>)>,
    /// The first write that failed.
    pub error: Option<Error>,
}

/// Writes, while this replica may.
pub(super) struct Writer {
    client: Client,
    /// Whether this replica may write.
    pub leadership: Leadership,
    /// The resourceVersion each policy had in the cache when this process last wrote its
    /// status: while the cache still shows that version, the write has not come back
    /// through the watch yet and the cached content is stale, so it is not written again.
    /// With it, what was written.
    statuses: BTreeMap<String, (Option<String>, serde_json::Value)>,
    /// The GpuNode spec writes whose echo has not arrived.
    pub spec_writes: SpecWrites,
}

impl Writer {
    pub fn new(client: Client, leadership: Leadership) -> Self {
        Self {
            client,
            leadership,
            statuses: BTreeMap::new(),
            spec_writes: SpecWrites::default(),
        }
    }

    /// Writes the specs that differ. They are independent of each other: a policy edit
    /// on a thousand nodes is a thousand round trips, so they go out a few at a time.
    pub async fn apply_specs(&mut self, writes: &[SpecWrite], metrics: &Metrics) -> Applied {
        let results: Vec<_> = stream::iter(writes.iter().map(|w| {
            let this = &*self;
            async move { (w, this.write_spec(&w.node, &w.spec).await) }
        }))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect()
        .await;
        let mut applied = Applied {
            written: BTreeSet::new(),
            reconfigured: Vec::new(),
            error: None,
        };
        for (w, result) in results {
            match result {
                Ok(after) => {
                    applied.written.insert(w.node.clone());
                    let changes = events::spec_changes(&w.before, &w.spec);
                    info!(gpunode = %w.node, gpus = w.spec.gpus.len(), changes = ?changes, "GpuNode spec written");
                    metrics.wrote("gpunode_spec");
                    self.spec_writes.wrote(&w.node, &after, w.spec.clone());
                    applied.reconfigured.push((w.node.clone(), changes));
                }
                Err(e) => {
                    if !matches!(e, Error::NotLeading) {
                        metrics.error("spec_write");
                    }
                    applied.error.get_or_insert(e);
                }
            }
        }
        applied
    }

    /// Whether this process already wrote `content` to `policy`'s status while the cache
    /// showed version `seen`, and the cache still shows it (the write's echo has not
    /// arrived).
    pub fn status_in_flight(
        &mut self,
        policy: &str,
        seen: &Option<String>,
        content: &serde_json::Value,
    ) -> bool {
        match self.statuses.get(policy) {
            Some((v, c)) if v == seen && c == content => true,
            Some(_) => {
                self.statuses.remove(policy);
                false
            }
            None => false,
        }
    }

    /// Writes `policy`'s status; remembers it was written while the cache showed `seen`.
    pub async fn write_status(
        &mut self,
        policy: &str,
        status: &GpuSharingPolicyStatus,
        seen: Option<String>,
        content: serde_json::Value,
    ) -> Result<(), Error> {
        self.may_write()?;
        let api: Api<GpuSharingPolicy> = Api::all(self.client.clone());
        let patch = json!({
            "apiVersion": GpuSharingPolicy::api_version(&()),
            "kind": GpuSharingPolicy::kind(&()),
            "metadata": {"name": policy},
            "status": status,
        });
        api.patch_status(
            policy,
            &apply_params(OPERATOR_FIELD_MANAGER),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| Error::Write {
            what: "GpuSharingPolicy status",
            name: policy.to_string(),
            source,
        })?;
        self.statuses.insert(policy.to_string(), (seen, content));
        Ok(())
    }

    /// Checked before every write: a pass takes time, and the Lease may run out during it.
    fn may_write(&self) -> Result<(), Error> {
        if self.leadership.leads(SystemTime::now()) {
            Ok(())
        } else {
            Err(Error::NotLeading)
        }
    }

    /// Writes the spec; returns the object's metadata as the API server answered.
    async fn write_spec(&self, name: &str, spec: &GpuNodeSpec) -> Result<ObjectMeta, Error> {
        self.may_write()?;
        let api: Api<GpuNode> = Api::all(self.client.clone());
        // An apply that owns no GPU entry any more would leave `spec` empty, and the API
        // server prunes an empty applied object to null, which the schema refuses: the
        // last entries are removed with a merge patch instead.
        let result = if spec.gpus.is_empty() {
            let params = PatchParams {
                field_manager: Some(OPERATOR_FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            };
            api.patch(
                name,
                &params,
                &Patch::Merge(json!({"spec": {"gpus": null}})),
            )
            .await
        } else {
            let patch = json!({
                "apiVersion": GpuNode::api_version(&()),
                "kind": GpuNode::kind(&()),
                "metadata": {"name": name},
                "spec": spec,
            });
            api.patch(
                name,
                &apply_params(OPERATOR_FIELD_MANAGER),
                &Patch::Apply(&patch),
            )
            .await
        };
        result.map(|g| g.metadata).map_err(|source| Error::Write {
            what: "GpuNode spec",
            name: name.to_string(),
            source,
        })
    }
}
