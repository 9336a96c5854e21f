//! Unit tests of `slices::offer`: which offer each GPU gets from the operator's
//! `GpuNode.spec` or the plugin's default strategy.

use serde_json::json;
use tessera_gpu::find_model;

use super::*;

const H100_UUID: &str = "GPU-00000000-1b2c-3d4e-5f60-718293a4b5c6";

fn h100() -> &'static MigLayout {
    find_model("h100-80gb").unwrap().mig.as_ref().unwrap()
}

fn gpu(model: &str, index: u32, uuid: &str) -> GpuInfo {
    GpuInfo {
        uuid: uuid.into(),
        pci_bus_id: String::new(),
        minor_number: None,
        ..GpuInfo::from_model(find_model(model).unwrap(), index)
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
    let (offers, warnings) = resolve(Some(&other));
    assert_eq!(offers[0], dynamic(&[]), "the entry names another GPU");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("GPU-ffffffff-0000-0000-0000-000000000000")
            && warnings[0].contains(H100_UUID)
            && warnings[0].contains("ignored"),
        "{}",
        warnings[0]
    );

    let same = spec(json!([{ "index": 0, "uuid": H100_UUID, "strategy": "Exclusive" }]));
    let (offers, _) = resolve(Some(&same));
    assert_eq!(offers[0], GpuOffer::Exclusive, "the entry names this GPU");
}

#[test]
fn a_spec_entry_applies_only_to_its_index() {
    let s = spec(json!([{ "index": 7, "strategy": "Exclusive" }]));
    let (offers, warnings) = resolve(Some(&s));
    assert_eq!(offers, [dynamic(&[]), GpuOffer::Exclusive]);
    assert_eq!(
        warnings,
        [
            "spec.gpus names GPU 7, which this node does not have (its GPUs: 0, 1); the entry is ignored"
        ]
    );
}

#[test]
fn a_static_layout_that_overlaps_itself_keeps_the_instances_listed_first() {
    let s = spec(json!([{
        "index": 0,
        "strategy": "MIG",
        "mig": {
            "mode": "Static",
            "instances": [
                { "profile": "4g.40gb", "start": 0 },
                // Memory slices 0-3 belong to the 4g.40gb above.
                { "profile": "3g.40gb", "start": 0 },
                { "profile": "3g.40gb", "start": 4 },
                // Slices 4-7 are the 3g.40gb's now.
                { "profile": "1g.10gb", "start": 6 }
            ]
        }
    }]));
    let (offers, warnings) = resolve(Some(&s));
    assert_eq!(
        offers[0],
        GpuOffer::StaticMig {
            placements: vec![(5, 0), (9, 4)]
        }
    );
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("3g.40gb at 0") && warnings[0].contains("does not fit"),
        "{}",
        warnings[0]
    );
    assert!(warnings[1].contains("1g.10gb at 6"), "{}", warnings[1]);
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
    let (offers, warnings) = resolve(Some(&s));
    assert!(
        matches!(offers[0], GpuOffer::Mps { default_memory_mib, .. } if default_memory_mib == 81559 / 8),
        "{:?}",
        offers[0]
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"lots\" is not a memory quantity")),
        "{warnings:?}"
    );
}

#[test]
fn every_quantity_form_the_api_server_accepts_sets_the_pinned_memory_limit() {
    // Issue 37: `8e9` passed the CRD's isQuantity check and was then ignored.
    for (q, mib) in [
        ("8e9", 7630),
        ("8Gi", 8192),
        ("8G", 7630),
        ("+.5Ti", 524_288),
    ] {
        let s = spec(json!([{
            "index": 0,
            "strategy": "MPS",
            "mps": { "defaultPinnedMemoryLimit": q }
        }]));
        let (offers, warnings) = resolve(Some(&s));
        assert!(
            matches!(offers[0], GpuOffer::Mps { default_memory_mib, .. } if default_memory_mib == mib),
            "{q}: {:?}",
            offers[0]
        );
        assert!(warnings.is_empty(), "{q}: {warnings:?}");
    }
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
            GpuOffer::TimeSlicing {
                max_clients: 4,
                interval: tessera_gpu::backend::TimeSlice::Default
            },
            GpuOffer::TimeSlicing {
                max_clients: 10,
                interval: tessera_gpu::backend::TimeSlice::Default
            }
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
fn static_mode_instances_become_placements_and_invalid_ones_are_dropped_with_a_warning() {
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
    let (offers, warnings) = resolve(Some(&s));
    assert_eq!(
        offers[0],
        GpuOffer::StaticMig {
            placements: vec![(9, 4), (14, 2), (19, 1)]
        }
    );
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(warnings[0].contains("3g.40gb at 2") && warnings[0].contains("starts only at 0, 4"));
    assert!(warnings[1].contains("1g.18gb at 0") && warnings[1].contains("no such MIG profile"));
    assert!(warnings[2].contains("1g.10gb at 300"));
}

fn with_alternatives(strategy: SharingStrategy, alternatives: serde_json::Value) -> GpuNodeSpec {
    serde_json::from_value(json!({"gpus": [{
        "index": 0, "strategy": strategy, "policy": "p",
        "mig": {"mode": "Dynamic"},
        "alternatives": alternatives,
    }]}))
    .unwrap()
}

#[test]
fn latent_offers_are_the_entry_and_its_alternatives_less_what_the_gpu_publishes() {
    let gpus = node();
    let spec = with_alternatives(
        SharingStrategy::Mig,
        json!([{"strategy": "MPS", "mps": {"maxClients": 4}}]),
    );
    let layout = |g: &GpuInfo| (g.index == 0).then(h100);
    let (offers, _) = resolve_offers(&gpus, layout, Some(&spec), DefaultStrategy::Exclusive);
    let mps = match latent_offers(&gpus, layout, Some(&spec), |_| Some(offers[0].clone()))
        .remove(0)
        .as_slice()
    {
        [o @ GpuOffer::Mps { max_clients: 4, .. }] => o.clone(),
        other => panic!("{other:?}"),
    };
    // Switched to MPS (the spec not followed yet), the entry's own MIG is the latent one.
    let back = latent_offers(&gpus, layout, Some(&spec), |_| Some(mps.clone()));
    assert_eq!(back[0], [offers[0].clone()]);
    // A GPU without alternatives, or without an entry, has none.
    assert!(back[1].is_empty());
    let plain = with_alternatives(SharingStrategy::Mig, json!([]));
    assert!(latent_offers(&gpus, layout, Some(&plain), |_| None)[0].is_empty());
}

#[test]
fn a_latent_shape_the_gpu_cannot_take_is_left_out() {
    // MIG on an L4 would fall back to the whole GPU, which is no switch to MIG.
    let gpus = vec![gpu("l4", 0, "GPU-11111111-1b2c-3d4e-5f60-718293a4b5c6")];
    let spec = with_alternatives(
        SharingStrategy::Exclusive,
        json!([{"strategy": "MIG", "mig": {}}]),
    );
    assert!(
        latent_offers(&gpus, |_| None, Some(&spec), |_| Some(GpuOffer::Exclusive))[0].is_empty()
    );
}
