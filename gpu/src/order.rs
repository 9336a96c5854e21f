//! Placement order: which placement of a profile to offer first, and which GPU first.
//!
//! kube-scheduler takes the first device that fits (devices in slice order, slices by
//! name), so the order in which the plugin publishes placements is how Tessera fights
//! fragmentation. For a GPU's occupancy each feasible placement is scored by what the GPU
//! can still take *after* it, and GPUs are ordered most-used first so that work packs
//! onto GPUs that are already partitioned and idle GPUs stay whole.
//!
//! Everything here is deterministic: equal scores fall back to the lower start, equal
//! GPUs to the lower index.

use std::cmp::{Ordering, Reverse};

use crate::{
    catalog::MigLayout,
    geometry::{Occupancy, Placement},
};

/// How good a placement is for the GPU's future; larger is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlacementScore {
    /// (memory slices, compute slices) of the largest profile still placeable after this
    /// placement: keeps the largest free run intact.
    pub largest_after: (u8, u8),
    /// Σ over placements still feasible after this one of their memory slices: how much
    /// choice is left for later requests.
    pub capacity_after: u32,
    /// Tie-break: lower start first.
    pub start_rank: Reverse<u8>,
}

/// A placement with its score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoredPlacement {
    /// The placement.
    pub placement: Placement,
    /// Its score.
    pub score: PlacementScore,
}

fn future_value(layout: &MigLayout, occ: &Occupancy) -> ((u8, u8), u32) {
    let mut largest = (0u8, 0u8);
    let mut capacity = 0u32;
    for (p, start) in layout.all_placements() {
        let pl = Placement {
            profile_id: p.profile_id,
            start,
        };
        if occ.can_place(layout, pl) {
            largest = largest.max((p.memory_slices, p.compute_slices));
            capacity += u32::from(p.memory_slices);
        }
    }
    (largest, capacity)
}

/// Scores `placement` on `occ`, or `None` when it is not feasible.
pub fn score_placement(
    layout: &MigLayout,
    occ: &Occupancy,
    placement: Placement,
) -> Option<PlacementScore> {
    let mut after = occ.clone();
    after.place(layout, placement, u32::MAX).ok()?;
    let (largest_after, capacity_after) = future_value(layout, &after);
    Some(PlacementScore {
        largest_after,
        capacity_after,
        start_rank: Reverse(placement.start),
    })
}

/// The feasible placements of `profile_id` on `occ`, best first.
pub fn rank_placements(
    layout: &MigLayout,
    occ: &Occupancy,
    profile_id: u32,
) -> Vec<ScoredPlacement> {
    let mut ranked: Vec<ScoredPlacement> = layout
        .profile(profile_id)
        .into_iter()
        .flat_map(|p| p.starts.iter())
        .filter_map(|start| {
            let placement = Placement { profile_id, start };
            score_placement(layout, occ, placement)
                .map(|score| ScoredPlacement { placement, score })
        })
        .collect();
    ranked.sort_by_key(|s| Reverse(s.score));
    ranked
}

/// The best placement of `profile_id` on `occ`, if any.
pub fn choose_placement(layout: &MigLayout, occ: &Occupancy, profile_id: u32) -> Option<Placement> {
    rank_placements(layout, occ, profile_id)
        .first()
        .map(|s| s.placement)
}

/// Every placement of the layout in publishing order: profiles in table order; within a
/// profile the feasible placements best first, then the infeasible ones by start (they are
/// published too, the counters keep them unallocatable, and they become feasible as soon
/// as their slices are freed).
pub fn publishing_order(layout: &MigLayout, occ: &Occupancy) -> Vec<Placement> {
    let mut out = Vec::new();
    for p in &layout.profiles {
        let ranked = rank_placements(layout, occ, p.profile_id);
        out.extend(ranked.iter().map(|s| s.placement));
        out.extend(
            p.starts
                .iter()
                .map(|start| Placement {
                    profile_id: p.profile_id,
                    start,
                })
                .filter(|pl| !ranked.iter().any(|s| s.placement == *pl)),
        );
    }
    out
}

/// GPU order, most-used first: more memory slices used, then more compute slices used,
/// then lower index. `gpus` holds (GPU index, occupancy); the result lists GPU indices.
pub fn gpu_order(gpus: &[(u32, &Occupancy)]) -> Vec<u32> {
    let mut v: Vec<(u32, (u32, u32))> = gpus
        .iter()
        .map(|(i, occ)| {
            (
                *i,
                (
                    occ.memory_used().count_ones(),
                    occ.compute_used().count_ones(),
                ),
            )
        })
        .collect();
    v.sort_by(|a, b| match b.1.cmp(&a.1) {
        Ordering::Equal => a.0.cmp(&b.0),
        o => o,
    });
    v.into_iter().map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::find_model;

    fn layout() -> &'static MigLayout {
        find_model("h100-80gb").unwrap().mig.as_ref().unwrap()
    }

    fn pl(profile_id: u32, start: u8) -> Placement {
        Placement { profile_id, start }
    }

    #[test]
    fn a_1g_on_an_empty_gpu_goes_to_the_end_so_a_4g_still_fits() {
        let l = layout();
        let chosen = choose_placement(l, &Occupancy::new(), 19).unwrap();
        assert_eq!(chosen, pl(19, 6));
        let mut occ = Occupancy::new();
        occ.place(l, chosen, 1).unwrap();
        assert!(occ.can_place(l, pl(5, 0)));
    }

    #[test]
    fn a_2g_next_to_a_3g_leaves_the_other_half_free() {
        let l = layout();
        let occ = Occupancy::from_placements(l, &[pl(9, 4)]).unwrap();
        let ranked = rank_placements(l, &occ, 14);
        assert_eq!(ranked.len(), 2);
        // Either start keeps a 2g start free; the ranking is deterministic.
        assert_eq!(rank_placements(l, &occ, 14), ranked);
    }

    #[test]
    fn a_3g_prefers_the_half_that_keeps_a_4g_possible() {
        let l = layout();
        assert_eq!(choose_placement(l, &Occupancy::new(), 9), Some(pl(9, 4)));
    }

    #[test]
    fn an_infeasible_profile_has_no_choice() {
        let l = layout();
        let occ = Occupancy::from_placements(l, &[pl(0, 0)]).unwrap();
        assert_eq!(choose_placement(l, &occ, 19), None);
    }

    #[test]
    fn publishing_order_lists_every_placement_once() {
        let l = layout();
        let occ = Occupancy::from_placements(l, &[pl(9, 0)]).unwrap();
        let order = publishing_order(l, &occ);
        assert_eq!(order.len(), 25);
        let mut sorted = order.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 25);
        // The first 1g offered is a feasible one.
        assert!(occ.can_place(l, order[0]));
    }

    #[test]
    fn gpus_are_ordered_most_used_first_then_by_index() {
        let l = layout();
        let empty = Occupancy::new();
        let half = Occupancy::from_placements(l, &[pl(9, 0)]).unwrap();
        let small = Occupancy::from_placements(l, &[pl(19, 6)]).unwrap();
        assert_eq!(
            gpu_order(&[(0, &empty), (1, &small), (2, &half), (3, &empty)]),
            vec![2, 1, 0, 3]
        );
    }
}
