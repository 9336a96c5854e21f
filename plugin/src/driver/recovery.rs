//! Start-up reconciliation between the checkpoint and the hardware.
//!
//! - A record written before the node last booted is void: the reboot took its MIG
//!   instances, MPS daemon and CDI spec with it. It is forgotten without touching the
//!   hardware, since anything on the GPUs now was made after the boot by someone else.
//! - A claim left in `PrepareStarted` (the plugin died mid-prepare) is rolled back, so the
//!   kubelet's retry starts from clean hardware.
//! - A `PrepareCompleted` claim whose instances are gone (node reboot, manual cleanup) is
//!   forgotten, so the next prepare makes them again instead of returning stale devices.
//! - A `PrepareCompleted` claim whose ResourceClaim no longer exists (or was replaced) is
//!   unprepared: nothing will ever ask for its partition again.
//! - MIG instances the checkpoint does not know are reported and never destroyed.
//! - A claim on a GPU that cannot be read (fell off the bus) is kept as it is: nothing can
//!   be checked or undone there, and the node's other GPUs must still come up.
//! - A claim whose rollback fails (the driver refuses to destroy an instance a process
//!   still uses) is kept as well, and its GPUs report it until a later prepare or
//!   unprepare settles it: one stuck instance must not keep the node's other GPUs from
//!   being served.

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::{ClaimError, Driver};
use crate::{
    checkpoint::{ClaimPhase, ClaimRecord, DeviceKind},
    state::LiveInstances,
};

/// What start-up recovery did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecoveryReport {
    /// Records of an earlier boot, forgotten.
    pub previous_boot: Vec<String>,
    /// Record files that could not be read, moved aside (what they described is unknown:
    /// reported, never destroyed).
    pub unreadable: Vec<String>,
    /// Half-prepared claims rolled back.
    pub rolled_back: Vec<String>,
    /// Completed claims whose hardware was gone, forgotten.
    pub forgotten: Vec<String>,
    /// Completed claims whose ResourceClaim is gone, unprepared.
    pub released: Vec<String>,
    /// MIG instances found that Tessera did not make: `gpu/start/profile`.
    pub foreign_instances: Vec<String>,
    /// Claims on GPUs that could not be read, kept unchanged.
    pub kept_unreadable: Vec<String>,
    /// Claims whose rollback failed, kept with their record: `uid: why`.
    pub failed: Vec<String>,
}

impl Driver {
    /// Reconciles the checkpoint with the hardware. Run before serving the kubelet.
    pub async fn recover(&self) -> Result<RecoveryReport, ClaimError> {
        let unreadable = std::mem::take(&mut self.claims.lock().await.unreadable);
        let mut report = RecoveryReport {
            unreadable: unreadable.iter().map(|p| p.display().to_string()).collect(),
            ..RecoveryReport::default()
        };
        let void = std::mem::take(&mut self.claims.lock().await.previous_boot);
        for uid in void.into_keys() {
            // Only the files: the reboot already undid everything else they describe.
            if let Err(e) = self.cdi.remove(&uid) {
                warn!(claim = %uid, error = %crate::error_chain(&e), "could not remove the CDI spec of a claim from an earlier boot");
            }
            let gone = uid.clone();
            self.store_io(move |s| s.remove_claim(&gone)).await?;
            report.previous_boot.push(uid);
        }
        if !report.previous_boot.is_empty() {
            info!(
                claims = report.previous_boot.len(),
                "the node rebooted since these claims were prepared; their records are void and were forgotten (the kubelet prepares them again)"
            );
        }
        let records: Vec<_> = self.claims.lock().await.claims.values().cloned().collect();
        let live = self.state.live_instances().await?;
        for rec in records {
            let gpus: BTreeSet<u32> = rec.devices.iter().map(|d| d.gpu).collect();
            // A GPU that cannot be read cannot be reconciled: keep the record as it is; the
            // kubelet's unprepare (or a later start) settles it.
            if let Some(gpu) = gpus.iter().find(|g| live.unreadable.contains_key(g)) {
                warn!(claim = %rec.uid, gpu, "cannot read the claim's GPU; its record is kept as it is");
                report.kept_unreadable.push(rec.uid.clone());
                continue;
            }
            let _guards = self.lock_gpus(&gpus).await;
            if let Err(e) = self.recover_claim(&rec, &live, &mut report).await {
                let why = crate::error_chain(&e);
                warn!(claim = %rec.uid, gpus = ?gpus, error = %why, "cannot settle the claim's record at start-up; it is kept, its GPUs report it, and the node's other GPUs are served");
                let note = format!(
                    "claim {}/{} ({}) could not be undone at start-up and is kept until a prepare or unprepare of it settles it: {why}",
                    rec.namespace, rec.name, rec.uid
                );
                self.stuck
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(rec.uid.clone(), (gpus, note));
                report.failed.push(format!("{}: {why}", rec.uid));
            }
        }
        // Whatever is left on the GPUs and not in the checkpoint is someone else's.
        let cp = self.claims.lock().await;
        for (gpu, instances) in self.state.live_instances().await?.by_gpu {
            for i in instances {
                if !cp.knows(gpu, i.start, i.profile_id) {
                    report
                        .foreign_instances
                        .push(format!("{gpu}/{}/{}", i.start, i.profile_name));
                }
            }
        }
        if !report.foreign_instances.is_empty() {
            warn!(instances = ?report.foreign_instances, "MIG instances not made by Tessera are present; they are reported, never destroyed, and their slices are not offered");
        }
        drop(cp);
        self.state.notify_changed();
        Ok(report)
    }

    /// Settles one claim's record against the hardware; the caller holds its GPUs' locks.
    async fn recover_claim(
        &self,
        rec: &ClaimRecord,
        live: &LiveInstances,
        report: &mut RecoveryReport,
    ) -> Result<(), ClaimError> {
        match rec.phase {
            ClaimPhase::PrepareStarted => {
                self.rollback(rec).await?;
                report.rolled_back.push(rec.uid.clone());
            }
            ClaimPhase::PrepareCompleted => {
                let intact = rec.devices.iter().all(|d| match &d.kind {
                    DeviceKind::Mig {
                        created: Some(m),
                        start,
                        ..
                    } => live.by_gpu.get(&d.gpu).is_some_and(|v| {
                        v.iter()
                            .any(|i| i.start == *start && i.uuid() == Some(m.uuid.as_str()))
                    }),
                    DeviceKind::Mig { created: None, .. } => false,
                    _ => true,
                });
                if !intact {
                    warn!(claim = %rec.uid, "prepared claim's MIG instances are gone; forgetting it so it is prepared again");
                    self.rollback(rec).await?;
                    report.forgotten.push(rec.uid.clone());
                    return Ok(());
                }
                match self.api.get(&rec.namespace, &rec.name).await {
                    Ok(Some(c)) if c.metadata.uid.as_deref() == Some(rec.uid.as_str()) => {}
                    Ok(_) => {
                        info!(claim = %rec.uid, "claim no longer exists; releasing its devices");
                        self.rollback(rec).await?;
                        report.released.push(rec.uid.clone());
                    }
                    // Cannot tell (API down): keep it; the kubelet will unprepare it.
                    Err(e) => {
                        warn!(claim = %rec.uid, error = %crate::error_chain(&e), "cannot check whether the claim still exists")
                    }
                }
            }
        }
        Ok(())
    }

    /// What start-up recovery could not settle, per GPU, while the claim's record is still
    /// there (a later prepare or unprepare that settles it removes the record).
    pub(super) async fn stuck_notes(&self) -> Vec<(u32, String)> {
        let known: BTreeSet<String> = self.claims.lock().await.claims.keys().cloned().collect();
        let mut stuck = self
            .stuck
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        stuck.retain(|uid, _| known.contains(uid));
        stuck
            .values()
            .flat_map(|(gpus, note)| gpus.iter().map(move |g| (*g, note.clone())))
            .collect()
    }
}
