//! What each GPU offers: the operator's `GpuNode.spec` when it has one for the GPU, else the
//! plugin's documented default (`--default-strategy`).

use tessera_api::{
    gpunode::{GpuConfig, GpuNodeSpec},
    policy::{MigMode, SharingStrategy},
};
use tessera_gpu::{backend::GpuInfo, catalog::MigLayout};

use crate::config::DefaultStrategy;

/// How one GPU is offered in the ResourceSlices.
#[derive(Clone, Debug, PartialEq)]
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
    let offers = gpus
        .iter()
        .map(|gpu| {
            let l = layout(gpu);
            let cfg = spec.and_then(|s| {
                s.gpus.iter().find(|c| {
                    c.index == gpu.index && c.uuid.as_ref().is_none_or(|u| *u == gpu.uuid)
                })
            });
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
                let placements = mig
                    .instances
                    .iter()
                    .filter_map(|i| {
                        let p = layout.profile_by_name(i.profile.as_str())?;
                        let start = u8::try_from(i.start).ok()?;
                        p.starts.contains(start).then_some((p.profile_id, start))
                    })
                    .collect();
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
            let max_clients = mps
                .max_clients
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(8)
                .max(1);
            let default_thread_percentage = mps
                .default_active_thread_percentage
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(100 / max_clients)
                .clamp(1, 100);
            let default_memory_mib = mps
                .default_pinned_memory_limit
                .as_deref()
                .and_then(crate::quantity::parse_mib)
                .unwrap_or(gpu.memory_mib / u64::from(max_clients));
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
                .and_then(|t| t.max_clients)
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(4)
                .max(1),
        },
        SharingStrategy::Exclusive | SharingStrategy::Adaptive => GpuOffer::Exclusive,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tessera_gpu::{backend::ComputeMode, find_model};

    use super::*;

    const H100_UUID: &str = "GPU-00000000-1b2c-3d4e-5f60-718293a4b5c6";

    fn h100() -> &'static MigLayout {
        find_model("h100-80gb").unwrap().mig.as_ref().unwrap()
    }

    fn gpu(model: &str, index: u32, uuid: &str) -> GpuInfo {
        let m = find_model(model).unwrap();
        GpuInfo {
            index,
            uuid: uuid.into(),
            product_name: m.product_names[0].clone(),
            model: Some(m.id.clone()),
            memory_mib: m.memory_mib,
            architecture: m.architecture,
            compute_capability: format!("{}.{}", m.compute_capability.0, m.compute_capability.1),
            pci_bus_id: String::new(),
            minor_number: None,
            mig_capable: m.mig.is_some(),
            mig_enabled: false,
            mig_pending: false,
            compute_mode: ComputeMode::Default,
            driver_version: None,
        }
    }

    /// GPU 0: an H100; GPU 1: an L4.
    fn node() -> Vec<GpuInfo> {
        vec![
            gpu("h100-80gb", 0, H100_UUID),
            gpu("l4", 1, "GPU-11111111-1b2c-3d4e-5f60-718293a4b5c6"),
        ]
    }

    /// The layout lookup the node loop uses: by model, None without MIG.
    fn layout<'a>(g: &GpuInfo) -> Option<&'a MigLayout> {
        g.mig_capable.then(h100)
    }

    /// A `GpuNodeSpec` written as the operator's YAML would be.
    fn spec(gpus: serde_json::Value) -> GpuNodeSpec {
        serde_json::from_value(json!({ "gpus": gpus })).expect("a valid GpuNodeSpec")
    }

    fn resolve(spec: Option<&GpuNodeSpec>) -> (Vec<GpuOffer>, Vec<String>) {
        resolve_with(spec, DefaultStrategy::DynamicMig)
    }

    fn resolve_with(
        spec: Option<&GpuNodeSpec>,
        default: DefaultStrategy,
    ) -> (Vec<GpuOffer>, Vec<String>) {
        let gpus = node();
        resolve_offers(&gpus, layout, spec, default)
    }

    fn dynamic(ids: &[u32]) -> GpuOffer {
        GpuOffer::DynamicMig {
            allowed_profile_ids: ids.to_vec(),
        }
    }

    #[test]
    fn without_a_spec_mig_gpus_default_to_dynamic_mig_and_others_to_exclusive() {
        let (offers, warnings) = resolve(None);
        assert_eq!(offers, [dynamic(&[]), GpuOffer::Exclusive]);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn an_empty_spec_keeps_the_default() {
        let (offers, warnings) = resolve(Some(&GpuNodeSpec::default()));
        assert_eq!(offers, [dynamic(&[]), GpuOffer::Exclusive]);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn the_exclusive_default_offers_every_gpu_whole() {
        let (offers, warnings) = resolve_with(None, DefaultStrategy::Exclusive);
        assert_eq!(offers, [GpuOffer::Exclusive, GpuOffer::Exclusive]);
        assert!(warnings.is_empty());
    }

    #[test]
    fn allowed_profile_names_map_to_profile_ids() {
        let s = spec(json!([{
            "index": 0,
            "strategy": "MIG",
            "mig": { "allowedProfiles": ["3g.40gb", "1g.10gb+me", "1g.10gb"] }
        }]));
        let (offers, warnings) = resolve(Some(&s));
        // 3g.40gb = 9, 1g.10gb+me = 20 (not its plain sibling's 19), 1g.10gb = 19.
        assert_eq!(offers[0], dynamic(&[9, 20, 19]));
        assert_eq!(offers[1], GpuOffer::Exclusive, "GPU 1 is not in the spec");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn a_mig_entry_without_settings_offers_every_profile() {
        let s = spec(json!([{ "index": 0, "strategy": "MIG" }]));
        let (offers, warnings) = resolve(Some(&s));
        assert_eq!(offers[0], dynamic(&[]));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn unknown_profile_names_are_skipped_with_a_warning() {
        let s = spec(json!([{
            "index": 0,
            "strategy": "MIG",
            "mig": { "allowedProfiles": ["3g.40gb", "1g.18gb"] }
        }]));
        let (offers, warnings) = resolve(Some(&s));
        assert_eq!(offers[0], dynamic(&[9]));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("GPU 0"), "{}", warnings[0]);
        assert!(warnings[0].contains("1g.18gb"), "{}", warnings[0]);
        assert!(
            warnings[0].contains("3g.40gb"),
            "the warning lists the known profiles: {}",
            warnings[0]
        );
    }

    #[test]
    fn only_unknown_profile_names_fall_back_to_exclusive() {
        let s = spec(json!([{
            "index": 0,
            "strategy": "MIG",
            "mig": { "allowedProfiles": ["1g.18gb", "7g.141gb"] }
        }]));
        let (offers, warnings) = resolve(Some(&s));
        assert_eq!(
            offers[0],
            GpuOffer::Exclusive,
            "never every profile, never none"
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
    }

    #[test]
    fn mig_on_a_gpu_without_mig_falls_back_to_exclusive_with_a_warning() {
        let s = spec(json!([{ "index": 1, "strategy": "MIG" }]));
        let (offers, warnings) = resolve(Some(&s));
        assert_eq!(offers[1], GpuOffer::Exclusive);
        assert_eq!(offers[0], dynamic(&[]), "GPU 0 keeps the default");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("GPU 1"), "{}", warnings[0]);
        assert!(warnings[0].contains("NVIDIA L4"), "{}", warnings[0]);
        assert!(warnings[0].contains("MIG"), "{}", warnings[0]);
    }

    #[test]
    fn a_spec_entry_for_another_gpus_uuid_is_ignored() {
        let other = spec(json!([{
            "index": 0,
            "uuid": "GPU-ffffffff-0000-0000-0000-000000000000",
            "strategy": "Exclusive"
        }]));
        let (offers, _) = resolve(Some(&other));
        assert_eq!(offers[0], dynamic(&[]), "the entry names another GPU");

        let same = spec(json!([{ "index": 0, "uuid": H100_UUID, "strategy": "Exclusive" }]));
        let (offers, _) = resolve(Some(&same));
        assert_eq!(offers[0], GpuOffer::Exclusive, "the entry names this GPU");
    }

    #[test]
    fn a_spec_entry_applies_only_to_its_index() {
        let s = spec(json!([{ "index": 7, "strategy": "Exclusive" }]));
        let (offers, _) = resolve(Some(&s));
        assert_eq!(offers, [dynamic(&[]), GpuOffer::Exclusive]);
    }

    #[test]
    fn mps_defaults_split_the_gpu_eight_ways() {
        let s = spec(json!([{ "index": 0, "strategy": "MPS" }]));
        let (offers, warnings) = resolve(Some(&s));
        assert_eq!(
            offers[0],
            GpuOffer::Mps {
                max_clients: 8,
                default_thread_percentage: 12,
                default_memory_mib: 81559 / 8,
            }
        );
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn mps_defaults_follow_max_clients() {
        let s = spec(json!([{ "index": 1, "strategy": "MPS", "mps": { "maxClients": 4 } }]));
        let (offers, _) = resolve(Some(&s));
        assert_eq!(
            offers[1],
            GpuOffer::Mps {
                max_clients: 4,
                default_thread_percentage: 25,
                default_memory_mib: 23034 / 4,
            },
            "MPS works on a GPU without MIG"
        );
    }

    #[test]
    fn explicit_mps_settings_are_used() {
        let s = spec(json!([{
            "index": 0,
            "strategy": "MPS",
            "mps": {
                "maxClients": 4,
                "defaultActiveThreadPercentage": 30,
                "defaultPinnedMemoryLimit": "2Gi"
            }
        }]));
        let (offers, _) = resolve(Some(&s));
        assert_eq!(
            offers[0],
            GpuOffer::Mps {
                max_clients: 4,
                default_thread_percentage: 30,
                default_memory_mib: 2048,
            }
        );
    }

    #[test]
    fn out_of_range_mps_settings_are_made_safe() {
        // The CRD rejects these; the plugin must still not divide by zero or offer 0 %.
        let s = spec(json!([{
            "index": 0,
            "strategy": "MPS",
            "mps": { "maxClients": 0, "defaultActiveThreadPercentage": 500 }
        }]));
        let (offers, _) = resolve(Some(&s));
        assert_eq!(
            offers[0],
            GpuOffer::Mps {
                max_clients: 1,
                default_thread_percentage: 100,
                default_memory_mib: 81559,
            }
        );
    }

    #[test]
    fn an_unreadable_pinned_memory_limit_falls_back_to_the_default_share() {
        let s = spec(json!([{
            "index": 0,
            "strategy": "MPS",
            "mps": { "defaultPinnedMemoryLimit": "lots" }
        }]));
        let (offers, _) = resolve(Some(&s));
        assert!(
            matches!(offers[0], GpuOffer::Mps { default_memory_mib, .. } if default_memory_mib == 81559 / 8),
            "{:?}",
            offers[0]
        );
    }

    #[test]
    fn time_slicing_defaults_to_four_clients_and_honours_max_clients() {
        let s = spec(json!([
            { "index": 0, "strategy": "TimeSlicing" },
            { "index": 1, "strategy": "TimeSlicing", "timeSlicing": { "maxClients": 10 } }
        ]));
        let (offers, _) = resolve(Some(&s));
        assert_eq!(
            offers,
            [
                GpuOffer::TimeSlicing { max_clients: 4 },
                GpuOffer::TimeSlicing { max_clients: 10 }
            ]
        );
    }

    #[test]
    fn exclusive_and_adaptive_entries_offer_the_whole_gpu() {
        for strategy in ["Exclusive", "Adaptive"] {
            let s = spec(json!([{ "index": 0, "strategy": strategy }]));
            let (offers, _) = resolve(Some(&s));
            assert_eq!(offers[0], GpuOffer::Exclusive, "{strategy}");
        }
    }

    #[test]
    fn static_mode_instances_become_placements_and_invalid_ones_are_dropped() {
        let s = spec(json!([{
            "index": 0,
            "strategy": "MIG",
            "mig": {
                "mode": "Static",
                "instances": [
                    { "profile": "3g.40gb", "start": 4 },
                    { "profile": "2g.20gb", "start": 2 },
                    { "profile": "1g.10gb", "start": 1 },
                    // 3g.40gb starts only at 0 or 4.
                    { "profile": "3g.40gb", "start": 2 },
                    // No such profile on an H100.
                    { "profile": "1g.18gb", "start": 0 },
                    // Beyond any memory slice (and beyond u8).
                    { "profile": "1g.10gb", "start": 300 }
                ]
            }
        }]));
        let (offers, _) = resolve(Some(&s));
        assert_eq!(
            offers[0],
            GpuOffer::StaticMig {
                placements: vec![(9, 4), (14, 2), (19, 1)]
            }
        );
    }
}
