//! `NodePrepareResources` for one claim.

use std::collections::BTreeSet;

use tessera_gpu::backend::{
    BackendError, ComputeMode, ErrorKind, MpsDaemonConfig, MpsState, Operation,
};
use tracing::{info, warn};

use super::{ClaimError, Driver};
use crate::{
    cdi::{self, CdiDevice},
    checkpoint::{ClaimPhase, ClaimRecord, DeviceKind, DeviceRecord, MigIdentity},
    crash_points, device_edits,
    kubelet::{ClaimRef, PreparedDevice},
    slices::{GpuOffer, offer_device_names},
};

pub(crate) fn to_prepared(rec: &ClaimRecord) -> Vec<PreparedDevice> {
    rec.devices
        .iter()
        .map(|d| PreparedDevice {
            request_names: d.request_names.clone(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
            share_id: d.share_id.clone(),
        })
        .collect()
}

impl Driver {
    /// Prepares one claim; idempotent.
    pub(super) async fn prepare_claim(
        &self,
        c: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        if let Some(done) = self.completed(&c.uid).await {
            return Ok(done);
        }
        let _claim_guard = self.lock_claim(&c.uid).await;
        // A repeated call may have finished while we waited for the lock.
        if let Some(done) = self.completed(&c.uid).await {
            return Ok(done);
        }
        let claim = self.read_claim(c).await?;
        let mut devices = self.plan(&claim)?;
        let gpus: BTreeSet<u32> = devices.iter().map(|d| d.gpu).collect();
        // The GPU locks cover checking, recording the intent and the hardware change; the
        // rest (CDI spec, completion) only concerns this claim, which its own lock covers.
        let gpu_guards = self.lock_gpus(&gpus).await;
        let half_done = self.claims.lock().await.claims.get(&c.uid).cloned();
        if let Some(rec) = half_done {
            info!(claim = %c, "rolling back an interrupted prepare before retrying it");
            self.rollback(&rec).await?;
        }
        self.check_offered(&devices)?;
        self.check_not_in_use(c, &devices).await?;
        self.hand_out_held(&mut devices).await;

        // Phase 1: record the intent before touching hardware.
        let mut record = ClaimRecord {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
            phase: ClaimPhase::PrepareStarted,
            devices: devices.clone(),
        };
        self.save_record(&record).await?;

        for i in 0..devices.len() {
            if let Err(e) = self.make(&mut devices[i]).await {
                record.devices = devices.clone();
                if let Err(rb) = self.rollback(&record).await {
                    warn!(claim = %c, error = %crate::error_chain(&rb), "rollback after a failed prepare also failed; the next start-up retries it");
                }
                return Err(e);
            }
            if matches!(devices[i].kind, DeviceKind::Mig { .. }) {
                // Record the instance's identity at once: a crash from here on must
                // find and destroy exactly this instance.
                record.devices = devices.clone();
                self.save_record(&record).await?;
            }
        }

        drop(gpu_guards);

        let cdi_devices: Vec<CdiDevice> = devices
            .iter()
            .map(|d| self.cdi_device(&c.uid, d))
            .collect::<Result<_, _>>()?;
        for d in &mut devices {
            d.cdi_device_ids = vec![self.cdi.qualified_id(&c.uid, &d.device)];
        }
        self.cdi.write(&c.uid, &cdi_devices)?;
        crash_points::reached(crash_points::CDI_SPEC_WRITTEN);

        // Phase 2: done.
        record.devices = devices;
        record.phase = ClaimPhase::PrepareCompleted;
        self.save_record(&record).await?;
        info!(claim = %c, devices = ?record.devices.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(), "prepared");

        // The devices are made and the pod can run: the status is informational, so it is
        // written off the kubelet's critical path.
        self.status_writer.queue(c, &record);
        Ok(to_prepared(&record))
    }

    /// Marks the MIG devices whose instance the GPU's static layout holds: the claim is
    /// handed that instance, nothing is created, and the instance outlives the claim.
    /// Decided under the GPU locks, before the intent is recorded, so a rollback of this
    /// claim can never destroy a held instance.
    async fn hand_out_held(&self, devices: &mut [DeviceRecord]) {
        let cp = self.claims.lock().await;
        for d in devices {
            if let DeviceKind::Mig {
                profile_id,
                start,
                created,
                held,
                ..
            } = &mut d.kind
                && let Some(m) = cp
                    .held(d.gpu, *start, *profile_id)
                    .and_then(|h| h.created.clone())
            {
                *created = Some(m);
                *held = true;
            }
        }
    }

    async fn completed(&self, uid: &str) -> Option<Vec<PreparedDevice>> {
        let cp = self.claims.lock().await;
        cp.claims
            .get(uid)
            .filter(|r| r.phase == ClaimPhase::PrepareCompleted)
            .map(to_prepared)
    }

    /// Writes a claim's record, then mirrors it in memory. The caller holds the claim's
    /// lock, so two writes of one claim never race.
    pub(super) async fn save_record(&self, record: &ClaimRecord) -> Result<(), ClaimError> {
        let on_disk = record.clone();
        self.store_io(move |s| s.save_claim(&on_disk)).await?;
        crash_points::reached(crash_points::claim_recorded(record.phase));
        self.claims
            .lock()
            .await
            .claims
            .insert(record.uid.clone(), record.clone());
        Ok(())
    }

    /// Last line of defence behind the scheduler's accounting: hardware (a whole GPU, the
    /// memory slices of a MIG placement) is never prepared for two claims, whatever the
    /// devices are called (allocations written by hand bypass the scheduler's counters).
    async fn check_not_in_use(
        &self,
        c: &ClaimRef,
        devices: &[DeviceRecord],
    ) -> Result<(), ClaimError> {
        let cp = self.claims.lock().await;
        for d in devices {
            let layout = self.gpus().layouts.get(&d.gpu);
            for (uid, other) in &cp.claims {
                if *uid == c.uid {
                    continue;
                }
                if let Some(held) = other.devices.iter().find(|o| o.overlaps(d, layout)) {
                    return Err(ClaimError::InUse {
                        device: d.device.clone(),
                        held: held.device.clone(),
                        other: format!("{}/{}", other.namespace, other.name),
                    });
                }
            }
        }
        Ok(())
    }

    /// Refuses a device its GPU does not offer now (see [`crate::fence::AppliedOffers`]). A GPU with no
    /// applied offer yet (the node loop's first pass has not run since the plugin first
    /// started on this node) is not checked: nothing was published that it could differ
    /// from.
    fn check_offered(&self, devices: &[DeviceRecord]) -> Result<(), ClaimError> {
        for d in devices {
            let (Some(info), Some(offer)) = (self.gpus().gpu(d.gpu), self.applied.get(d.gpu))
            else {
                continue;
            };
            if !offered(info, self.gpus().layouts.get(&d.gpu), &offer, d) {
                return Err(ClaimError::NotOffered {
                    device: d.device.clone(),
                    gpu: d.gpu,
                    offers: crate::status::strategy_of(&offer).as_str(),
                });
            }
        }
        Ok(())
    }

    /// Makes one device on the hardware.
    async fn make(&self, d: &mut DeviceRecord) -> Result<(), ClaimError> {
        let gpu = d.gpu;
        match &mut d.kind {
            DeviceKind::Mig { held: true, .. } => {}
            DeviceKind::Mig {
                profile_id,
                start,
                created,
                ..
            } => {
                let (profile_id, start) = (*profile_id, *start);
                let started = std::time::Instant::now();
                let inst = self
                    .on_hardware(move |b| {
                        ensure_mig_mode(b, gpu, true)?;
                        b.create_mig_device(gpu, profile_id, start)
                    })
                    .await?;
                self.metrics
                    .observe_hardware("create_mig_device", started.elapsed());
                let ci = inst
                    .compute_instances
                    .first()
                    .cloned()
                    .ok_or(ClaimError::NoComputeInstance { gpu })?;
                *created = Some(MigIdentity {
                    gpu_instance_id: inst.gpu_instance_id,
                    compute_instance_id: ci.id,
                    uuid: ci.uuid,
                });
            }
            // Every shape but a MIG partition needs MIG mode off: with it on, CUDA sees
            // only MIG devices and a process on the whole GPU finds none. The counters (or
            // the check against the applied offer) guarantee no partition is allocated,
            // so only a GPU without instances gets here.
            DeviceKind::Gpu { .. } | DeviceKind::TimeSlice { .. } => {
                if self.gpus().layouts.contains_key(&gpu) {
                    self.on_hardware(move |b| ensure_mig_mode(b, gpu, false))
                        .await?;
                }
            }
            // Its daemon already runs (every prepare but a GPU's first): nothing to do, and
            // no hop off the runtime's worker to find that out. A daemon runs only on a
            // GPU with MIG mode off.
            DeviceKind::Mps { .. } if self.backend.mps_known_running(gpu) => {}
            DeviceKind::Mps { .. } => {
                let mig_capable = self.gpus().layouts.contains_key(&gpu);
                let pipe_dir = self.mps_root.join(format!("gpu-{gpu}")).join("pipe");
                let log_dir = self.mps_root.join(format!("gpu-{gpu}")).join("log");
                let started = std::time::Instant::now();
                self.on_hardware(move |b| {
                    if matches!(b.mps_state(gpu)?, MpsState::Running { .. }) {
                        return Ok(());
                    }
                    if mig_capable {
                        ensure_mig_mode(b, gpu, false)?;
                    }
                    for dir in [&pipe_dir, &log_dir] {
                        std::fs::create_dir_all(dir).map_err(|e| {
                            BackendError::new(
                                gpu,
                                Operation::StartMps,
                                ErrorKind::io(format!("creating {}", dir.display()), e),
                            )
                        })?;
                    }
                    // MPS needs EXCLUSIVE_PROCESS so that only the MPS server owns a context.
                    b.set_compute_mode(gpu, ComputeMode::ExclusiveProcess)?;
                    b.start_mps(
                        gpu,
                        &MpsDaemonConfig {
                            pipe_dir,
                            log_dir,
                            ..MpsDaemonConfig::default()
                        },
                    )
                    .map(|_| ())
                })
                .await?;
                self.metrics
                    .observe_hardware("start_mps", started.elapsed());
            }
        }
        Ok(())
    }

    /// The container edits of one device.
    fn cdi_device(&self, uid: &str, d: &DeviceRecord) -> Result<CdiDevice, ClaimError> {
        let gpu = self.gpus().gpu(d.gpu);
        let pipe_dir = self.mps_root.join(format!("gpu-{}", d.gpu)).join("pipe");
        let ctx = device_edits::Context {
            files: self.cdi.files(),
            caps_root: &self.caps_root,
            minor: gpu.and_then(|g| g.minor_number),
            gpu_memory_mib: gpu.map_or(u64::MAX, |g| g.memory_mib),
            mps_pipe_dir: &pipe_dir,
        };
        let container_edits =
            device_edits::edits(d, &ctx).map_err(|source| cdi::Error::Device {
                device: d.device.clone(),
                source,
            })?;
        Ok(CdiDevice {
            name: cdi::device_name(uid, &d.device),
            container_edits,
        })
    }
}

/// Puts a GPU in the MIG mode a device needs. Reset-less GPUs (Hopper and newer) switch at
/// once when idle; others report that a reset is pending, which fails the claim with a
/// message a person can act on.
fn ensure_mig_mode(
    b: &dyn tessera_gpu::backend::GpuBackend,
    gpu: u32,
    enabled: bool,
) -> Result<(), BackendError> {
    let info = b.gpus()?.into_iter().find(|g| g.index == gpu);
    if info.as_ref().is_some_and(|g| g.mig_enabled == enabled) {
        return Ok(());
    }
    if !enabled && !b.mig_instances(gpu)?.is_empty() {
        return Err(BackendError::new(
            gpu,
            Operation::SetMigMode,
            ErrorKind::InUse("MIG instances exist; the whole GPU cannot be handed out".into()),
        ));
    }
    let change = b.set_mig_mode(gpu, enabled)?;
    if change.reset_required || change.current != enabled {
        return Err(BackendError::new(
            gpu,
            Operation::SetMigMode,
            ErrorKind::NotSupported(format!(
                "MIG mode {} is pending a GPU reset on this GPU; drain it and reset it (or set repartition.allowGpuReset)",
                if enabled { "on" } else { "off" }
            )),
        ));
    }
    Ok(())
}

/// Whether `offer` on the GPU `info` has the device `d` was allocated as. A time-sliced
/// GPU and a whole GPU both publish `gpu-<index>`: a time-sliced one is allocated with a
/// share, a whole one without.
fn offered(
    info: &tessera_gpu::backend::GpuInfo,
    layout: Option<&tessera_gpu::MigLayout>,
    offer: &GpuOffer,
    d: &DeviceRecord,
) -> bool {
    let shared = matches!(d.kind, DeviceKind::TimeSlice { .. });
    let sliced = matches!(offer, GpuOffer::TimeSlicing { .. });
    shared == sliced && offer_device_names(info, layout, offer).contains(&d.device)
}
