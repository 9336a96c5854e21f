//! The `GpuNode.spec`s this process wrote whose echo the watch has not brought back yet
//! (pure).
//!
//! A pass resolves from the watch cache. Right after a spec write the cache still shows
//! the spec before it; a pass that started from that would read a move just written as
//! never made and write again. So, until the write's echo is in the cache, a pass starts
//! from what was written.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tessera_api::GpuNodeSpec;

/// The spec writes not echoed yet, by GpuNode name.
#[derive(Clone, Debug, Default)]
pub struct SpecWrites {
    written: BTreeMap<String, Written>,
}

#[derive(Clone, Debug)]
struct Written {
    /// The object's `resourceVersion` in the cache when the pass wrote.
    seen: Option<String>,
    spec: GpuNodeSpec,
}

impl SpecWrites {
    /// Records that `spec` was written to GpuNode `node`, which the cache showed as
    /// `before`; the API server answered with `after`.
    pub fn wrote(
        &mut self,
        node: &str,
        before: &ObjectMeta,
        _after: &ObjectMeta,
        spec: GpuNodeSpec,
    ) {
        self.written.insert(
            node.to_string(),
            Written {
                seen: before.resource_version.clone(),
                spec,
            },
        );
    }

    /// The spec written to `node` whose echo the cache, showing `cached`, does not hold
    /// yet.
    pub fn pending(&self, node: &str, cached: &ObjectMeta) -> Option<&GpuNodeSpec> {
        let w = self.written.get(node)?;
        (w.seen == cached.resource_version).then_some(&w.spec)
    }

    /// Forgets the writes whose echo has arrived (`cached` gives each object as the
    /// cache shows it, `None` when it is gone).
    pub fn forget_echoed<'m>(&mut self, cached: impl Fn(&str) -> Option<&'m ObjectMeta>) {
        self.written
            .retain(|node, w| cached(node).is_some_and(|m| w.seen == m.resource_version));
    }
}

