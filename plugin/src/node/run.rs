//! The loop: a pass, then a wait for something that calls for the next one.

use std::{collections::BTreeSet, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{
    Api, Client,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use tessera_api::GpuNode;
use tessera_gpu::backend::HealthEvent;
use tokio::sync::{broadcast, watch};
use tracing::{info, warn};

use super::{CLAIM_PACE, NodeLoop, RESYNC};
use crate::kubelet::RegistrationState;

impl NodeLoop {
    /// Runs until `shutdown` resolves.
    pub async fn run(
        mut self,
        client: Client,
        mut registration: watch::Receiver<RegistrationState>,
        mut health_events: broadcast::Receiver<HealthEvent>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut changed = self.state.subscribe();
        let gpunodes: Api<GpuNode> = Api::all(client);
        let cfg =
            watcher::Config::default().fields(&format!("metadata.name={}", self.state.node()));
        let mut spec_events = watcher(gpunodes, cfg).default_backoff().boxed();
        let slice_cfg = watcher::Config::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.state.node(),
            self.state.driver_name()
        ));
        let mut slice_events = watcher(self.slices_api.clone(), slice_cfg)
            .default_backoff()
            .boxed();
        // Slice names delivered by the current (re-)list of the slice watch.
        let mut slices_listed = BTreeSet::new();
        // Whether the current (re-)list delivered the object; a list without it means it
        // was deleted while the watch was down.
        let mut listed = false;
        let mut tick = tokio::time::interval(RESYNC);
        let mut backoff = Duration::from_millis(500);
        tokio::pin!(shutdown);
        loop {
            let pass_started = tokio::time::Instant::now();
            let result = self.sync_once().await;
            match &result {
                Ok(_) => backoff = Duration::from_millis(500),
                Err(e) => {
                    warn!(error = %crate::error_chain(e), "node sync failed; retrying");
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            let reg = registration.borrow().clone();
            let ready = match (&result, reg.is_registered()) {
                (Ok(_), true) => Ok(()),
                (Err(e), _) => Err(format!("publishing failed: {}", crate::error_chain(e))),
                (Ok(_), false) => Err(reg.to_string()),
            };
            self.metrics.ready.set(i64::from(ready.is_ok()));
            let _ = self.ready_tx.send(ready);
            // A failed pass is retried after its backoff; a fence's settle time ends
            // without any event. Otherwise the resync tick is the only timer.
            let retry = if result.is_err() {
                Some(backoff)
            } else {
                self.recheck
            };
            let retry = async move {
                match retry {
                    Some(after) => tokio::time::sleep(after).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(retry);
            // Wait for something that calls for a pass.
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    _ = changed.changed() => {
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = tokio::time::sleep_until(pass_started + CLAIM_PACE) => {}
                        }
                        break;
                    }
                    _ = registration.changed() => break,
                    () = self.claim_events.notified(), if self.held_back || self.latent_published => {
                        if !self.held_back && !self.latent_pending() {
                            continue;
                        }
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = tokio::time::sleep_until(pass_started + CLAIM_PACE) => {}
                        }
                        break;
                    }
                    Some(ev) = spec_events.next() => {
                        if self.on_gpunode_event(ev, &mut listed) {
                            break;
                        }
                    }
                    Some(ev) = slice_events.next() => {
                        if let Some(why) = self.on_slice_event(ev, &mut slices_listed) {
                            info!(reason = why, "ResourceSlices changed behind our back; republishing");
                            self.publisher.invalidate();
                            break;
                        }
                    }
                    ev = health_events.recv() => {
                        // A fault calls for a pass (taints, health stream, status); a
                        // non-fatal XID changes nothing. Events lost to lag are read back
                        // by the pass.
                        if let Ok(ev) = ev
                            && !self.on_health_event(ev)
                        {
                            continue;
                        }
                        break;
                    }
                    _ = tick.tick() => {
                        if !self.slices_intact().await {
                            info!("published slices changed behind our back; republishing");
                            self.publisher.invalidate();
                        }
                        break;
                    }
                    () = &mut retry => break,
                }
            }
        }
    }

    /// Whether the published slices are still all there (a kubelet restart wipes them).
    pub(super) async fn slices_intact(&self) -> bool {
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.state.node(),
            self.state.driver_name()
        ));
        match self.slices_api.list(&lp).await {
            Ok(list) => {
                list.items.len() == self.slice_count
                    && list
                        .items
                        .iter()
                        .all(|s| s.spec.pool.generation == self.last_generation)
            }
            // Cannot tell: republishing would meet the same API server. Say so; the slice
            // watch and the next resync try again.
            Err(e) => {
                warn!(
                    error = %crate::error_chain(&e),
                    "cannot list this node's ResourceSlices to check them"
                );
                true
            }
        }
    }

    /// Whether a watch event of the node's own slices calls for a full republish, and why.
    /// Our own writes come back as events too and never do: they carry the generation we
    /// last published. A deletion does (the kubelet deletes every slice of its node at
    /// start-up), and so does a slice of another generation; a slice missing from a
    /// re-list (deleted while the watch was down) does as well.
    pub(super) fn on_slice_event(
        &self,
        ev: Result<watcher::Event<ResourceSlice>, watcher::Error>,
        listed: &mut BTreeSet<String>,
    ) -> Option<&'static str> {
        use kube::ResourceExt;
        match ev {
            Ok(watcher::Event::Delete(s)) => self
                .publisher
                .holds(&s.name_any(), &s.uid().unwrap_or_default())
                .then_some("a published slice was deleted"),
            Ok(watcher::Event::Apply(s)) => (self.slice_count > 0
                && s.spec.pool.generation != self.last_generation)
                .then_some("a slice of another generation appeared"),
            Ok(watcher::Event::Init) => {
                listed.clear();
                None
            }
            Ok(watcher::Event::InitApply(s)) => {
                listed.insert(s.name_any());
                None
            }
            Ok(watcher::Event::InitDone) => (self.slice_count > 0
                && listed.len() != self.slice_count)
                .then_some("the slice watch re-listed a different set of slices"),
            Err(e) => {
                warn!(error = %crate::error_chain(&e), "watching this node's ResourceSlices failed; retrying");
                None
            }
        }
    }

    /// Keeps the watched `GpuNode`; whether the event calls for a pass. Our own status
    /// writes come back as events too: they do not (else every write would cause another
    /// pass and the pacing of claim-driven passes would be lost).
    pub(super) fn on_gpunode_event(
        &mut self,
        ev: Result<watcher::Event<GpuNode>, watcher::Error>,
        listed: &mut bool,
    ) -> bool {
        match ev {
            Ok(watcher::Event::Apply(g) | watcher::Event::InitApply(g)) => {
                *listed = true;
                let change = GpuNodeChange::between(self.gpunode.as_ref(), &g);
                if change == GpuNodeChange::Replaced {
                    self.status.forget();
                }
                self.gpunode = Some(g);
                change != GpuNodeChange::StatusOnly
            }
            Ok(watcher::Event::Delete(_)) => {
                self.gpunode = None;
                true
            }
            Ok(watcher::Event::Init) => {
                *listed = false;
                false
            }
            Ok(watcher::Event::InitDone) => {
                if *listed {
                    false
                } else {
                    self.gpunode = None;
                    true
                }
            }
            Err(e) => {
                warn!(error = %crate::error_chain(&e), "watching this node's GpuNode failed; retrying");
                false
            }
        }
    }
}

/// How a watched `GpuNode` differs from the one kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GpuNodeChange {
    /// A new object (first seen, or deleted and created again): its status is empty, so
    /// what was last written must be written again.
    Replaced,
    /// The spec changed (a new generation): the offers may change.
    Spec,
    /// Only status or metadata changed, typically the echo of our own status write.
    StatusOnly,
}

impl GpuNodeChange {
    pub(super) fn between(kept: Option<&GpuNode>, seen: &GpuNode) -> Self {
        match kept {
            Some(old) if old.metadata.uid == seen.metadata.uid => {
                if old.metadata.generation == seen.metadata.generation {
                    Self::StatusOnly
                } else {
                    Self::Spec
                }
            }
            _ => Self::Replaced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn gpunode(uid: &str, generation: i64, mig_instances: u32) -> GpuNode {
        let mut g = GpuNode::new("node-a", tessera_api::GpuNodeSpec::default());
        g.metadata.uid = Some(uid.into());
        g.metadata.generation = Some(generation);
        g.status = Some(tessera_api::GpuNodeStatus {
            mig_instances,
            ..Default::default()
        });
        g
    }

    #[test]
    pub(super) fn the_echo_of_a_status_write_does_not_call_for_a_pass() {
        let kept = gpunode("u1", 3, 0);
        // Our own status write coming back: same object, same generation.
        assert_eq!(
            GpuNodeChange::between(Some(&kept), &gpunode("u1", 3, 2)),
            GpuNodeChange::StatusOnly
        );
        assert_eq!(
            GpuNodeChange::between(Some(&kept), &gpunode("u1", 4, 0)),
            GpuNodeChange::Spec
        );
        assert_eq!(
            GpuNodeChange::between(Some(&kept), &gpunode("u2", 3, 0)),
            GpuNodeChange::Replaced
        );
        assert_eq!(GpuNodeChange::between(None, &kept), GpuNodeChange::Replaced);
    }
}
