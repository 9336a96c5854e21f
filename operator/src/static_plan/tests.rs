use std::collections::BTreeMap;

use tessera_gpu::{catalog, find_model};

use super::*;

fn layout(model: &str) -> &'static MigLayout {
    find_model(model).unwrap().mig.as_ref().unwrap()
}

fn h100() -> &'static MigLayout {
    layout("h100-80gb")
}

fn entries(v: &[(&str, u32)]) -> Vec<MigLayoutEntry> {
    v.iter()
        .map(|(name, count)| MigLayoutEntry {
            profile: MigProfileName(name.to_string()),
            count: *count,
        })
        .collect()
}

fn id(l: &MigLayout, name: &str) -> u32 {
    l.profile_by_name(name).unwrap().profile_id
}

fn pl(l: &MigLayout, name: &str, start: u8) -> Placement {
    Placement {
        profile_id: id(l, name),
        start,
    }
}

fn sorted(mut v: Vec<Placement>) -> Vec<Placement> {
    v.sort_by_key(|p| (p.start, p.profile_id));
    v
}

/// Instances per profile, in table order.
fn multiset(l: &MigLayout, plan: &[Placement]) -> Vec<u32> {
    l.profiles
        .iter()
        .map(|p| plan.iter().filter(|x| x.profile_id == p.profile_id).count() as u32)
        .collect()
}

fn as_entries(l: &MigLayout, counts: &[u32]) -> Vec<MigLayoutEntry> {
    l.profiles
        .iter()
        .zip(counts)
        .filter(|(_, n)| **n > 0)
        .map(|(p, n)| MigLayoutEntry {
            profile: MigProfileName(p.name.clone()),
            count: *n,
        })
        .collect()
}

/// Parses a rendered layout (`4g.40gb + 2×2g.20gb`) back into entries.
fn parse(s: &str) -> Vec<MigLayoutEntry> {
    s.split(" + ")
        .map(|part| match part.split_once('×') {
            Some((n, name)) => (name, n.parse().unwrap()),
            None => (part, 1),
        })
        .map(|(name, count)| MigLayoutEntry {
            profile: MigProfileName(name.to_string()),
            count,
        })
        .collect()
}

/// Brute force, no planner code: every set of placements the geometry accepts, found by
/// trying each of the model's (profile, start) pairs in or out, in list order.
fn valid_sets(l: &MigLayout) -> Vec<Vec<Placement>> {
    fn go(
        l: &MigLayout,
        all: &[Placement],
        from: usize,
        occ: &Occupancy,
        chosen: &mut Vec<Placement>,
        out: &mut Vec<Vec<Placement>>,
    ) {
        out.push(chosen.clone());
        for (i, p) in all.iter().enumerate().skip(from) {
            let mut next = occ.clone();
            if next.place(l, *p, i as u32).is_ok() {
                chosen.push(*p);
                go(l, all, i + 1, &next, chosen, out);
                chosen.pop();
            }
        }
    }
    let all: Vec<Placement> = l
        .all_placements()
        .map(|(p, start)| Placement {
            profile_id: p.profile_id,
            start,
        })
        .collect();
    let mut out = Vec::new();
    go(l, &all, 0, &Occupancy::new(), &mut Vec::new(), &mut out);
    out
}

/// Every multiset of profiles with at most `max_instances` of each and at most 7 in all.
fn multisets(l: &MigLayout) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = vec![Vec::new()];
    for p in &l.profiles {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                (0..=u32::from(p.max_instances)).map(move |k| {
                    let mut v = prefix.clone();
                    v.push(k);
                    v
                })
            })
            .filter(|v| v.iter().sum::<u32>() <= 7)
            .collect();
    }
    out
}

fn free_run(l: &MigLayout, occ: &Occupancy) -> u8 {
    let mut best = 0;
    let mut run = 0;
    for s in 0..l.memory_slices {
        if occ.memory_used() & (1 << s) == 0 {
            run += 1;
            best = best.max(run);
        } else {
            run = 0;
        }
    }
    best
}

/// Preference (2) of a plan, computed from the geometry alone.
fn room_after(l: &MigLayout, plan: &[Placement]) -> ((u8, u8), u8) {
    let occ = Occupancy::from_placements(l, plan).unwrap();
    let largest = occ
        .largest_placeable(l)
        .map_or((0, 0), |p| (p.memory_slices, p.compute_slices));
    (largest, free_run(l, &occ))
}

/// Exhaustive: every multiset of every MIG model, planned and compared with the brute
/// force. This is also the planner's worst case in bulk: each fitting multiset's search
/// scores all of its placement sets (nothing to reuse), so planning them all costs about
/// one pass over every valid placement set of the GPU.
#[test]
fn the_planner_finds_a_plan_exactly_when_the_geometry_allows_one() {
    // Non-empty multisets that fit, pinned: A100 and H100/H200 share one geometry.
    let pinned: &[(&str, usize)] = &[
        ("a100-40gb", 127),
        ("a100-80gb", 127),
        ("h100-80gb", 127),
        ("h200-141gb", 127),
    ];
    let models: Vec<&str> = catalog()
        .iter()
        .filter(|m| m.mig.is_some())
        .map(|m| m.id.as_str())
        .collect();
    assert_eq!(
        models,
        pinned.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
        "every MIG model is checked"
    );
    let mut counted = Vec::new();
    for (model, _) in pinned {
        let l = layout(model);
        let mut by_multiset: BTreeMap<Vec<u32>, Vec<Vec<Placement>>> = BTreeMap::new();
        for set in valid_sets(l) {
            by_multiset.entry(multiset(l, &set)).or_default().push(set);
        }
        let mut fitting = 0;
        for counts in multisets(l) {
            let wanted = as_entries(l, &counts);
            let got = plan(l, &wanted, &[], &[]);
            match by_multiset.get(&counts) {
                Some(sets) => {
                    let p = got.unwrap_or_else(|e| panic!("{model} {counts:?}: {e}"));
                    Occupancy::from_placements(l, &p).unwrap();
                    assert_eq!(multiset(l, &p), counts, "{model}");
                    assert_eq!(p, sorted(p.clone()), "{model}: sorted by start");
                    let best = sets.iter().map(|s| room_after(l, s)).max().unwrap();
                    assert_eq!(room_after(l, &p), best, "{model} {counts:?}: {p:?}");
                    assert_eq!(plan(l, &wanted, &[], &[]), Ok(p), "{model}: deterministic");
                    if !wanted.is_empty() {
                        fitting += 1;
                    }
                }
                None => match got {
                    Err(PlanError::DoesNotFit { fits, .. }) => {
                        assert!(!fits.is_empty(), "{model} {counts:?}");
                        for f in &fits {
                            let sub = plan(l, &parse(f), &[], &[])
                                .unwrap_or_else(|e| panic!("{model}: suggestion {f}: {e}"));
                            let sub = multiset(l, &sub);
                            assert!(sub.iter().zip(&counts).all(|(s, c)| s <= c), "{f}");
                        }
                    }
                    other => panic!("{model} {counts:?}: expected DoesNotFit, got {other:?}"),
                },
            }
        }
        counted.push((*model, fitting));
    }
    assert_eq!(counted, pinned, "fitting layouts per model");
}

/// Every valid placement set, passed as `current` for its own multiset, is planned as is.
#[test]
fn a_valid_current_plan_is_kept_as_it_is() {
    let l = h100();
    for set in valid_sets(l) {
        let wanted = as_entries(l, &multiset(l, &set));
        let mut current = set.clone();
        current.reverse();
        assert_eq!(plan(l, &wanted, &[], &current), Ok(sorted(set)));
    }
}

/// Valid placement sets of H100 by multiset (table order), from the brute force.
fn h100_sets_by_multiset() -> BTreeMap<Vec<u32>, Vec<Vec<Placement>>> {
    let l = h100();
    let mut by_multiset: BTreeMap<Vec<u32>, Vec<Vec<Placement>>> = BTreeMap::new();
    for set in valid_sets(l) {
        by_multiset.entry(multiset(l, &set)).or_default().push(set);
    }
    by_multiset
}

/// Every fitting layout with every placement, and every pair of placements that fit
/// together, kept: the plan exists exactly when some valid placement set of the layout
/// contains them, holds them unchanged, and otherwise the error names a kept one.
#[test]
fn a_keep_is_planned_exactly_when_some_plan_contains_it() {
    let l = h100();
    let all: Vec<Placement> = l
        .all_placements()
        .map(|(p, start)| Placement {
            profile_id: p.profile_id,
            start,
        })
        .collect();
    let mut keeps: Vec<Vec<Placement>> = all.iter().map(|p| vec![*p]).collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if Occupancy::from_placements(l, &[*a, *b]).is_ok() {
                keeps.push(vec![*a, *b]);
            }
        }
    }
    for (counts, sets) in h100_sets_by_multiset() {
        let wanted = as_entries(l, &counts);
        for keep in &keeps {
            let possible = sets.iter().any(|s| keep.iter().all(|k| s.contains(k)));
            match plan(l, &wanted, keep, &[]) {
                Ok(p) => {
                    assert!(possible, "{counts:?} {keep:?}: {p:?}");
                    assert!(keep.iter().all(|k| p.contains(k)), "{keep:?}: {p:?}");
                    assert_eq!(multiset(l, &p), counts);
                    Occupancy::from_placements(l, &p).unwrap();
                }
                Err(PlanError::InUse { blocking, .. }) => {
                    assert!(!possible, "{counts:?} {keep:?}");
                    assert!(!blocking.is_empty());
                    assert!(blocking.iter().all(|b| keep.contains(&b.placement)));
                }
                Err(e) => panic!("{counts:?} {keep:?}: {e}"),
            }
        }
    }
}

/// Every fitting layout replanned from the first plan of every layout of up to four
/// instances that fills the GPU (the usual current states): the plan reuses as many current instances as any valid plan
/// could, and among those leaves the most room.
#[test]
fn a_plan_reuses_as_much_of_current_as_any_plan_could() {
    let l = h100();
    let by_multiset = h100_sets_by_multiset();
    let currents: Vec<Vec<Placement>> = by_multiset
        .keys()
        .map(|c| plan(l, &as_entries(l, c), &[], &[]).unwrap())
        .filter(|p| {
            p.len() <= 4
                && Occupancy::from_placements(l, p)
                    .unwrap()
                    .feasible_placements(l)
                    .is_empty()
        })
        .collect();
    assert!(currents.len() > 1);
    for (counts, sets) in &by_multiset {
        let wanted = as_entries(l, counts);
        for current in &currents {
            let value = |s: &[Placement]| {
                let reused = s.iter().filter(|p| current.contains(p)).count();
                (reused, room_after(l, s))
            };
            let best = sets.iter().map(|s| value(s)).max().unwrap();
            let p = plan(l, &wanted, &[], current).unwrap();
            assert_eq!(value(&p), best, "{counts:?} from {current:?}: {p:?}");
        }
    }
}

#[test]
fn reusing_current_instances_comes_before_room_for_later_ones() {
    let l = h100();
    let wanted = entries(&[("3g.40gb", 1), ("1g.10gb", 1)]);
    let fresh = plan(l, &wanted, &[], &[]).unwrap();
    assert!(!fresh.contains(&pl(l, "3g.40gb", 0)), "{fresh:?}");
    // A 3g at 0 left from an earlier layout is reused, although the other half has more room.
    let reused = plan(l, &wanted, &[], &[pl(l, "3g.40gb", 0), pl(l, "2g.20gb", 4)]).unwrap();
    assert!(reused.contains(&pl(l, "3g.40gb", 0)), "{reused:?}");
    assert!(room_after(l, &reused) < room_after(l, &fresh));
}

#[test]
fn the_most_current_instances_are_reused() {
    let l = h100();
    // Two 3g exist; the new layout keeps one and needs the other half for two 2g: only the
    // 3g at 4 leaves room for them, so it is the one reused.
    let current = [pl(l, "3g.40gb", 0), pl(l, "3g.40gb", 4)];
    let p = plan(
        l,
        &entries(&[("3g.40gb", 1), ("2g.20gb", 2)]),
        &[],
        &current,
    )
    .unwrap();
    assert_eq!(
        p,
        vec![
            pl(l, "2g.20gb", 0),
            pl(l, "2g.20gb", 2),
            pl(l, "3g.40gb", 4)
        ]
    );
}

#[test]
fn a_single_1g_goes_where_the_largest_partition_still_fits() {
    let l = h100();
    let p = plan(l, &entries(&[("1g.10gb", 1)]), &[], &[]).unwrap();
    assert_eq!(p.len(), 1);
    let best = l
        .profile_by_name("1g.10gb")
        .unwrap()
        .starts
        .iter()
        .map(|s| room_after(l, &[pl(l, "1g.10gb", s)]))
        .max()
        .unwrap();
    assert_eq!(room_after(l, &p), best);
    // What that means on this geometry: a 4g (which starts only at 0) still fits, which
    // the start with the longest free run (0) would rule out.
    let occ = Occupancy::from_placements(l, &p).unwrap();
    assert!(occ.can_place(l, pl(l, "4g.40gb", 0)));
    let at_0 = Occupancy::from_placements(l, &[pl(l, "1g.10gb", 0)]).unwrap();
    assert!(free_run(l, &at_0) > free_run(l, &occ));
    assert!(!at_0.can_place(l, pl(l, "4g.40gb", 0)));
}

#[test]
fn an_empty_layout_plans_nothing() {
    assert_eq!(plan(h100(), &[], &[], &[]), Ok(vec![]));
    assert_eq!(
        plan(h100(), &[], &[], &[pl(h100(), "3g.40gb", 0)]),
        Ok(vec![])
    );
}

#[test]
fn the_plan_does_not_depend_on_how_the_layout_is_written() {
    let l = h100();
    let a = plan(l, &entries(&[("3g.40gb", 1), ("4g.40gb", 1)]), &[], &[]);
    let b = plan(l, &entries(&[("4g.40gb", 1), ("3g.40gb", 1)]), &[], &[]);
    assert_eq!(a, b);
    let a = plan(
        l,
        &entries(&[("1g.10gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)]),
        &[],
        &[],
    );
    let b = plan(l, &entries(&[("2g.20gb", 1), ("1g.10gb", 3)]), &[], &[]);
    assert_eq!(a, b);
}

#[test]
fn kept_instances_stay_where_they_are() {
    let l = h100();
    let wanted = entries(&[("4g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 1)]);
    let keep = [pl(l, "2g.20gb", 4)];
    let p = plan(l, &wanted, &keep, &[]).unwrap();
    assert!(p.contains(&keep[0]));
    assert_eq!(
        multiset(l, &p),
        multiset(l, &plan(l, &wanted, &[], &[]).unwrap())
    );
    // Kept instances count toward the layout: both 3g kept, nothing else to place.
    let keep = [pl(l, "3g.40gb", 4), pl(l, "3g.40gb", 0)];
    let p = plan(
        l,
        &entries(&[("3g.40gb", 2)]),
        &keep,
        &[pl(l, "1g.10gb", 3)],
    )
    .unwrap();
    assert_eq!(p, sorted(keep.to_vec()));
}

#[test]
fn a_kept_instance_in_the_way_is_named() {
    let l = h100();
    // 4g + 2g + 1g fits only as 4g at 0, 2g at 4, 1g at 6: a 1g kept at 5 is in the way.
    let wanted = entries(&[("4g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 1)]);
    let keep = [pl(l, "4g.40gb", 0), pl(l, "1g.10gb", 5)];
    let err = plan(l, &wanted, &keep, &[]).unwrap_err();
    let PlanError::InUse { blocking, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(blocking.len(), 1, "{err}");
    assert_eq!(blocking[0].placement, keep[1]);
    assert_eq!(blocking[0].reason, BlockReason::InTheWay);
    let msg = err.to_string();
    assert!(msg.contains("1g.10gb at memory slice 5"), "{msg}");
    assert!(msg.contains("claims are released"), "{msg}");
    // Released, it plans.
    assert!(plan(l, &wanted, &keep[..1], &[]).is_ok());
}

#[test]
fn kept_instances_the_layout_does_not_have_are_named() {
    let l = h100();
    let keep = [pl(l, "2g.20gb", 0), pl(l, "3g.40gb", 4)];
    let err = plan(l, &entries(&[("3g.40gb", 2)]), &keep, &[]).unwrap_err();
    assert!(
        matches!(&err, PlanError::InUse { blocking, .. }
            if blocking.len() == 1 && blocking[0].reason == BlockReason::NotInLayout
                && blocking[0].placement == keep[0]),
        "{err}"
    );
    assert!(err.to_string().contains("not in the layout"), "{err}");

    let keep = [pl(l, "1g.10gb", 0), pl(l, "1g.10gb", 1)];
    let err = plan(l, &entries(&[("1g.10gb", 1)]), &keep, &[]).unwrap_err();
    assert!(
        matches!(&err, PlanError::InUse { blocking, .. } if blocking.len() == 2
            && blocking[0].reason == BlockReason::TooMany { wanted: 1, kept: 2 }),
        "{err}"
    );

    let err = plan(l, &[], &keep, &[]).unwrap_err();
    assert!(matches!(err, PlanError::InUse { .. }), "{err}");
}

#[test]
fn a_layout_that_never_fits_is_not_reported_as_waiting_for_claims() {
    let l = h100();
    let keep = [pl(l, "1g.10gb", 3)];
    let err = plan(l, &entries(&[("4g.40gb", 1), ("3g.40gb", 2)]), &keep, &[]).unwrap_err();
    assert!(matches!(err, PlanError::DoesNotFit { .. }), "{err}");
}

#[test]
fn an_unknown_profile_lists_the_models_profiles() {
    let l = layout("a100-40gb");
    let err = plan(l, &entries(&[("3g.40gb", 1)]), &[], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "MIG profile \"3g.40gb\" does not exist on this GPU; its profiles are: 1g.5gb, \
         1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"
    );
}

#[test]
fn a_layout_too_big_says_what_it_needs_and_what_fits() {
    let l = h100();
    let err = plan(l, &entries(&[("4g.40gb", 1), ("2g.20gb", 2)]), &[], &[]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("MIG layout 4g.40gb + 2×2g.20gb does not fit"),
        "{msg}"
    );
    assert!(msg.contains("this layout needs 8 compute slices"), "{msg}");
    let PlanError::DoesNotFit { fits, .. } = err else {
        unreachable!()
    };
    assert_eq!(fits, vec!["4g.40gb + 2g.20gb", "2×2g.20gb"], "{msg}");
    for f in &fits {
        assert!(plan(l, &parse(f), &[], &[]).is_ok(), "{f}");
    }
}

#[test]
fn absurd_counts_are_refused_without_a_search() {
    let l = h100();
    let err = plan(
        l,
        &entries(&[("1g.10gb", u32::MAX), ("1g.10gb", u32::MAX)]),
        &[],
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("a GPU holds at most 7"), "{err}");
    let err = plan(l, &entries(&[("3g.40gb", 3)]), &[], &[]).unwrap_err();
    assert!(
        err.to_string().contains("at most 2 instances of 3g.40gb"),
        "{err}"
    );
    let err = plan(l, &entries(&[("7g.80gb", 2)]), &[], &[]).unwrap_err();
    assert!(
        err.to_string().contains("at most 1 instance of 7g.80gb"),
        "{err}"
    );
    assert!(matches!(err, PlanError::DoesNotFit { fits, .. } if fits == ["7g.80gb"]));
}

#[test]
fn plans_round_trip_through_the_gpunode_spec() {
    let l = h100();
    let p = plan(l, &entries(&[("4g.40gb", 1), ("3g.40gb", 1)]), &[], &[]).unwrap();
    let spec = planned_instances(l, &p);
    assert_eq!(spec[0].profile.as_str(), "4g.40gb");
    assert_eq!(placements_of(l, &spec), Ok(p));
    let bad = vec![PlannedInstance {
        profile: MigProfileName("1g.10gb".into()),
        start: 300,
    }];
    assert!(matches!(
        placements_of(l, &bad),
        Err(PlanError::InvalidStart { start: 300, .. })
    ));
}
