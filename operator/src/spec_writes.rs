//! The `GpuNode.spec`s this process wrote whose echo the watch has not brought back yet
//! (pure).
//!
//! A pass resolves from the watch cache. Right after a spec write the cache still shows
//! the spec before it; a pass that started from that would read a move just written as
//! never made (Superseded) and make another. So, until the write's echo is in the cache,
//! a pass starts from what was written.
//!
//! The echo is known by the object's `metadata.generation`, which the API server raises
//! on every change of the spec and on nothing else (GpuNode has a status subresource;
//! labels, annotations and the plugin's status writes leave it): the cache holds the
//! write once it shows the generation the write was answered with, or a later one, of
//! the same object (uid). A `resourceVersion` cannot say that: an unrelated write that
//! landed before ours changes it too, and versions must not be compared for order.

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
    /// The object written to.
    uid: Option<String>,
    /// Its generation as the write left it.
    generation: Option<i64>,
    spec: GpuNodeSpec,
}

impl Written {
    /// Whether the cache, showing `cached`, does not hold this write yet.
    fn pending(&self, cached: &ObjectMeta) -> bool {
        self.uid.is_some()
            && self.uid == cached.uid
            && self
                .generation
                .is_some_and(|g| cached.generation.is_none_or(|c| c < g))
    }
}

impl SpecWrites {
    /// Records that `spec` was written to GpuNode `node`; the API server answered with
    /// `after`.
    pub fn wrote(&mut self, node: &str, after: &ObjectMeta, spec: GpuNodeSpec) {
        self.written.insert(
            node.to_string(),
            Written {
                uid: after.uid.clone(),
                generation: after.generation,
                spec,
            },
        );
    }

    /// The spec written to `node` whose echo the cache, showing `cached`, does not hold
    /// yet.
    pub fn pending(&self, node: &str, cached: &ObjectMeta) -> Option<&GpuNodeSpec> {
        let w = self.written.get(node)?;
        w.pending(cached).then_some(&w.spec)
    }

    /// Forgets the writes whose echo has arrived (`cached` gives each object as the
    /// cache shows it, `None` when it is gone).
    pub fn forget_echoed<'m>(&mut self, cached: impl Fn(&str) -> Option<&'m ObjectMeta>) {
        self.written
            .retain(|node, w| cached(node).is_some_and(|m| w.pending(m)));
    }
}

#[cfg(test)]
mod tests;
