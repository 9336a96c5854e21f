//! The counter-equivalence proof and the rules that trip people up.

use proptest::prelude::*;

use super::*;
use crate::{
    catalog::{catalog, find_model},
    geometry::Occupancy,
};

fn layouts() -> Vec<(&'static str, &'static MigLayout)> {
    catalog()
        .iter()
        .filter_map(|m| m.mig.as_ref().map(|l| (m.id.as_str(), l)))
        .collect()
}

fn all_placements(layout: &MigLayout) -> Vec<Placement> {
    layout
        .all_placements()
        .map(|(p, start)| Placement {
            profile_id: p.profile_id,
            start,
        })
        .collect()
}

fn hardware_accepts(layout: &MigLayout, set: &[Placement]) -> bool {
    Occupancy::from_placements(layout, set).is_ok()
}

fn counters_accept_set(scheme: &CounterScheme, layout: &MigLayout, set: &[Placement]) -> bool {
    let cs = scheme.counter_set(0);
    let consumptions: Vec<_> = set
        .iter()
        .map(|p| scheme.placement_consumption(0, layout, *p).unwrap())
        .collect();
    counters_accept(&cs, &consumptions)
}

/// Walks every subset of `all` in index order. Both acceptance relations are monotone
/// (a subset of an accepted set is accepted: each is a conjunction of per-item, pairwise
/// and count ≤ limit conditions), so once both reject a set, every superset reached from it
/// is rejected by both and need not be visited. Every subset of the 2^25 is thus decided.
fn walk(
    layout: &MigLayout,
    scheme: &CounterScheme,
    all: &[Placement],
    current: &mut Vec<Placement>,
    next: usize,
    stats: &mut (u64, u64),
) {
    for j in next..all.len() {
        current.push(all[j]);
        let hw = hardware_accepts(layout, current);
        let ct = counters_accept_set(scheme, layout, current);
        assert_eq!(
            hw, ct,
            "hardware says {hw}, counters say {ct} for {current:?}"
        );
        stats.0 += 1;
        if hw {
            stats.1 += 1;
            walk(layout, scheme, all, current, j + 1, stats);
        }
        current.pop();
    }
}

#[test]
fn counter_arithmetic_accepts_exactly_the_placement_sets_the_geometry_accepts() {
    for (model, layout) in layouts() {
        let scheme = CounterScheme::new(layout);
        let all = all_placements(layout);
        assert_eq!(all.len(), 25, "{model}: 25 placements per 7-slice GPU");
        let mut stats = (0, 0);
        walk(layout, &scheme, &all, &mut Vec::new(), 0, &mut stats);
        // The four models share one geometry: the same sets are decided, and the same
        // non-empty placement sets are valid. A change here is a change of the geometry.
        assert_eq!(stats, (19_273, 2_318), "{model}: (sets decided, valid)");
    }
}

#[test]
fn no_catalogue_model_needs_limit_counters() {
    for (model, layout) in layouts() {
        let set = CounterScheme::new(layout).counter_set(3);
        assert_eq!(set.name, "gpu-3-counters");
        assert_eq!(set.counters.len(), 10, "{model}: {:?}", set.counters);
        assert_eq!(set.counters[COMPUTE_SLICES], 7);
    }
}

fn a100() -> &'static MigLayout {
    find_model("a100-40gb").unwrap().mig.as_ref().unwrap()
}

fn accept(set: &[(u32, u8)]) -> bool {
    let l = a100();
    let pls: Vec<_> = set
        .iter()
        .map(|(profile_id, start)| Placement {
            profile_id: *profile_id,
            start: *start,
        })
        .collect();
    counters_accept_set(&CounterScheme::new(l), l, &pls)
}

#[test]
fn counters_allow_only_one_plus_me_instance_per_gpu() {
    assert!(accept(&[(20, 0), (19, 1)]));
    assert!(!accept(&[(20, 0), (20, 3)]));
}

#[test]
fn counters_charge_two_memory_slices_to_a_1g_double_memory_profile() {
    assert!(accept(&[(15, 0), (15, 2), (15, 4), (15, 6)]));
    assert!(!accept(&[(15, 0), (19, 1)]));
    assert!(accept(&[(15, 6), (9, 0), (14, 4)]));
}

#[test]
fn counters_make_7g_and_4g_exclusive() {
    assert!(!accept(&[(0, 0), (19, 6)]));
    assert!(!accept(&[(5, 0), (0, 0)]));
    assert!(!accept(&[(5, 0), (9, 0)]));
    assert!(accept(&[(5, 0), (9, 4)]));
    assert!(accept(&[(5, 0), (14, 4), (19, 6)]));
}

#[test]
fn the_full_gpu_excludes_every_partition() {
    let l = a100();
    let s = CounterScheme::new(l);
    let full = s.full_gpu_consumption(0);
    let one = s
        .placement_consumption(
            0,
            l,
            Placement {
                profile_id: 19,
                start: 6,
            },
        )
        .unwrap();
    assert!(counters_accept(&s.counter_set(0), [&full]));
    assert!(!counters_accept(&s.counter_set(0), [&full, &one]));
}

#[test]
fn consumption_of_an_invalid_start_is_an_error() {
    let l = a100();
    let s = CounterScheme::new(l);
    assert!(
        s.placement_consumption(
            0,
            l,
            Placement {
                profile_id: 9,
                start: 2
            }
        )
        .is_err()
    );
}

#[test]
fn a_missing_limit_is_caught_by_a_profile_counter() {
    // A made-up layout where a profile's limit (2) is below what the geometry allows (4).
    let mut l = a100().clone();
    l.profiles
        .iter_mut()
        .find(|p| p.profile_id == 15)
        .unwrap()
        .max_instances = 2;
    let s = CounterScheme::new(&l);
    assert!(s.counter_set(0).counters.contains_key("1g-10gb-instances"));
    let all = all_placements(&l);
    walk(&l, &s, &all, &mut Vec::new(), 0, &mut (0, 0));
}

proptest! {
    /// Random multisets in random order, duplicates included: the two answers agree.
    #[test]
    fn counters_and_geometry_agree_on_random_multisets(
        model in 0usize..4,
        picks in proptest::collection::vec(0usize..25, 0..10),
    ) {
        let (_, layout) = layouts()[model];
        let all = all_placements(layout);
        let set: Vec<_> = picks.iter().map(|i| all[*i]).collect();
        let scheme = CounterScheme::new(layout);
        prop_assert_eq!(hardware_accepts(layout, &set), counters_accept_set(&scheme, layout, &set));
    }
}

/// The placement table of `gpu-hardware.md` §2 (GI profile id: memory slices, starts),
/// the same for the four models, transcribed independently of the catalogue.
const DOC_PLACEMENTS: [(u32, u8, &[u8]); 7] = [
    (19, 1, &[0, 1, 2, 3, 4, 5, 6]),
    (20, 1, &[0, 1, 2, 3, 4, 5, 6]),
    (15, 2, &[0, 2, 4, 6]),
    (14, 2, &[0, 2, 4]),
    (9, 4, &[0, 4]),
    (5, 4, &[0]),
    (0, 8, &[0]),
];

#[test]
fn memory_masks_match_the_placement_table_of_the_hardware_reference() {
    for (model, layout) in layouts() {
        let mut seen = Vec::new();
        for (profile, start) in layout.all_placements() {
            let (_, slices, starts) = DOC_PLACEMENTS
                .iter()
                .find(|(id, _, _)| *id == profile.profile_id)
                .unwrap_or_else(|| panic!("{model}: profile {} is not in the table", profile.name));
            assert!(
                starts.contains(&start),
                "{model}: {} at {start}",
                profile.name
            );
            let expected = ((1u32 << slices) - 1) << start;
            assert_eq!(
                crate::geometry::memory_mask(profile, start),
                expected,
                "{model}: {} at {start}",
                profile.name
            );
            seen.push((profile.profile_id, start));
        }
        let table: usize = DOC_PLACEMENTS.iter().map(|(_, _, s)| s.len()).sum();
        assert_eq!(
            seen.len(),
            table,
            "{model}: every placement of the table, once"
        );
    }
}
