//! What a GPU holds ahead of any claim: the instances of a static MIG layout, and the MIG
//! mode a GPU that needs a reset to switch must be in before its devices can be used.
//!
//! The node loop asks for it on every pass ([`Driver::hold`]); each GPU is brought one
//! step closer under its lock, so a prepare never sees half a change:
//! - the record is reconciled with the hardware (instances gone are forgotten; one whose
//!   creation a crash interrupted is taken as ours);
//! - held instances the layout no longer wants are destroyed once no claim uses them
//!   (adopted ones are only let go: Tessera never destroys what it did not make);
//! - the MIG mode is switched when the GPU is idle, with a reset only where the governing
//!   policy allows one;
//! - planned instances are adopted where a free instance already sits at the placement,
//!   and created where the placement is free; each is recorded before it is created.
//!
//! What cannot be done yet (a placement taken, a claim still on the GPU, a reset not
//! allowed) is reported, never forced.

use std::collections::{BTreeMap, BTreeSet};

use tessera_api::GpuNodeSpec;
use tessera_gpu::{
    Occupancy, Placement,
    backend::{ComputeMode, GpuInfo, MigInstance, MpsState, TimeSlice},
    catalog::MigLayout,
};
use tracing::{info, warn};

use super::{ClaimError, Driver};
use crate::{
    checkpoint::{Checkpoint, DeviceKind, HeldInstance, HeldLayout, MigIdentity},
    slices::{GpuOffer, offer::config_for},
    state::NodeGpus,
};

/// What one GPU should hold ahead of claims.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuWant {
    /// The static layout's placements (empty: none).
    pub layout: Vec<Placement>,
    /// The MIG mode to set ahead of claims.
    pub mig_mode: MigModeWant,
    /// Whether the GPU may be reset, while nothing uses it, to apply a MIG mode change.
    pub allow_reset: bool,
    /// The time-slice length the GPU should have (`Default` unless it is time-sliced).
    pub time_slice: TimeSlice,
    /// The claims the scheduler allocated on the GPU (`namespace/name`), prepared or not:
    /// a GPU is not idle while one is, since its prepare may come at any moment and must
    /// find the GPU in the shape it was allocated from.
    pub allocated: Vec<String>,
}

impl GpuWant {
    /// Whether holding has anything to do for this GPU besides its time-slice.
    fn wants_mig(&self) -> bool {
        !self.layout.is_empty() || self.mig_mode != MigModeWant::Leave
    }
}

/// The MIG mode a GPU should be in ahead of claims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MigModeWant {
    /// Leave it as it is: the admin set it up, or prepare switches it.
    #[default]
    Leave,
    /// On, once nothing uses the GPU; what holds it back is reported.
    On,
    /// Off, once nothing uses the GPU; what holds it back is reported.
    Off,
    /// Off whenever nothing uses the GPU, quietly: a Hopper GPU offering MIG partitions
    /// goes back to MIG off once its last instance is gone, so a GPU nobody uses is in
    /// the mode every other shape needs, and its status says MIG only while MIG is used.
    OffWhenIdle,
}

/// What holding left undone on each GPU, for `GpuNode.status`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HoldReport {
    /// GPUs whose MIG mode change waits for a GPU reset, with what to do about it.
    pub pending_reset: BTreeMap<u32, String>,
    /// GPUs whose layout or mode is not complete yet, with why.
    pub incomplete: BTreeMap<u32, String>,
}

/// What each GPU should hold, from the offer the hand-over applied to it (never the spec's
/// new shape before the fence has settled: a claim allocated from the old shape in the
/// meantime must find the GPU as it was offered), its `GpuNode.spec` entry (whether a
/// reset is allowed), and the claims allocated on it.
pub fn wants(
    gpus: &NodeGpus,
    offers: &[GpuOffer],
    spec: Option<&GpuNodeSpec>,
    allocated: &BTreeMap<u32, Vec<String>>,
) -> BTreeMap<u32, GpuWant> {
    gpus.gpus
        .iter()
        .zip(offers)
        .map(|(info, offer)| {
            let time_slice = match offer {
                GpuOffer::TimeSlicing { interval, .. } => *interval,
                _ => TimeSlice::Default,
            };
            let want = GpuWant {
                time_slice,
                allocated: allocated.get(&info.index).cloned().unwrap_or_default(),
                ..mig_want(gpus, info, offer, spec)
            };
            (info.index, want)
        })
        .collect()
}

/// The MIG part of a GPU's want.
fn mig_want(
    gpus: &NodeGpus,
    info: &GpuInfo,
    offer: &GpuOffer,
    spec: Option<&GpuNodeSpec>,
) -> GpuWant {
    if !gpus.layouts.contains_key(&info.index) {
        return GpuWant::default();
    }
    let cfg = spec.and_then(|s| config_for(s, info));
    let allow_reset = cfg.is_some_and(|c| c.allow_gpu_reset);
    let needs_reset = !info.architecture.mig_toggle_without_reset();
    let layout = gpus.layouts.get(&info.index);
    let mig_mode = match offer {
        GpuOffer::StaticMig { .. } => MigModeWant::On,
        // A switch that needs a reset is only made for a configuration the operator
        // resolved: the plugin's own default leaves an A100 as the admin set it up.
        _ if needs_reset && cfg.is_none() => MigModeWant::Leave,
        GpuOffer::DynamicMig { .. } if needs_reset => MigModeWant::On,
        // Hopper and newer switch at once: prepare turns MIG on for a partition, and the
        // GPU goes back to MIG off when nothing uses it.
        GpuOffer::DynamicMig { .. } => MigModeWant::OffWhenIdle,
        _ if cfg.is_none() => MigModeWant::OffWhenIdle,
        GpuOffer::Mps { .. } | GpuOffer::TimeSlicing { .. } | GpuOffer::Exclusive => {
            MigModeWant::Off
        }
    };
    let placements = match offer {
        GpuOffer::StaticMig { placements } => placements
            .iter()
            .filter(|(id, _)| layout.is_some_and(|l| l.profile(*id).is_some()))
            .map(|(profile_id, start)| Placement {
                profile_id: *profile_id,
                start: *start,
            })
            .collect(),
        _ => Vec::new(),
    };
    GpuWant {
        layout: placements,
        mig_mode,
        allow_reset,
        ..GpuWant::default()
    }
}

/// The node loop's handle on [`Driver::hold`]: the one hardware change it may ask for.
#[derive(Clone)]
pub struct Keeper(pub(super) std::sync::Arc<Driver>);

impl Keeper {
    /// See [`Driver::hold`].
    pub async fn hold(&self, wants: &BTreeMap<u32, GpuWant>) -> HoldReport {
        self.0.hold(wants).await
    }
}

/// How one GPU stands after a step.
enum Step {
    Done,
    PendingReset(String),
    Incomplete(String),
}

impl Driver {
    /// Brings every GPU of `wants`, and every GPU that holds a layout, one step closer to
    /// what it should hold. A GPU that fails is reported; the others carry on.
    async fn hold(&self, wants: &BTreeMap<u32, GpuWant>) -> HoldReport {
        let held: BTreeSet<u32> = self.claims.lock().await.layouts.keys().copied().collect();
        let slices = self.time_slices_set();
        let gpus: BTreeSet<u32> = wants
            .iter()
            .filter(|(g, w)| w.wants_mig() || slice_to_set(slices.get(g), w.time_slice))
            .map(|(g, _)| *g)
            .chain(held)
            .collect();
        let mut report = HoldReport::default();
        for gpu in gpus {
            let want = wants.get(&gpu).cloned().unwrap_or_default();
            let _guard = self.lock_gpus(&BTreeSet::from([gpu])).await;
            match self.hold_gpu(gpu, &want).await {
                Ok(Step::Done) => {}
                Ok(Step::PendingReset(why)) => {
                    report.pending_reset.insert(gpu, why);
                }
                Ok(Step::Incomplete(why)) => {
                    report.incomplete.insert(gpu, why);
                }
                Err(e) => {
                    let why = crate::error_chain(&e);
                    warn!(gpu, error = %why, "cannot bring the GPU to its configuration; retrying on the next pass");
                    report.incomplete.insert(gpu, why);
                }
            }
        }
        for (gpu, note) in self.stuck_notes().await {
            report.incomplete.entry(gpu).or_insert(note);
        }
        report
    }

    /// What this process set each GPU's time-slice to.
    fn time_slices_set(&self) -> BTreeMap<u32, TimeSlice> {
        self.time_slices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Gives a GPU the time-slice length it should have, in compute mode `Default` when
    /// time-sliced; the caller holds its lock.
    async fn set_time_slice(&self, gpu: u32, slice: TimeSlice) -> Result<(), ClaimError> {
        if !slice_to_set(self.time_slices_set().get(&gpu), slice) {
            return Ok(());
        }
        self.on_hardware(move |b| {
            if slice != TimeSlice::Default {
                b.set_compute_mode(gpu, ComputeMode::Default)?;
            }
            b.set_time_slice(gpu, slice)
        })
        .await?;
        info!(gpu, ?slice, "set the GPU's time-slice length");
        self.time_slices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(gpu, slice);
        Ok(())
    }

    /// One GPU; the caller holds its lock. A time-slice length is set once MIG mode is
    /// off (the driver takes it on full GPUs only); going back to the default never waits.
    async fn hold_gpu(&self, gpu: u32, want: &GpuWant) -> Result<Step, ClaimError> {
        if want.time_slice == TimeSlice::Default {
            self.set_time_slice(gpu, want.time_slice).await?;
            return self.hold_mig(gpu, want).await;
        }
        match self.hold_mig(gpu, want).await? {
            Step::Done => {
                self.set_time_slice(gpu, want.time_slice).await?;
                Ok(Step::Done)
            }
            other => Ok(other),
        }
    }

    /// The MIG mode and static layout of one GPU; the caller holds its lock.
    async fn hold_mig(&self, gpu: u32, want: &GpuWant) -> Result<Step, ClaimError> {
        let (Some(info), Some(geometry)) = (self.gpus().gpu(gpu), self.gpus().layouts.get(&gpu))
        else {
            return Ok(Step::Done);
        };
        let (info, geometry) = (info.clone(), geometry.clone());
        let live = self.on_hardware(move |b| b.mig_instances(gpu)).await?;
        let cp = self.claims.lock().await.clone();
        let mut held = reconcile(cp.layouts.get(&gpu), &info, &live, &cp);
        self.save_layout(gpu, &held).await?;

        // Let go of what the layout no longer wants and no claim uses.
        for h in held.instances.clone() {
            let wanted = want
                .layout
                .iter()
                .any(|p| p.profile_id == h.profile_id && p.start == h.start);
            if wanted || cp.mig_owner(gpu, h.start, h.profile_id).is_some() {
                continue;
            }
            if !h.adopted
                && let Some(m) = &h.created
            {
                let gi = m.gpu_instance_id;
                self.on_hardware(move |b| b.destroy_mig_device(gpu, gi))
                    .await?;
                info!(gpu, profile = %h.profile, start = h.start, "destroyed a free instance the static layout no longer has");
            }
            held.instances
                .retain(|i| !(i.start == h.start && i.profile_id == h.profile_id));
            self.save_layout(gpu, &held).await?;
        }

        let mut on_gpu: Vec<String> = claims_on(&cp, gpu);
        for c in &want.allocated {
            if !on_gpu.contains(c) {
                on_gpu.push(c.clone());
            }
        }
        let mode = match want.mig_mode {
            MigModeWant::Leave => None,
            MigModeWant::On => Some(true),
            MigModeWant::Off => Some(false),
            // Quietly: a GPU in use is not waiting for anything.
            MigModeWant::OffWhenIdle if on_gpu.is_empty() && live.is_empty() => Some(false),
            MigModeWant::OffWhenIdle => None,
        };
        if let Some(mode) = mode {
            match self
                .switch_mode(&info, mode, want.allow_reset, &live, &on_gpu)
                .await?
            {
                Step::Done => {}
                other => return Ok(other),
            }
        }
        if want.layout.is_empty() {
            return Ok(Step::Done);
        }
        self.fill(gpu, &geometry, want, held, &cp).await
    }

    /// Puts the GPU in MIG mode `enabled`, if it is idle; resets it only if allowed.
    async fn switch_mode(
        &self,
        info: &GpuInfo,
        enabled: bool,
        allow_reset: bool,
        live: &[MigInstance],
        on_gpu: &[String],
    ) -> Result<Step, ClaimError> {
        let gpu = info.index;
        let now = self
            .on_hardware(move |b| {
                Ok(b.gpus()?
                    .into_iter()
                    .find(|g| g.index == gpu)
                    .map(|g| g.mig_enabled))
            })
            .await?;
        if now == Some(enabled) {
            return Ok(Step::Done);
        }
        let mode = if enabled { "on" } else { "off" };
        if !on_gpu.is_empty() || !live.is_empty() {
            let users = if on_gpu.is_empty() {
                format!("{} MIG instance(s)", live.len())
            } else {
                format!("claim(s) {}", on_gpu.join(", "))
            };
            return Ok(Step::Incomplete(format!(
                "GPU {gpu}: MIG mode {mode} waits until nothing uses the GPU (now: {users})"
            )));
        }
        let mps = self.on_hardware(move |b| b.mps_state(gpu)).await?;
        if matches!(mps, MpsState::Running { .. }) {
            return Ok(Step::Incomplete(format!(
                "GPU {gpu}: MIG mode {mode} waits until its MPS daemon stops"
            )));
        }
        let change = self
            .on_hardware(move |b| b.set_mig_mode(gpu, enabled))
            .await?;
        if change.current == enabled {
            info!(gpu, enabled, "switched MIG mode");
            return Ok(Step::Done);
        }
        if !allow_reset {
            return Ok(Step::PendingReset(format!(
                "GPU {gpu} ({}): MIG mode {mode} waits for a GPU reset; set repartition.allowGpuReset in the governing policy to let Tessera reset it while no claim uses it, or reset it yourself (nvidia-smi -r -i {gpu})",
                info.product_name
            )));
        }
        match self.on_hardware(move |b| b.reset_gpu(gpu)).await {
            Ok(()) => {
                info!(gpu, enabled, "reset the idle GPU to switch MIG mode");
                Ok(Step::Done)
            }
            Err(e) => Ok(Step::PendingReset(format!(
                "GPU {gpu} ({}): MIG mode {mode} waits for a GPU reset, and resetting it failed: {}",
                info.product_name,
                crate::error_chain(&e)
            ))),
        }
    }

    /// Adopts or creates the planned instances the GPU lacks.
    async fn fill(
        &self,
        gpu: u32,
        geometry: &MigLayout,
        want: &GpuWant,
        mut held: HeldLayout,
        cp: &Checkpoint,
    ) -> Result<Step, ClaimError> {
        let whole: Vec<String> = cp
            .claims
            .values()
            .filter(|r| {
                r.devices
                    .iter()
                    .any(|d| d.gpu == gpu && !matches!(d.kind, DeviceKind::Mig { .. }))
            })
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect();
        if !whole.is_empty() {
            return Ok(Step::Incomplete(format!(
                "GPU {gpu}: the static layout waits for claim(s) using the whole GPU: {}",
                whole.join(", ")
            )));
        }
        let mut waiting = Vec::new();
        for p in &want.layout {
            if held
                .instances
                .iter()
                .any(|h| h.profile_id == p.profile_id && h.start == p.start)
            {
                continue;
            }
            let Some(profile) = geometry.profile(p.profile_id) else {
                continue;
            };
            let name = format!("{} at memory slice {}", profile.name, p.start);
            let live = self.on_hardware(move |b| b.mig_instances(gpu)).await?;
            if let Some(i) = live
                .iter()
                .find(|i| i.profile_id == p.profile_id && i.start == p.start)
            {
                if let Some(owner) = cp.mig_owner(gpu, p.start, p.profile_id) {
                    waiting.push(format!(
                        "{name} waits for claim {}/{} to release its instance there",
                        owner.namespace, owner.name
                    ));
                    continue;
                }
                let Some(identity) = identity_of(i) else {
                    waiting.push(format!(
                        "{name}: the instance found there has no compute instance, so it is left alone"
                    ));
                    continue;
                };
                info!(gpu, profile = %profile.name, start = p.start, "adopted the instance found at a planned placement");
                held.instances.push(HeldInstance {
                    profile_id: p.profile_id,
                    profile: profile.name.clone(),
                    start: p.start,
                    size: profile.memory_slices,
                    created: Some(identity),
                    adopted: true,
                });
                self.save_layout(gpu, &held).await?;
                continue;
            }
            let occupied: Vec<Placement> = live
                .iter()
                .map(|i| Placement {
                    profile_id: i.profile_id,
                    start: i.start,
                })
                .collect();
            let free = Occupancy::from_placements(geometry, &occupied)
                .is_ok_and(|occ| occ.can_place(geometry, *p));
            if !free {
                waiting.push(format!("{name} overlaps an instance that is still there"));
                continue;
            }
            // Recorded first: a crash after the create leaves an instance we know.
            held.instances.push(HeldInstance {
                profile_id: p.profile_id,
                profile: profile.name.clone(),
                start: p.start,
                size: profile.memory_slices,
                created: None,
                adopted: false,
            });
            self.save_layout(gpu, &held).await?;
            let (profile_id, start) = (p.profile_id, p.start);
            let started = std::time::Instant::now();
            let made = self
                .on_hardware(move |b| b.create_mig_device(gpu, profile_id, start))
                .await;
            self.metrics
                .observe_hardware("create_mig_device", started.elapsed());
            let identity = made.map(|i| identity_of(&i));
            let Some(entry) = held.instances.last_mut() else {
                continue;
            };
            match identity {
                Ok(Some(m)) => {
                    entry.created = Some(m);
                    info!(gpu, profile = %profile.name, start, "created an instance of the static layout");
                    self.save_layout(gpu, &held).await?;
                }
                failed => {
                    // The backend leaves nothing behind when a create fails.
                    held.instances.pop();
                    self.save_layout(gpu, &held).await?;
                    return Err(failed
                        .err()
                        .unwrap_or(ClaimError::NoComputeInstance { gpu }));
                }
            }
        }
        if waiting.is_empty() {
            Ok(Step::Done)
        } else {
            Ok(Step::Incomplete(format!(
                "GPU {gpu}: the static layout is not complete: {}",
                waiting.join("; ")
            )))
        }
    }

    /// Writes a GPU's layout record if it differs from the mirror's, then mirrors it.
    pub(super) async fn save_layout(&self, gpu: u32, held: &HeldLayout) -> Result<(), ClaimError> {
        let same = self
            .claims
            .lock()
            .await
            .layouts
            .get(&gpu)
            .map_or(held.instances.is_empty(), |l| l == held);
        if same {
            return Ok(());
        }
        let on_disk = held.clone();
        self.store_io(move |s| s.save_layout(gpu, &on_disk)).await?;
        let mut cp = self.claims.lock().await;
        if held.instances.is_empty() {
            cp.layouts.remove(&gpu);
        } else {
            cp.layouts.insert(gpu, held.clone());
        }
        Ok(())
    }
}

/// Whether a GPU whose time-slice this process last set to `set` (`None`: never) must be
/// given `want`. A GPU never set is taken to have the driver's default, so only a
/// time-sliced GPU is touched after a restart.
fn slice_to_set(set: Option<&TimeSlice>, want: TimeSlice) -> bool {
    match set {
        Some(s) => *s != want,
        None => want != TimeSlice::Default,
    }
}

/// The GPU's record checked against the hardware: a record of another board is void;
/// instances that are gone are forgotten; an instance at a placement whose creation was
/// under way is ours.
fn reconcile(
    recorded: Option<&HeldLayout>,
    info: &GpuInfo,
    live: &[MigInstance],
    cp: &Checkpoint,
) -> HeldLayout {
    let mut held = HeldLayout {
        gpu_uuid: info.uuid.clone(),
        instances: Vec::new(),
    };
    let Some(recorded) = recorded.filter(|r| r.gpu_uuid == info.uuid) else {
        return held;
    };
    for h in &recorded.instances {
        let at = live
            .iter()
            .find(|i| i.start == h.start && i.profile_id == h.profile_id);
        let kept = match (&h.created, at) {
            (Some(m), Some(i)) if i.uuid() == Some(m.uuid.as_str()) => Some(h.clone()),
            (None, Some(i)) if cp.mig_owner(info.index, h.start, h.profile_id).is_none() => {
                identity_of(i).map(|m| HeldInstance {
                    created: Some(m),
                    ..h.clone()
                })
            }
            _ => None,
        };
        held.instances.extend(kept);
    }
    held
}

fn identity_of(i: &MigInstance) -> Option<MigIdentity> {
    let ci = i.compute_instances.first()?;
    Some(MigIdentity {
        gpu_instance_id: i.gpu_instance_id,
        compute_instance_id: ci.id,
        uuid: ci.uuid.clone(),
    })
}

/// The claims prepared on `gpu`, as `namespace/name`.
fn claims_on(cp: &Checkpoint, gpu: u32) -> Vec<String> {
    cp.claims
        .values()
        .filter(|r| r.devices.iter().any(|d| d.gpu == gpu))
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .collect()
}
