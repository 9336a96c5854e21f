//! One watch cache: a reflector over one kind whose objects are held behind kube's
//! [`DeserializeGuard`], so an object that does not deserialize into the operator's type
//! (one stored before a schema was tightened, or under an older version of a CRD) is
//! logged, with its name and the error, and skipped, instead of failing the whole list
//! and stalling the watch for every other object of the kind (kube-rs/kube#774).

use std::{fmt::Debug, hash::Hash, sync::Arc};

use futures::StreamExt;
use kube::{
    Api, Client, Resource, ResourceExt,
    core::DeserializeGuard,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;
use tracing::warn;

/// The cache of one kind.
pub struct Cache<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<DeserializeGuard<K>>,
    /// The watch feeding `store`: it stops when the last clone of the cache is dropped,
    /// instead of running detached until the process ends.
    _task: Arc<AbortOnDropHandle<()>>,
}

impl<K: Resource + Clone + 'static> Clone for Cache<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            _task: self._task.clone(),
        }
    }
}

/// The objects of a cache at one moment.
pub struct Objects<K>(Vec<Arc<DeserializeGuard<K>>>);

impl<K> Objects<K> {
    /// The objects that deserialized.
    pub fn iter(&self) -> impl Iterator<Item = &K> + Clone {
        self.0.iter().filter_map(|g| g.0.as_ref().ok())
    }
}

impl<K> Cache<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    /// Watches every object of the kind that `config` selects; `strip` drops what the
    /// operator never reads from each; `changed` is notified on every event.
    pub fn start(
        client: &Client,
        config: watcher::Config,
        strip: fn(&mut K),
        changed: Arc<Notify>,
    ) -> Self {
        let (store, writer) = reflector::store();
        let api: Api<DeserializeGuard<K>> = Api::all(client.clone());
        let stream = reflector::reflector(
            writer,
            watcher(api, config.any_semantic()).modify(move |o| {
                // Managed fields are a large part of every object and the operator never
                // reads them: the caches hold the objects without.
                o.managed_fields_mut().clear();
                match &mut o.0 {
                    Ok(k) => strip(k),
                    Err(e) => warn!(
                        kind = %K::kind(&K::DynamicType::default()),
                        name = %e.metadata.name.as_deref().unwrap_or_default(),
                        namespace = %e.metadata.namespace.as_deref().unwrap_or_default(),
                        error = %e.error,
                        "skipping an object the operator cannot read"
                    ),
                }
            }),
        )
        .default_backoff();
        let task = tokio::spawn(stream.for_each(move |ev| {
            match ev {
                Ok(_) => changed.notify_one(),
                Err(e) => warn!(error = %tessera_kit::error_chain(&e), "watch failed; retrying"),
            }
            std::future::ready(())
        }));
        Self {
            store,
            _task: Arc::new(AbortOnDropHandle::new(task)),
        }
    }

    /// The objects now.
    pub fn state(&self) -> Objects<K> {
        Objects(self.store.state())
    }

    /// The object `namespace/name`, if it is cached and deserialized.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<DeserializeGuard<K>>> {
        self.store
            .get(&ObjectRef::new(name).within(namespace))
            .filter(|g| g.0.is_ok())
    }

    /// Waits until the cache holds a full list; an error when its watch stopped first.
    pub async fn wait_until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.store.wait_until_ready().await
    }
}
