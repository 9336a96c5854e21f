//! `NodeUnprepareResources` for one claim, and the rollback of a half-prepared one.

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::{ClaimError, Driver};
use crate::{
    checkpoint::{ClaimRecord, DeviceKind},
    crash_points,
    kubelet::ClaimRef,
};

impl Driver {
    /// Unprepares one claim; a claim we never prepared (or already unprepared) is fine.
    pub(super) async fn unprepare_claim(&self, c: &ClaimRef) -> Result<(), ClaimError> {
        let _claim_guard = self.lock_claim(&c.uid).await;
        let Some(rec) = self.claims.lock().await.claims.get(&c.uid).cloned() else {
            return Ok(());
        };
        let gpus: BTreeSet<u32> = rec.devices.iter().map(|d| d.gpu).collect();
        let _guards = self.lock_gpus(&gpus).await;
        self.rollback(&rec).await?;
        info!(claim = %c, "unprepared");
        Ok(())
    }

    /// Undoes everything a record says was made, then forgets the claim. Each step is
    /// idempotent, so an interrupted rollback can simply run again. The caller holds the
    /// GPU locks.
    pub(super) async fn rollback(&self, rec: &ClaimRecord) -> Result<(), ClaimError> {
        for d in rec.devices.iter().rev() {
            match &d.kind {
                // The static layout's instance outlives the claim.
                DeviceKind::Mig { held: true, .. } => {}
                DeviceKind::Mig {
                    profile_id,
                    start,
                    created,
                    ..
                } => {
                    let (gpu, profile_id, start) = (d.gpu, *profile_id, *start);
                    let identity = created.clone();
                    let layout_holds = self
                        .claims
                        .lock()
                        .await
                        .held(gpu, start, profile_id)
                        .and_then(|h| h.created.as_ref())
                        .is_some_and(|m| identity.as_ref().is_none_or(|i| i.uuid == m.uuid));
                    if layout_holds {
                        continue;
                    }
                    let started = std::time::Instant::now();
                    self.on_hardware(move |b| {
                        // GI ids are reused after destroy: identify the instance by its
                        // placement, and by UUID when we recorded one, so we never destroy
                        // an instance that is not the one we made.
                        let found = b.mig_instances(gpu)?.into_iter().find(|i| {
                            i.start == start
                                && i.profile_id == profile_id
                                && identity
                                    .as_ref()
                                    .is_none_or(|m| i.uuid().is_none_or(|u| u == m.uuid))
                        });
                        match found {
                            Some(i) => b.destroy_mig_device(gpu, i.gpu_instance_id),
                            None => Ok(()),
                        }
                    })
                    .await?;
                    self.metrics
                        .observe_hardware("destroy_mig_device", started.elapsed());
                }
                // The claim's own daemon: its clients are the claim's containers, gone
                // by now.
                DeviceKind::Mps { .. } => {
                    self.stop_mps_daemon(&rec.uid, d).await?;
                    self.mps_restarts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(uid, _), _| *uid != rec.uid);
                }
                DeviceKind::Gpu { .. } | DeviceKind::TimeSlice { .. } => {}
            }
        }
        if let Err(e) = self.cdi.remove(&rec.uid) {
            warn!(claim = %rec.uid, error = %crate::error_chain(&e), "could not remove the CDI spec");
            return Err(e.into());
        }
        crash_points::reached(crash_points::CDI_SPEC_REMOVED);
        let uid = rec.uid.clone();
        self.store_io(move |s| s.remove_claim(&uid)).await?;
        crash_points::reached(crash_points::CLAIM_FORGOTTEN);
        self.claims.lock().await.claims.remove(&rec.uid);
        Ok(())
    }
}
