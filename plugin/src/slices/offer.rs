//! What each GPU offers: the operator's `GpuNode.spec` when it has one for the GPU, else the
//! plugin's documented default (`--default-strategy`).

use tessera_api::{
    defaults,
    gpunode::{GpuConfig, GpuNodeSpec},
    policy::{MigMode, SharingStrategy, TimeSliceInterval},
};
use tessera_gpu::{
    backend::{GpuInfo, TimeSlice},
    catalog::MigLayout,
    geometry::{Occupancy, Placement},
};

use crate::config::DefaultStrategy;

/// How one GPU is offered in the ResourceSlices.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum GpuOffer {
    /// Every allowed MIG placement (empty list: every profile), plus the whole GPU, all
    /// consuming the GPU's counters so the scheduler never allocates overlapping ones.
    DynamicMig {
        /// Allowed NVML profile ids; empty means all.
        allowed_profile_ids: Vec<u32>,
    },
    /// Only the listed placements (a static layout), plus nothing else.
    StaticMig {
        /// (profile id, start) pairs.
        placements: Vec<(u32, u8)>,
    },
    /// One MPS device shared by up to `max_clients` claims with compute and memory capacity.
    Mps {
        /// Most clients.
        max_clients: u32,
        /// Thread percentage for a claim that requests none.
        default_thread_percentage: u32,
        /// Pinned memory (MiB) for a claim that requests none.
        default_memory_mib: u64,
    },
    /// One time-sliced device shared by up to `max_clients` claims.
    TimeSlicing {
        /// Most clients.
        max_clients: u32,
        /// Each client's turn on the GPU.
        interval: TimeSlice,
    },
    /// The whole GPU to one claim.
    Exclusive,
}

/// Resolves the offer of every GPU. `layout` gives a GPU's MIG geometry (None: not MIG
/// capable). Configuration that cannot apply to a GPU (MIG on an L4) falls back to
/// `Exclusive` and is reported in the returned warnings.
pub fn resolve_offers<'a>(
    gpus: &'a [GpuInfo],
    layout: impl Fn(&GpuInfo) -> Option<&'a MigLayout>,
    spec: Option<&GpuNodeSpec>,
    default: DefaultStrategy,
) -> (Vec<GpuOffer>, Vec<String>) {
    let mut warnings = Vec::new();
    if let Some(spec) = spec {
        warnings.extend(unmatched_entries(spec, gpus));
    }
    let offers = gpus
        .iter()
        .map(|gpu| {
            let l = layout(gpu);
            let cfg = spec.and_then(|s| config_for(s, gpu));
            match cfg {
                Some(cfg) => from_config(gpu, l, cfg, &mut warnings),
                None => match (default, l) {
                    (DefaultStrategy::DynamicMig, Some(_)) => GpuOffer::DynamicMig {
                        allowed_profile_ids: vec![],
                    },
                    _ => GpuOffer::Exclusive,
                },
            }
        })
        .collect();
    (offers, warnings)
}

/// The shapes each GPU may be switched to by the scheduler (see
/// [`super::GpuView::latent`]): for a GPU whose spec entry lists `alternatives`, the
/// entry's own shape and its alternatives, less `applied` (what the GPU publishes now),
/// in the entry's order. A shape that does not apply to the GPU as asked is left out.
pub fn latent_offers<'a>(
    gpus: &'a [GpuInfo],
    layout: impl Fn(&GpuInfo) -> Option<&'a MigLayout>,
    spec: Option<&GpuNodeSpec>,
    applied: impl Fn(u32) -> Option<GpuOffer>,
) -> Vec<Vec<GpuOffer>> {
    gpus.iter()
        .map(|gpu| {
            let Some(cfg) = spec
                .and_then(|s| config_for(s, gpu))
                .filter(|c| !c.alternatives.is_empty())
            else {
                return Vec::new();
            };
            let l = layout(gpu);
            let applied = applied(gpu.index);
            let mut out: Vec<GpuOffer> = Vec::new();
            let shapes = std::iter::once(cfg.clone())
                .chain(cfg.alternatives.iter().map(|a| cfg.switched_to(a)));
            for shape in shapes {
                let mut warnings = Vec::new();
                let offer = from_config(gpu, l, &shape, &mut warnings);
                if warnings.is_empty() && Some(&offer) != applied.as_ref() && !out.contains(&offer)
                {
                    out.push(offer);
                }
            }
            out
        })
        .collect()
}

/// What is wrong with spec entries that configure no GPU: an index the node does not
/// have, or the UUID of another GPU than the one at that index (a board swapped since
/// the spec was written). Such entries are ignored; the GPU at the index offers the
/// default.
fn unmatched_entries(spec: &GpuNodeSpec, gpus: &[GpuInfo]) -> Vec<String> {
    let indices = || {
        gpus.iter()
            .map(|g| g.index.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    spec.gpus
        .iter()
        .filter_map(|c| match gpus.iter().find(|g| g.index == c.index) {
            None => Some(format!(
                "spec.gpus names GPU {}, which this node does not have (its GPUs: {}); the entry is ignored",
                c.index,
                indices()
            )),
            Some(g) => match &c.uuid {
                // An unreadable GPU has no UUID to compare; its fault is reported apart.
                Some(u) if *u != g.uuid && !g.is_unreadable() => Some(format!(
                    "spec.gpus entry for GPU {} names {u}, but GPU {} is {}; the entry is ignored and the GPU offers the default",
                    c.index, g.index, g.uuid
                )),
                _ => None,
            },
        })
        .collect()
}

/// The spec's entry for `gpu`: the one at its index, unless it names another GPU's UUID
/// (a board swapped since the operator resolved it).
pub fn config_for<'s>(spec: &'s GpuNodeSpec, gpu: &GpuInfo) -> Option<&'s GpuConfig> {
    spec.gpus
        .iter()
        .find(|c| c.index == gpu.index && c.uuid.as_ref().is_none_or(|u| *u == gpu.uuid))
}

fn from_config(
    gpu: &GpuInfo,
    layout: Option<&MigLayout>,
    cfg: &GpuConfig,
    warnings: &mut Vec<String>,
) -> GpuOffer {
    match cfg.strategy {
        SharingStrategy::Mig => {
            let Some(layout) = layout else {
                warnings.push(format!(
                    "GPU {} ({}) does not support MIG; offering it whole",
                    gpu.index, gpu.product_name
                ));
                return GpuOffer::Exclusive;
            };
            let mig = cfg.mig.clone().unwrap_or_default();
            let mut ids = Vec::new();
            for name in &mig.allowed_profiles {
                match layout.profile_by_name(name.as_str()) {
                    Some(p) => ids.push(p.profile_id),
                    None => warnings.push(format!(
                        "GPU {} ({}) has no MIG profile {name}; known: {}",
                        gpu.index,
                        gpu.product_name,
                        layout
                            .profiles
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                }
            }
            if mig.mode == MigMode::Static {
                let mut placements = Vec::new();
                // A hand-written layout may overlap itself; the instances that fit, in
                // the order listed, are held, so no hardware call is made that must fail.
                let mut occupancy = Occupancy::new();
                for i in &mig.instances {
                    let Some(p) = layout.profile_by_name(i.profile.as_str()) else {
                        warnings.push(format!(
                            "GPU {} ({}): the static layout's {} at {} is left out: the GPU has no such MIG profile",
                            gpu.index, gpu.product_name, i.profile, i.start
                        ));
                        continue;
                    };
                    match u8::try_from(i.start).ok().filter(|s| p.starts.contains(*s)) {
                        Some(start) => {
                            let placement = Placement {
                                profile_id: p.profile_id,
                                start,
                            };
                            let tag = u32::try_from(placements.len()).unwrap_or(u32::MAX);
                            match occupancy.place(layout, placement, tag) {
                                Ok(_) => placements.push((p.profile_id, start)),
                                Err(e) => warnings.push(format!(
                                    "GPU {} ({}): the static layout's {} at {} is left out: it does not fit next to the instances listed before it ({e})",
                                    gpu.index, gpu.product_name, i.profile, i.start
                                )),
                            }
                        }
                        None => warnings.push(format!(
                            "GPU {} ({}): the static layout's {} at {} is left out: {} starts only at {}",
                            gpu.index,
                            gpu.product_name,
                            i.profile,
                            i.start,
                            i.profile,
                            p.starts
                                .iter()
                                .map(|s| s.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )),
                    }
                }
                return GpuOffer::StaticMig { placements };
            }
            if !mig.allowed_profiles.is_empty() && ids.is_empty() {
                // Every listed profile was unknown: offering all would ignore the admin's
                // restriction, offering none would strand the GPU. Offer it whole.
                return GpuOffer::Exclusive;
            }
            GpuOffer::DynamicMig {
                allowed_profile_ids: ids,
            }
        }
        SharingStrategy::Mps => {
            let mps = cfg.mps.clone().unwrap_or_default();
            // The CRD keeps maxClients in 1..=48; an entry written around it must still
            // not divide by zero.
            let max_clients = mps.max_clients.max(1);
            let default_thread_percentage = mps
                .default_active_thread_percentage
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(100 / max_clients)
                .clamp(1, 100);
            let share = gpu.memory_mib / u64::from(max_clients);
            let default_memory_mib = match mps.default_pinned_memory_limit.as_deref() {
                None => share,
                Some(q) => crate::quantity::parse_mib(q).unwrap_or_else(|| {
                    // The CRD lets only quantities through; an entry written around it
                    // is said, not silently replaced.
                    warnings.push(format!(
                        "GPU {}: mps.defaultPinnedMemoryLimit {q:?} is not a memory quantity; each client gets GPU memory / maxClients ({share} MiB)",
                        gpu.index
                    ));
                    share
                }),
            };
            GpuOffer::Mps {
                max_clients,
                default_thread_percentage,
                default_memory_mib,
            }
        }
        SharingStrategy::TimeSlicing => GpuOffer::TimeSlicing {
            max_clients: cfg
                .time_slicing
                .as_ref()
                .map_or(defaults::TIME_SLICING_MAX_CLIENTS, |t| t.max_clients)
                .max(1),
            interval: match cfg.time_slicing.as_ref().map(|t| t.interval) {
                None | Some(TimeSliceInterval::Default) => TimeSlice::Default,
                Some(TimeSliceInterval::Short) => TimeSlice::Short,
                Some(TimeSliceInterval::Medium) => TimeSlice::Medium,
                Some(TimeSliceInterval::Long) => TimeSlice::Long,
            },
        },
        SharingStrategy::Exclusive | SharingStrategy::Adaptive => GpuOffer::Exclusive,
    }
}

#[cfg(test)]
mod tests;
