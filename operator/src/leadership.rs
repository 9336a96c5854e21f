//! Whether this replica may write, now.
//!
//! kube-lease-manager says when this replica takes the Lease and when it sees another
//! holding it, but not when a renewal fails: it logs the error and tries again after a
//! backoff of up to 30 s, and its channel keeps saying `true` while the Lease runs out and
//! another replica takes it. So the operator also watches the Lease, and a replica writes
//! only while it holds the Lease as the watch shows it and its last renewal there
//! (`spec.renewTime`, which this replica wrote with its own clock) plus
//! `spec.leaseDurationSeconds`, less a margin, is still ahead of its clock. Other
//! replicas take the Lease at the renewal plus the duration by their clocks; the margin
//! stands for a write already on its way and for clocks that differ a little. A renewal
//! that fails never reaches the watch, so the last one seen is the last that succeeded.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tokio::sync::{Notify, watch};
use tokio_util::task::AbortOnDropHandle;
use tracing::warn;

/// What this replica's writes wait for.
pub struct Leadership {
    elected: watch::Receiver<bool>,
    /// Keeps the channel of a replica without leader election open.
    _always: Option<watch::Sender<bool>>,
    lease: Option<LeaseWatch>,
}

/// The Lease as the watch shows it.
struct LeaseWatch {
    store: Store<Lease>,
    at: ObjectRef<Lease>,
    identity: String,
    margin: Duration,
}

impl Leadership {
    /// A replica without leader election: it always writes.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            elected: rx,
            _always: Some(tx),
            lease: None,
        }
    }

    /// A replica in leader election: `elected` is the lease manager's word; `lease`
    /// shows Lease `namespace/name`, which this replica holds as `identity`.
    pub fn elected(
        elected: watch::Receiver<bool>,
        lease: Store<Lease>,
        namespace: &str,
        name: &str,
        identity: &str,
        margin: Duration,
    ) -> Self {
        Self {
            elected,
            _always: None,
            lease: Some(LeaseWatch {
                store: lease,
                at: ObjectRef::new(name).within(namespace),
                identity: identity.to_string(),
                margin,
            }),
        }
    }

    /// How much longer this replica may write, at wall-clock time `now`; `None` when it
    /// may not write now.
    pub fn writes_for(&self, now: SystemTime) -> Option<Duration> {
        if !*self.elected.borrow() {
            return None;
        }
        let Some(l) = &self.lease else {
            return Some(Duration::MAX);
        };
        let lease = l.store.get(&l.at)?;
        valid_for(&lease, &l.identity, l.margin, now)
    }

    /// Whether this replica may write at `now`.
    pub fn leads(&self, now: SystemTime) -> bool {
        self.writes_for(now).is_some()
    }

    /// Marks the lease manager's word as seen, so [`Self::changed`] waits for the next.
    pub fn mark_seen(&mut self) {
        self.elected.borrow_and_update();
    }

    /// Waits for the lease manager's next word; an error when it stopped.
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        self.elected.changed().await
    }
}

/// How much longer `lease` lets `identity` write at `now`: until its last renewal plus
/// its duration, less `margin`. `None` when another holds it, it says nothing of its
/// renewal, or that time has passed.
pub fn valid_for(
    lease: &Lease,
    identity: &str,
    margin: Duration,
    now: SystemTime,
) -> Option<Duration> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = SystemTime::from(spec.renew_time.as_ref()?.0);
    let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let until = (renewed + duration).checked_sub(margin)?;
    until.duration_since(now).ok().filter(|d| !d.is_zero())
}

/// Watches Lease `namespace/name`; `changed` is notified on every event (a renewal may
/// let a replica write again). The watch stops when the returned handle is dropped.
pub fn watch_lease(
    client: &Client,
    namespace: &str,
    name: &str,
    changed: Arc<Notify>,
) -> (Store<Lease>, AbortOnDropHandle<()>) {
    let (store, writer) = reflector::store();
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    let task = tokio::spawn(stream.for_each(move |ev| {
        match ev {
            Ok(_) => changed.notify_one(),
            Err(e) => warn!(error = %tessera_kit::error_chain(&e), "Lease watch failed; retrying"),
        }
        std::future::ready(())
    }));
    (store, AbortOnDropHandle::new(task))
}

#[cfg(test)]
mod tests;
