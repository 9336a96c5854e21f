//! The MPS control daemons of prepared claims: one per claim and GPU, so that each claim's
//! compute and memory share is a ceiling its server enforces (`containers.md` §4.3-§4.4).
//!
//! MPS runs one active server per control daemon, and a server's limits apply to all its
//! clients; a client's own variables only lower them. So each claim gets a daemon of its
//! own, started with the claim's limits in its environment (every server it starts, after
//! a restart too, has them before any client connects), its own pipe directory (only the
//! claim's containers can reach it: no tenant can stop or reconfigure another's server)
//! and its own tmpfs as `/dev/shm`, bound into the daemon and every client. Several
//! daemons share a GPU in compute mode `DEFAULT`: the claims' servers take turns on the
//! GPU, as contexts of different processes do, while the processes of one claim run
//! concurrently through their server (docs/concepts/sharing.md says what that
//! guarantees).
//!
//! The daemon's life is the node's, not a prepare's: the node loop's pass checks every
//! prepared claim's daemon ([`Driver::supervise_mps`]), adopts one that a previous plugin
//! process started and restarts one that died, and the claim's status tells its pods.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
};

use tessera_gpu::backend::{ComputeMode, MpsDaemonConfig, MpsState};
use tracing::{info, warn};

use super::{ClaimError, Driver};
use crate::{
    checkpoint::{ClaimPhase, DeviceKind, DeviceRecord},
    kubelet::ClaimRef,
};

impl Driver {
    /// The directory of claim `uid`'s daemon on `gpu`: `pipe/`, `shm/` and `log/` in it.
    pub(super) fn mps_dir(&self, uid: &str, gpu: u32) -> PathBuf {
        self.mps_root.join(format!("{uid}-gpu{gpu}"))
    }

    /// Where claim `uid`'s containers reach its daemon on `gpu`, on the host.
    pub(super) fn mps_pipe_dir(&self, uid: &str, gpu: u32) -> PathBuf {
        self.mps_dir(uid, gpu).join("pipe")
    }

    /// The tmpfs the daemon and the claim's containers share as `/dev/shm`.
    pub(super) fn mps_shm_dir(&self, uid: &str, gpu: u32) -> PathBuf {
        self.mps_dir(uid, gpu).join("shm")
    }

    /// How claim `uid`'s daemon for device `d` runs; `None` for a device that is not an
    /// MPS share.
    pub(super) fn mps_daemon(&self, uid: &str, d: &DeviceRecord) -> Option<MpsDaemonConfig> {
        let DeviceKind::Mps {
            active_thread_percentage,
            pinned_memory_limit_mib,
            ..
        } = &d.kind
        else {
            return None;
        };
        let dir = self.mps_dir(uid, d.gpu);
        Some(MpsDaemonConfig {
            pipe_dir: dir.join("pipe"),
            log_dir: dir.join("log"),
            shm_dir: Some(dir.join("shm")),
            default_active_thread_percentage: u8::try_from(*active_thread_percentage)
                .ok()
                .filter(|p| (1..100).contains(p)),
            default_pinned_memory_limit_mib: Some(*pinned_memory_limit_mib),
        })
    }

    /// Starts (or adopts) claim `uid`'s daemon for MPS device `d`: MIG mode off (a daemon
    /// for the whole GPU serves nothing while it is on) and compute mode `DEFAULT`, so the
    /// daemons of the GPU's other claims keep running beside it.
    pub(super) async fn start_mps_daemon(
        &self,
        uid: &str,
        d: &DeviceRecord,
    ) -> Result<(), ClaimError> {
        let Some(config) = self.mps_daemon(uid, d) else {
            return Ok(());
        };
        let gpu = d.gpu;
        if self.backend.mps_known_running(gpu, &config.pipe_dir) {
            return Ok(());
        }
        let mig_capable = self.gpus().layouts.contains_key(&gpu);
        let started = std::time::Instant::now();
        self.on_hardware(move |b| {
            if matches!(
                b.mps_state(gpu, &config.pipe_dir)?,
                MpsState::Running { .. }
            ) {
                return Ok(());
            }
            if mig_capable {
                super::prepare::ensure_mig_mode(b, gpu, false)?;
            }
            b.set_compute_mode(gpu, ComputeMode::Default)?;
            b.start_mps(gpu, &config).map(|_| ())
        })
        .await?;
        self.metrics
            .observe_hardware("start_mps", started.elapsed());
        Ok(())
    }

    /// Stops claim `uid`'s daemon for MPS device `d` and removes its directory.
    pub(super) async fn stop_mps_daemon(
        &self,
        uid: &str,
        d: &DeviceRecord,
    ) -> Result<(), ClaimError> {
        let Some(config) = self.mps_daemon(uid, d) else {
            return Ok(());
        };
        let (gpu, dir) = (d.gpu, self.mps_dir(uid, d.gpu));
        self.on_hardware(move |b| b.stop_mps(gpu, &config)).await?;
        // Only what the daemon left (its log, the empty pipe and shm directories): a
        // failure here leaks a directory, not a running thing, and the next start-up's
        // sweep retries it.
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(dir = %dir.display(), error = %crate::error_chain(&e), "could not remove an MPS daemon's directory");
        }
        Ok(())
    }

    /// Checks the daemon of every prepared MPS device: one a previous plugin process
    /// started is adopted, one that died is started again with the claim's limits, and
    /// the claim's status says so. Returns, per GPU with MPS claims, whether all their
    /// daemons run now.
    pub async fn supervise_mps(&self) -> BTreeMap<u32, bool> {
        let prepared: Vec<(ClaimRef, crate::checkpoint::ClaimRecord)> = {
            let cp = self.claims.lock().await;
            cp.claims
                .values()
                .filter(|r| r.phase == ClaimPhase::PrepareCompleted)
                .filter(|r| {
                    r.devices
                        .iter()
                        .any(|d| matches!(d.kind, DeviceKind::Mps { .. }))
                })
                .map(|r| {
                    (
                        ClaimRef {
                            namespace: r.namespace.clone(),
                            name: r.name.clone(),
                            uid: r.uid.clone(),
                        },
                        r.clone(),
                    )
                })
                .collect()
        };
        let mut running: BTreeMap<u32, bool> = BTreeMap::new();
        for (claim, record) in prepared {
            let _claim_guard = self.lock_claim(&claim.uid).await;
            // Unprepared while we waited for its lock: nothing to supervise.
            if !self.claims.lock().await.claims.contains_key(&claim.uid) {
                continue;
            }
            let mut restarted = false;
            for d in record
                .devices
                .iter()
                .filter(|d| matches!(d.kind, DeviceKind::Mps { .. }))
            {
                let ok = match self.check_mps_daemon(&claim, d).await {
                    Ok(Check::Running) => true,
                    Ok(Check::Restarted) => {
                        restarted = true;
                        let n = {
                            let mut r = self.mps_restarts.lock().unwrap_or_else(|p| p.into_inner());
                            let n = r.entry((claim.uid.clone(), d.device.clone())).or_insert(0);
                            *n += 1;
                            *n
                        };
                        self.metrics.mps_daemon_restarts.inc();
                        warn!(claim = %claim, gpu = d.gpu, restarts = n, "the claim's MPS control daemon had stopped; started it again with the claim's limits");
                        true
                    }
                    Err(e) => {
                        warn!(claim = %claim, gpu = d.gpu, error = %crate::error_chain(&e), "the claim's MPS control daemon is not running and could not be started; retried on the next pass");
                        false
                    }
                };
                let all = running.entry(d.gpu).or_insert(true);
                *all &= ok;
            }
            if restarted {
                let restarts = self.mps_restarts_of(&claim.uid);
                self.status_writer.queue_with(&claim, &record, restarts);
            }
        }
        running
    }

    /// Restarts of claim `uid`'s daemons, by device name.
    pub(super) fn mps_restarts_of(&self, uid: &str) -> BTreeMap<String, u32> {
        self.mps_restarts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((u, _), _)| u == uid)
            .map(|((_, device), n)| (device.clone(), *n))
            .collect()
    }

    async fn check_mps_daemon(
        &self,
        claim: &ClaimRef,
        d: &DeviceRecord,
    ) -> Result<Check, ClaimError> {
        let Some(config) = self.mps_daemon(&claim.uid, d) else {
            return Ok(Check::Running);
        };
        let gpu = d.gpu;
        if self.backend.mps_known_running(gpu, &config.pipe_dir) {
            return Ok(Check::Running);
        }
        let pipe = config.pipe_dir.clone();
        let state = self.on_hardware(move |b| b.mps_state(gpu, &pipe)).await?;
        if matches!(state, MpsState::Running { .. }) {
            return Ok(Check::Running);
        }
        let _gpu_guard = self.lock_gpus(&BTreeSet::from([gpu])).await;
        self.start_mps_daemon(&claim.uid, d).await?;
        Ok(Check::Restarted)
    }

    /// Removes the daemon directories no recorded claim owns (a claim forgotten by a
    /// crash between its daemon's stop and its directory's removal), stopping what runs
    /// there first. Called once at start-up, after recovery.
    pub(super) async fn sweep_mps_dirs(&self) {
        let Ok(entries) = std::fs::read_dir(&self.mps_root) else {
            return;
        };
        let owned: BTreeSet<PathBuf> = {
            let cp = self.claims.lock().await;
            cp.claims
                .values()
                .flat_map(|r| r.devices.iter().map(|d| self.mps_dir(&r.uid, d.gpu)))
                .collect()
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            if owned.contains(&dir) || !dir.is_dir() {
                continue;
            }
            let Some(gpu) = dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.rsplit_once("-gpu"))
                .and_then(|(_, g)| g.parse::<u32>().ok())
            else {
                continue;
            };
            let config = MpsDaemonConfig {
                pipe_dir: dir.join("pipe"),
                log_dir: dir.join("log"),
                shm_dir: Some(dir.join("shm")),
                ..MpsDaemonConfig::default()
            };
            match self.on_hardware(move |b| b.stop_mps(gpu, &config)).await {
                Ok(()) => {
                    info!(dir = %dir.display(), "removed the MPS daemon directory of a claim no longer prepared");
                    let _ = std::fs::remove_dir_all(&dir);
                }
                Err(e) => {
                    warn!(dir = %dir.display(), error = %crate::error_chain(&e), "could not stop a leftover MPS daemon");
                }
            }
        }
    }
}

/// What a check of one daemon found.
enum Check {
    Running,
    Restarted,
}
