//! The pass: observe → plan → apply → report.

use std::collections::{BTreeMap, BTreeSet};

use tessera_api::GpuNode;
use tessera_gpu::{Occupancy, backend::MigInstance};
use tracing::warn;

use super::{Error, NodeLoop};
use crate::{
    binding_report::Verdict,
    checkpoint::Checkpoint,
    driver::{self, GpuWant, HoldReport},
    latent::LatentClaim,
    slices::{self, DesiredPool, GpuView, publish},
    state::NodeGpus,
    status::{self, StatusInput},
};

impl NodeLoop {
    /// One pass: observe → plan → apply → report. Each pass rebuilds what it publishes
    /// from scratch. Returns the pool it published.
    pub async fn sync_once(&mut self) -> Result<DesiredPool, Error> {
        let seen = self.observe().await?;
        let plan = self.plan(&seen);
        // Apply: what the GPUs hold ahead of claims comes first, and the devices published
        // are the instances this leaves, so the hardware is read again after it.
        let holding = self.hold(&seen, &plan).await;
        let gpus = self.observe_gpus(plan.offers.clone()).await?;
        let (pool, published) = self.publish(&gpus, &plan).await?;
        self.report(&seen, plan, &gpus, holding, &pool, &published)
            .await?;
        Ok(pool)
    }

    /// Reads what the pass decides from: the GpuNode (created when missing), the hardware,
    /// and who holds each GPU.
    async fn observe(&mut self) -> Result<Observed, Error> {
        let gpunode = match self.gpunode.clone() {
            Some(g) => g,
            None => {
                // A fresh object (first pass, or someone deleted it) has none of our status.
                self.status.forget();
                let g = self.status.get_or_create().await.map_err(Error::GpuNode)?;
                self.gpunode = Some(g.clone());
                g
            }
        };
        // Offers and status follow the hardware's MIG mode now, not the start-up snapshot.
        let hw = self.state.current().await;
        let users = self.users().await;
        Ok(Observed { gpunode, hw, users })
    }

    /// Decides each GPU's offer: what the spec asks of the hardware, the latent switches
    /// the scheduler's allocations call for, and each GPU's step in the hand-over.
    fn plan(&mut self, seen: &Observed) -> Plan {
        let (hw, spec) = (&seen.hw, &seen.gpunode.spec);
        let (mut offers, warnings) = slices::resolve_offers(
            &hw.gpus,
            |g| hw.layouts.get(&g.index),
            Some(spec),
            self.default_strategy,
        );
        let verdicts =
            self.switch_for_latent(&hw.gpus, &hw.layouts, spec, &mut offers, &seen.users);
        let (offers, notes) = self.hand_over(&hw.gpus, offers, &seen.users);
        // After the hand-over: a GPU it switched offers other latent shapes than before.
        let latent = slices::latent_offers(
            &hw.gpus,
            |g| hw.layouts.get(&g.index),
            Some(spec),
            |i| self.handover.applied(i).cloned(),
        );
        self.latent_published = latent.iter().any(|l| !l.is_empty());
        let wants = driver::wants(hw, &offers, Some(spec), &seen.users.allocated);
        Plan {
            offers,
            warnings,
            verdicts,
            notes,
            latent,
            wants,
        }
    }

    /// Records the offers applied and has the keeper make what the GPUs hold ahead of
    /// claims (static layouts, MIG modes).
    async fn hold(&mut self, seen: &Observed, plan: &Plan) -> HoldReport {
        self.save_offers(&seen.hw.gpus);
        let mut holding = self.keeper.hold(&plan.wants).await;
        for (gpu, note) in &plan.notes {
            holding
                .incomplete
                .entry(*gpu)
                .or_insert_with(|| note.clone());
        }
        holding
    }

    /// Reads the hardware as the keeper left it, and what of it the checkpoint knows.
    async fn observe_gpus(&mut self, offers: Vec<slices::GpuOffer>) -> Result<Gpus, Error> {
        let hw = self.state.current().await;
        // The checkpoint before the hardware: a prepare records its claim before it makes
        // the instance, so every instance read afterwards that no record owns is foreign.
        let checkpoint = self.state.claims().snapshot().await;
        let live = self.state.live_instances().await?;
        let offers = held_offers(&hw.gpus, offers, &checkpoint);
        self.note_unreadable(&live.unreadable);
        let (occupancy, rejected) = self.state.occupancy(&live.by_gpu);
        let foreign = foreign_instances(&live.by_gpu, &checkpoint);
        let (mut blocked, _) = self.state.occupancy(&foreign);
        for gpu in rejected.keys() {
            if let Some(full) = occupancy.get(gpu) {
                blocked.insert(*gpu, full.clone());
            }
        }
        let mps_running = self.mps_running(&offers).await;
        Ok(Gpus {
            hw,
            checkpoint,
            live: live.by_gpu,
            offers,
            occupancy,
            blocked,
            rejected,
            unavailable: foreign_notes(&foreign),
            mps_running,
        })
    }

    /// Builds the pool from the GPUs as they are, taints it, tells the kubelet each
    /// device's health and publishes the slices.
    async fn publish(
        &mut self,
        gpus: &Gpus,
        plan: &Plan,
    ) -> Result<(DesiredPool, publish::Outcome), Error> {
        let empty = tessera_gpu::Occupancy::default();
        let views: Vec<GpuView<'_>> = gpus
            .hw
            .gpus
            .iter()
            .zip(&gpus.offers)
            .zip(&plan.latent)
            .map(|((info, offer), latent)| GpuView {
                info,
                layout: gpus.hw.layouts.get(&info.index),
                offer,
                occupancy: gpus.occupancy.get(&info.index).unwrap_or(&empty),
                blocked: gpus.blocked.get(&info.index).unwrap_or(&empty),
                latent,
            })
            .collect();
        let mut pool = slices::build_pool(&views, None);
        self.apply_taints(&mut pool);
        // Health first: the kubelet's stream must not tell a GPU is healthy after its
        // slices already carry the taint (and it needs no API write).
        self.publish_health(&pool);
        self.metrics.unhealthy_gpus.set(
            i64::try_from(self.health.values().filter(|h| !h.healthy).count()).unwrap_or(i64::MAX),
        );
        let outcome = self.publisher.publish(&pool).await;
        self.metrics.observe_publish(outcome.is_ok());
        let outcome = outcome?;
        self.last_generation = outcome.generation;
        self.slice_count = pool.slice_count();
        Ok((pool, outcome))
    }

    /// Writes the latent verdicts, the device gauges and the GpuNode's status.
    async fn report(
        &mut self,
        seen: &Observed,
        plan: Plan,
        gpus: &Gpus,
        holding: HoldReport,
        pool: &DesiredPool,
        published: &publish::Outcome,
    ) -> Result<(), Error> {
        // Only once the switched GPU's devices are published: the pod the scheduler then
        // binds finds them at prepare.
        self.report_latent(plan.verdicts).await;
        self.count_devices(pool, &gpus.checkpoint);
        if plan.warnings != self.last_warnings {
            for w in &plan.warnings {
                warn!(node = %self.state.node(), "{w}");
            }
            self.last_warnings.clone_from(&plan.warnings);
        }
        let geometry: Vec<String> = gpus.rejected.values().cloned().collect();
        for g in &geometry {
            warn!(node = %self.state.node(), "{g}");
        }
        let mut problems = Vec::new();
        if !published.dropped_fields.is_empty() {
            problems.push(format!(
                "the API server dropped {} from the ResourceSlices: enable the DRA feature gates (DRAPartitionableDevices, DRAConsumableCapacity, DRADeviceTaints) on kube-apiserver and kube-scheduler",
                published.dropped_fields.join(", ")
            ));
        }
        // Our own last write is newer than the watched object until the watch catches up.
        let previous = self
            .status
            .last_conditions()
            .or_else(|| seen.gpunode.status.as_ref().map(|s| s.conditions.clone()))
            .unwrap_or_default();
        let st = status::compute(
            &StatusInput {
                hw: &gpus.hw,
                live: &gpus.live,
                checkpoint: &gpus.checkpoint,
                offers: &gpus.offers,
                health: &self.health,
                mps_running: &gpus.mps_running,
                observed_generation: seen.gpunode.metadata.generation,
                problems: &problems,
                config_warnings: &plan.warnings,
                unavailable: &gpus.unavailable,
                geometry: &geometry,
                holding: &holding,
            },
            &previous,
        );
        self.status.write(st).await.map_err(Error::GpuNode)?;
        Ok(())
    }

    /// Whether all the MPS daemons of each MPS GPU's claims run, once the driver has
    /// checked them (adopting or restarting any that stopped: [`crate::driver::Keeper::supervise_mps`]).
    /// An MPS GPU without claims has none to run.
    pub(super) async fn mps_running(&self, offers: &[slices::GpuOffer]) -> BTreeMap<u32, bool> {
        let supervised = self.keeper.supervise_mps().await;
        self.state
            .gpus()
            .gpus
            .iter()
            .zip(offers)
            .filter(|(_, o)| matches!(o, slices::GpuOffer::Mps { .. }))
            .map(|(g, _)| (g.index, supervised.get(&g.index).copied().unwrap_or(true)))
            .collect()
    }

    /// The claims allocated on (from the watch cache) and prepared for (the checkpoint)
    /// each GPU of this node. Unknown until the claim and pod caches have finished their
    /// first list: after a restart they start empty, and an empty cache would read as a
    /// GPU nobody holds.
    pub(super) async fn users(&self) -> GpuUsers {
        use futures::FutureExt;
        let loaded = self
            .claims
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
            && self
                .nominated
                .wait_until_ready()
                .now_or_never()
                .is_some_and(|r| r.is_ok());
        let mut allocated: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for c in self.claims.state() {
            for r in tessera_api::claims::allocated_devices(&c) {
                if r.driver != self.state.driver_name() || r.pool != self.state.node() {
                    continue;
                }
                if let Ok(name) = tessera_gpu::naming::parse_device_name(&r.device) {
                    allocated.entry(name.gpu()).or_default().insert(format!(
                        "{}/{}",
                        c.metadata.namespace.as_deref().unwrap_or_default(),
                        c.metadata.name.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
        let mut prepared: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for r in self.state.claims().snapshot().await.claims.values() {
            for d in &r.devices {
                prepared
                    .entry(d.gpu)
                    .or_default()
                    .insert(format!("{}/{}", r.namespace, r.name));
            }
        }
        let list = |m: BTreeMap<u32, BTreeSet<String>>| {
            m.into_iter()
                .map(|(g, s)| (g, s.into_iter().collect()))
                .collect()
        };
        GpuUsers {
            loaded,
            allocated: list(allocated),
            prepared: list(prepared),
        }
    }

    pub(super) fn count_devices(&self, pool: &DesiredPool, checkpoint: &Checkpoint) {
        let mut published: BTreeMap<String, i64> = BTreeMap::new();
        for (_, devices) in &pool.device_slices {
            for d in devices.iter().filter(|d| d.binding_conditions.is_none()) {
                let t = d
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get("type"))
                    .and_then(|a| a.string.clone())
                    .unwrap_or_default();
                *published.entry(t).or_default() += 1;
            }
        }
        self.metrics.set_published(&published);
        let mut prepared: BTreeMap<String, i64> = BTreeMap::new();
        for r in checkpoint.claims.values() {
            for d in &r.devices {
                let t = match d.kind {
                    crate::checkpoint::DeviceKind::Gpu { .. } => "gpu",
                    crate::checkpoint::DeviceKind::Mig { .. } => "mig",
                    crate::checkpoint::DeviceKind::Mps { .. } => "mps",
                    crate::checkpoint::DeviceKind::TimeSlice { .. } => "timeslice",
                };
                *prepared.entry(t.to_string()).or_default() += 1;
            }
        }
        self.metrics.set_prepared(&prepared);
    }
}

/// What a pass reads before it decides.
struct Observed {
    /// The node's GpuNode: the spec to follow, the status last written.
    gpunode: GpuNode,
    /// The GPUs as the pass starts.
    hw: NodeGpus,
    /// Who holds each GPU.
    users: GpuUsers,
}

/// What a pass decided.
struct Plan {
    /// Each GPU's offer, in the order of the GPUs.
    offers: Vec<slices::GpuOffer>,
    /// What of the spec cannot be followed.
    warnings: Vec<String>,
    /// The latent claims' verdicts, written once the pass has published.
    verdicts: Vec<(LatentClaim, Verdict)>,
    /// Per GPU, what holds its change back in the hand-over.
    notes: BTreeMap<u32, String>,
    /// Each GPU's latent offers, in the order of the GPUs.
    latent: Vec<Vec<slices::GpuOffer>>,
    /// What each GPU should hold ahead of claims.
    wants: BTreeMap<u32, GpuWant>,
}

/// The GPUs as the keeper left them.
struct Gpus {
    hw: NodeGpus,
    checkpoint: Checkpoint,
    /// The MIG instances each GPU holds.
    live: BTreeMap<u32, Vec<MigInstance>>,
    /// Each GPU's offer, less the placements of a static layout not made yet.
    offers: Vec<slices::GpuOffer>,
    occupancy: BTreeMap<u32, Occupancy>,
    /// What instances Tessera did not make (or a geometry it refused) take away.
    blocked: BTreeMap<u32, Occupancy>,
    /// GPUs whose instances do not fit their geometry, with why.
    rejected: BTreeMap<u32, String>,
    /// What foreign instances cut down, for the status.
    unavailable: Vec<String>,
    /// Whether each MPS GPU's control daemon runs.
    mps_running: BTreeMap<u32, bool>,
}

/// Who holds each GPU of the node, as one pass reads it.
#[derive(Clone, Debug, Default)]
pub(super) struct GpuUsers {
    /// Whether the claim and pod caches have finished their first list.
    pub(super) loaded: bool,
    /// The claims allocated on each GPU (the claim cache), `namespace/name`.
    pub(super) allocated: BTreeMap<u32, Vec<String>>,
    /// The claims prepared for each GPU (the checkpoint), `namespace/name`.
    pub(super) prepared: BTreeMap<u32, Vec<String>>,
}

impl GpuUsers {
    /// The claims allocated on or prepared for `gpu`, for the hand-over.
    pub(super) fn of(&self, gpu: u32) -> crate::fence::Users {
        if !self.loaded {
            return crate::fence::Users::Unknown;
        }
        let mut users: Vec<String> = self
            .allocated
            .get(&gpu)
            .into_iter()
            .chain(self.prepared.get(&gpu))
            .flatten()
            .cloned()
            .collect();
        users.sort();
        users.dedup();
        crate::fence::Users::Known(users)
    }
}

/// A static layout offers the instances its GPU holds, no placement it has yet to make.
/// `offers` are those of `gpus`, in order.
pub(super) fn held_offers(
    gpus: &[tessera_gpu::backend::GpuInfo],
    offers: Vec<slices::GpuOffer>,
    checkpoint: &Checkpoint,
) -> Vec<slices::GpuOffer> {
    gpus.iter()
        .zip(offers)
        .map(|(gpu, offer)| match offer {
            slices::GpuOffer::StaticMig { placements } => slices::GpuOffer::StaticMig {
                placements: placements
                    .into_iter()
                    .filter(|(id, start)| {
                        checkpoint
                            .held(gpu.index, *start, *id)
                            .is_some_and(|h| h.created.is_some())
                    })
                    .collect(),
            },
            other => other,
        })
        .collect()
}

/// The MIG instances Tessera does not know (no claim's, not a static layout's): made by
/// someone else (or left by a record lost in a crash). What they overlap is not offered,
/// and they are never destroyed.
pub(super) fn foreign_instances(
    live: &BTreeMap<u32, Vec<MigInstance>>,
    checkpoint: &Checkpoint,
) -> BTreeMap<u32, Vec<MigInstance>> {
    live.iter()
        .map(|(gpu, instances)| {
            let foreign: Vec<MigInstance> = instances
                .iter()
                .filter(|i| !checkpoint.knows(*gpu, i.start, i.profile_id))
                .cloned()
                .collect();
            (*gpu, foreign)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// What the status says about GPUs whose offer foreign instances cut down.
pub(super) fn foreign_notes(foreign: &BTreeMap<u32, Vec<MigInstance>>) -> Vec<String> {
    foreign
        .iter()
        .map(|(gpu, instances)| {
            let list: Vec<String> = instances
                .iter()
                .map(|i| format!("{} at memory slice {}", i.profile_name, i.start))
                .collect();
            format!(
                "GPU {gpu}: MIG instances Tessera did not create ({}) are kept; the placements they overlap and the whole GPU are not offered",
                list.join(", ")
            )
        })
        .collect()
}
