//! The placements of a static MIG layout: which profile goes to which memory slice on
//! one GPU.
//!
//! A `GpuSharingPolicy` in `Static` mode names a layout (`4g.40gb + 3g.40gb`); the
//! operator must turn it into exact placements for `GpuNode.spec.gpus[].mig.instances`.
//! Every rule of what may go where is [`Occupancy`]'s (crate `tessera-gpu`): this module
//! only searches, and checks each step with it, so the plan is valid exactly when the
//! simulated backend and the counters would accept it.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::fmt;

use tessera_api::gpunode::PlannedInstance;
use tessera_api::policy::{MigLayoutEntry, MigProfileName};
use tessera_gpu::{MigLayout, MigProfile, Occupancy, Placement};

/// Why a layout cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The layout names a profile the GPU model does not have.
    #[error(
        "MIG profile {profile:?} does not exist on this GPU; its profiles are: {}",
        available.join(", ")
    )]
    UnknownProfile {
        /// The name as written.
        profile: String,
        /// The model's profile names, in NVML order.
        available: Vec<String>,
    },
    /// No set of placements holds the layout, whatever runs on the GPU.
    #[error(
        "MIG layout {wanted} does not fit this GPU: {why}; {}",
        fits_hint(fits)
    )]
    DoesNotFit {
        /// The layout, e.g. `4g.40gb + 2×2g.20gb`.
        wanted: String,
        /// What the layout exceeds.
        why: String,
        /// The largest parts of the layout that do fit (each planned successfully).
        fits: Vec<String>,
    },
    /// The layout fits an empty GPU, but not around instances that hold claims.
    #[error(
        "MIG layout {wanted} cannot be planned while these instances hold claims: {}; \
         it will be once their claims are released",
        join(blocking)
    )]
    InUse {
        /// The layout.
        wanted: String,
        /// The kept instances in the way; releasing all of them unblocks the plan.
        blocking: Vec<Blocking>,
    },
    /// A planned instance's start is not a memory-slice index at all.
    #[error("MIG instance {profile} has start {start}, which is not a memory slice")]
    InvalidStart {
        /// Profile name.
        profile: String,
        /// The start as written.
        start: u32,
    },
}

/// A kept instance (one that holds claims) that stands in the way of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocking {
    /// Where it sits.
    pub placement: Placement,
    /// Its profile's name (`profile id N` when the model lacks the id).
    pub profile: String,
    /// Why it blocks.
    pub reason: BlockReason,
}

/// Why a kept instance blocks a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockReason {
    /// Its profile is not in the layout.
    NotInLayout,
    /// More instances of its profile hold claims than the layout has.
    TooMany {
        /// Instances of the profile the layout has.
        wanted: u32,
        /// Kept instances of the profile.
        kept: u32,
    },
    /// The rest of the layout does not fit around it.
    InTheWay,
}

impl fmt::Display for Blocking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at memory slice {} ",
            self.profile, self.placement.start
        )?;
        match self.reason {
            BlockReason::NotInLayout => f.write_str("(not in the layout)"),
            BlockReason::TooMany { wanted, kept } => {
                write!(f, "(the layout has {wanted} of them, {kept} hold claims)")
            }
            BlockReason::InTheWay => f.write_str("(the rest of the layout does not fit around it)"),
        }
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn fits_hint(fits: &[String]) -> String {
    if fits.is_empty() {
        "no part of it fits".to_string()
    } else {
        format!("layouts that fit include {}", fits.join(", "))
    }
}

/// Plans `wanted` on a GPU of `layout`. `keep`: instances that exist now and hold claims
/// (they never move: each must appear unchanged in the plan and counts toward its
/// profile's count). `current`: the GPU's current planned/live free instances, which the
/// plan should reuse where possible (fewer instances destroyed and remade) — may be empty.
///
/// The plan is sorted by start. Among the valid plans it picks, in this order:
///
/// 1. the one that reuses most of `current`: every instance not reused is destroyed and
///    remade, which takes it away from its users for a while;
/// 2. the one after which the largest profile still fits, then the one with the longest
///    run of free memory slices: slack should stay usable by a later, bigger partition.
///    The run alone would mislead, since profiles start only at fixed slices (a 1g at
///    slice 0 leaves seven free slices in a row, yet a 4g, which starts only at 0, no
///    longer fits; at slice 6 it still does);
/// 3. the lowest starts, compared as a sequence with larger profiles first, so that equal
///    candidates resolve the same way every time.
///
/// Errors: [`PlanError::UnknownProfile`] for a name the model lacks,
/// [`PlanError::DoesNotFit`] when no valid plan exists even on an empty GPU, and
/// [`PlanError::InUse`] when one exists but not with `keep` where it is. An empty layout
/// plans nothing.
pub fn plan(
    layout: &MigLayout,
    wanted: &[MigLayoutEntry],
    keep: &[Placement],
    current: &[Placement],
) -> Result<Vec<Placement>, PlanError> {
    let want = Wanted::resolve(layout, wanted)?;
    if let Some(why) = want.exceeds() {
        return Err(want.does_not_fit(why));
    }
    let blocking = want.unmatched_keep(keep);
    if blocking.is_empty() {
        let reusable: BTreeSet<Placement> = current.iter().copied().collect();
        if let Some(best) = want.search(keep, Goal::Best(&reusable)) {
            let mut plan = best;
            plan.sort_by_key(|p| (p.start, p.profile_id));
            return Ok(plan);
        }
    }
    if want.search(&[], Goal::Any).is_none() {
        return Err(want.does_not_fit(
            "its instances overlap wherever the hardware lets them start".to_string(),
        ));
    }
    // Past the kept instances no plan can hold, those that are in the way of the rest.
    let matched: Vec<Placement> = keep
        .iter()
        .filter(|pl| !blocking.iter().any(|b| b.placement == **pl))
        .copied()
        .collect();
    let mut blocking = blocking;
    if want.search(&matched, Goal::Any).is_none() {
        blocking.extend(want.in_the_way(&matched));
    }
    blocking.sort_by_key(|b| (b.placement.start, b.placement.profile_id));
    Err(PlanError::InUse {
        wanted: want.render(&want.counts),
        blocking,
    })
}

/// The plan as `GpuNode.spec` writes it. Placements whose profile id the layout lacks are
/// left out ([`plan`] never returns any).
pub fn planned_instances(layout: &MigLayout, plan: &[Placement]) -> Vec<PlannedInstance> {
    plan.iter()
        .filter_map(|pl| {
            layout.profile(pl.profile_id).map(|p| PlannedInstance {
                profile: MigProfileName(p.name.clone()),
                start: u32::from(pl.start),
            })
        })
        .collect()
}

/// The placements of instances written in `GpuNode.spec` (e.g. the last plan, to pass as
/// `current`).
pub fn placements_of(
    layout: &MigLayout,
    instances: &[PlannedInstance],
) -> Result<Vec<Placement>, PlanError> {
    instances
        .iter()
        .map(|i| {
            let profile = layout
                .profile_by_name(i.profile.as_str())
                .ok_or_else(|| unknown_profile(layout, i.profile.as_str()))?;
            let start = u8::try_from(i.start).map_err(|_| PlanError::InvalidStart {
                profile: profile.name.clone(),
                start: i.start,
            })?;
            Ok(Placement {
                profile_id: profile.profile_id,
                start,
            })
        })
        .collect()
}

fn unknown_profile(layout: &MigLayout, name: &str) -> PlanError {
    PlanError::UnknownProfile {
        profile: name.to_string(),
        available: layout.profiles.iter().map(|p| p.name.clone()).collect(),
    }
}

/// What the search is after.
#[derive(Clone, Copy)]
enum Goal<'a> {
    /// Any valid plan (feasibility only).
    Any,
    /// The best plan by [`Score`], reusing from this set.
    Best(&'a BTreeSet<Placement>),
}

/// How good a complete plan is; larger is better (see [`plan`] for why).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    reused: usize,
    /// (memory slices, compute slices) of the largest profile still placeable.
    largest_after: (u8, u8),
    longest_free_run: u8,
    /// Starts of the placed instances in search order (largest profile first).
    lowest_starts: Reverse<Vec<u8>>,
}

/// A layout resolved against the model: counts per profile, profiles in search order.
struct Wanted<'l> {
    layout: &'l MigLayout,
    /// Profiles largest first (more memory, then more compute slices, plain before `+me`,
    /// then NVML order). Larger instances have fewer starts and collide more, so placing
    /// them first cuts dead branches early.
    profiles: Vec<&'l MigProfile>,
    /// Wanted instances per entry of `profiles`. u64: counts add up from u32 entries.
    counts: Vec<u64>,
}

impl<'l> Wanted<'l> {
    fn resolve(layout: &'l MigLayout, wanted: &[MigLayoutEntry]) -> Result<Self, PlanError> {
        let mut profiles: Vec<&MigProfile> = layout.profiles.iter().collect();
        profiles.sort_by_key(|p| {
            (
                Reverse(p.memory_slices),
                Reverse(p.compute_slices),
                p.media_extension,
            )
        });
        let mut counts = vec![0u64; profiles.len()];
        for entry in wanted {
            let name = entry.profile.as_str();
            let i = profiles
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| unknown_profile(layout, name))?;
            counts[i] += u64::from(entry.count);
        }
        Ok(Self {
            layout,
            profiles,
            counts,
        })
    }

    fn total(counts: &[u64]) -> u64 {
        counts.iter().sum()
    }

    fn index_of(&self, profile_id: u32) -> Option<usize> {
        self.profiles
            .iter()
            .position(|p| p.profile_id == profile_id)
    }

    /// `4g.40gb + 2×2g.20gb`, largest first.
    fn render(&self, counts: &[u64]) -> String {
        let parts: Vec<String> = self
            .profiles
            .iter()
            .zip(counts)
            .filter(|(_, n)| **n > 0)
            .map(|(p, n)| match n {
                1 => p.name.clone(),
                n => format!("{n}×{}", p.name),
            })
            .collect();
        if parts.is_empty() {
            "(empty)".to_string()
        } else {
            parts.join(" + ")
        }
    }

    /// The limits a layout breaks whatever the placement: instance counts and slice sums.
    /// Occupancy enforces the same limits placement by placement; saying them up front
    /// makes the message precise and keeps huge counts out of the search.
    fn exceeds(&self) -> Option<String> {
        let l = self.layout;
        let total = Self::total(&self.counts);
        if total > u64::from(l.max_gpu_instances) {
            return Some(format!(
                "it has {total} instances, a GPU holds at most {}",
                l.max_gpu_instances
            ));
        }
        let over: Vec<String> = self
            .profiles
            .iter()
            .zip(&self.counts)
            .filter(|(p, n)| **n > u64::from(p.max_instances))
            .map(|(p, _)| match p.max_instances {
                1 => format!("1 instance of {}", p.name),
                n => format!("{n} instances of {}", p.name),
            })
            .collect();
        if !over.is_empty() {
            return Some(format!("a GPU holds at most {}", over.join(", ")));
        }
        let (compute, memory) = self.slices(&self.counts);
        if compute > u64::from(l.compute_slices) || memory > u64::from(l.memory_slices) {
            return Some(format!(
                "a GPU holds at most {} compute slices and {} memory slices, this layout needs \
                 {compute} compute slices and {memory} memory slices",
                l.compute_slices, l.memory_slices
            ));
        }
        None
    }

    fn slices(&self, counts: &[u64]) -> (u64, u64) {
        self.profiles
            .iter()
            .zip(counts)
            .fold((0, 0), |(c, m), (p, n)| {
                (
                    c + n * u64::from(p.compute_slices),
                    m + n * u64::from(p.memory_slices),
                )
            })
    }

    fn does_not_fit(&self, why: String) -> PlanError {
        PlanError::DoesNotFit {
            wanted: self.render(&self.counts),
            why,
            fits: self.largest_fitting_parts(2),
        }
    }

    /// Up to `n` sub-layouts of the wanted one that fit, largest first (compute slices,
    /// then memory slices, then instances), none contained in another suggestion.
    ///
    /// Worst case: a layout with many of every profile, whose sub-layouts are the product
    /// of its capped counts; the slice sums filter most of them out before any search, and
    /// the scan stops at the first `n` that fit, which come early since they are tried
    /// largest first.
    fn largest_fitting_parts(&self, n: usize) -> Vec<String> {
        let l = self.layout;
        let caps: Vec<u64> = self
            .profiles
            .iter()
            .zip(&self.counts)
            .map(|(p, c)| {
                (*c).min(u64::from(p.max_instances))
                    .min(u64::from(l.max_gpu_instances))
            })
            .collect();
        let mut candidates: Vec<Vec<u64>> = vec![Vec::new()];
        for cap in &caps {
            candidates = candidates
                .into_iter()
                .flat_map(|prefix| {
                    (0..=*cap).map(move |k| {
                        let mut v = prefix.clone();
                        v.push(k);
                        v
                    })
                })
                .filter(|v| Self::total(v) <= u64::from(l.max_gpu_instances))
                .collect();
        }
        let size = |v: &Vec<u64>| {
            let (c, m) = self.slices(v);
            (c, m, Self::total(v))
        };
        candidates.retain(|v| {
            let (c, m, total) = size(v);
            total > 0
                && *v != self.counts
                && c <= u64::from(l.compute_slices)
                && m <= u64::from(l.memory_slices)
        });
        // Largest first; ties: more of the larger profiles (vectors run largest first).
        candidates.sort_by_cached_key(|v| Reverse((size(v), v.clone())));
        let mut found: Vec<Vec<u64>> = Vec::new();
        for counts in candidates {
            if found.len() >= n {
                break;
            }
            let contained = found
                .iter()
                .any(|f| f.iter().zip(&counts).all(|(a, b)| b <= a));
            if contained {
                continue;
            }
            let sub = Wanted {
                layout: l,
                profiles: self.profiles.clone(),
                counts: counts.clone(),
            };
            if sub.search(&[], Goal::Any).is_some() {
                found.push(counts);
            }
        }
        found.iter().map(|c| self.render(c)).collect()
    }

    /// Kept instances that no plan can contain, whatever their positions: a profile not in
    /// the layout, or more kept instances of a profile than the layout has.
    fn unmatched_keep(&self, keep: &[Placement]) -> Vec<Blocking> {
        let mut kept = vec![0u64; self.profiles.len()];
        for pl in keep {
            if let Some(i) = self.index_of(pl.profile_id) {
                kept[i] += 1;
            }
        }
        let mut blocking: Vec<Blocking> = keep
            .iter()
            .filter_map(|pl| {
                let reason = match self.index_of(pl.profile_id) {
                    Some(i) if self.counts[i] == 0 => BlockReason::NotInLayout,
                    Some(i) if kept[i] > self.counts[i] => BlockReason::TooMany {
                        wanted: u32::try_from(self.counts[i]).unwrap_or(u32::MAX),
                        kept: u32::try_from(kept[i]).unwrap_or(u32::MAX),
                    },
                    Some(_) => return None,
                    None => BlockReason::NotInLayout,
                };
                Some(self.blocking(*pl, reason))
            })
            .collect();
        blocking.sort_by_key(|b| (b.placement.start, b.placement.profile_id));
        blocking
    }

    fn blocking(&self, placement: Placement, reason: BlockReason) -> Blocking {
        Blocking {
            placement,
            profile: self.layout.profile(placement.profile_id).map_or_else(
                || format!("profile id {}", placement.profile_id),
                |p| p.name.clone(),
            ),
            reason,
        }
    }

    /// The fewest kept instances whose release lets the layout fit (the first such set by
    /// start). Only called when the layout fits an empty GPU, so releasing all of them
    /// always works; the keep of a GPU is at most its instance limit, so the subsets are
    /// few.
    fn in_the_way(&self, keep: &[Placement]) -> Vec<Blocking> {
        let mut sorted = keep.to_vec();
        sorted.sort_by_key(|p| (p.start, p.profile_id));
        let n = sorted.len();
        let mut masks: Vec<u32> = (0..(1u32 << n.min(16))).collect();
        // Fewest first; among as many, the lowest indices (by start) first.
        masks.sort_by_key(|m| (m.count_ones(), Reverse(m.reverse_bits())));
        for mask in masks {
            let stays: Vec<Placement> = sorted
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) == 0)
                .map(|(_, p)| *p)
                .collect();
            if self.search(&stays, Goal::Any).is_some() {
                return sorted
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, p)| self.blocking(*p, BlockReason::InTheWay))
                    .collect();
            }
        }
        sorted
            .iter()
            .map(|p| self.blocking(*p, BlockReason::InTheWay))
            .collect()
    }

    /// The best (or, for [`Goal::Any`], the first) plan that contains `keep` unchanged,
    /// or `None` when none exists. `keep` must not hold more of a profile than wanted.
    ///
    /// Exhaustive depth-first search over the starts of the instances still to place,
    /// largest profile first. Instances of one profile are interchangeable, so each is
    /// placed above the previous one of its profile: every placement set is met once. A
    /// branch whose reuse cannot reach the best one's is cut.
    ///
    /// Worst case: a first plan (nothing to reuse) of several small instances, e.g. a few
    /// 1g of different kinds: nearly every choice of starts is a complete plan, and all
    /// are scored. Complete plans are at most the valid placement sets of the GPU, which
    /// the exhaustive test enumerates. Replanning with the last plan as `current` is cheap:
    /// the first complete plan reuses it all and the reuse bound cuts the rest.
    fn search(&self, keep: &[Placement], goal: Goal<'_>) -> Option<Vec<Placement>> {
        let occ = Occupancy::from_placements(self.layout, keep).ok()?;
        let mut rest = self.counts.clone();
        for pl in keep {
            let i = self.index_of(pl.profile_id)?;
            rest[i] = rest[i].checked_sub(1)?;
        }
        let items: Vec<&MigProfile> = self
            .profiles
            .iter()
            .zip(&rest)
            .flat_map(|(p, n)| std::iter::repeat_n(*p, usize::try_from(*n).unwrap_or(0)))
            .collect();
        let mut s = Search {
            layout: self.layout,
            by_size: &self.profiles,
            items,
            goal,
            keep: keep.len(),
            chosen: keep.to_vec(),
            best: None,
        };
        s.descend(&occ, 0, 0);
        s.best.map(|(_, plan)| plan)
    }
}

struct Search<'a> {
    layout: &'a MigLayout,
    /// The layout's profiles, largest first.
    by_size: &'a [&'a MigProfile],
    items: Vec<&'a MigProfile>,
    goal: Goal<'a>,
    /// How many of `chosen` are kept placements.
    keep: usize,
    /// Kept placements, then those chosen so far.
    chosen: Vec<Placement>,
    best: Option<(Score, Vec<Placement>)>,
}

impl Search<'_> {
    fn descend(&mut self, occ: &Occupancy, depth: usize, reused: usize) {
        let Some(profile) = self.items.get(depth).copied() else {
            self.complete(occ, reused);
            return;
        };
        let above = if depth > 0 && self.items[depth - 1].profile_id == profile.profile_id {
            self.chosen.last().map(|p| p.start)
        } else {
            None
        };
        let is_above = |start: u8| above.is_none_or(|a| start > a);
        // Each instance of a profile goes above the previous one: too few starts left
        // above for the rest of them is a dead branch.
        let group_left = self.items[depth..]
            .iter()
            .take_while(|p| p.profile_id == profile.profile_id)
            .count();
        if profile.starts.iter().filter(|s| is_above(*s)).count() < group_left {
            return;
        }
        match (self.goal, &self.best) {
            (Goal::Any, Some(_)) => return,
            (Goal::Best(current), Some((best, _))) => {
                // At most this many more instances can be reused: per profile, no more
                // than the current placements of it (above, for this one).
                let reusable = |p: &MigProfile, from: u8| {
                    current
                        .range(
                            Placement {
                                profile_id: p.profile_id,
                                start: from,
                            }..=Placement {
                                profile_id: p.profile_id,
                                start: u8::MAX,
                            },
                        )
                        .count()
                };
                let mut bound =
                    group_left.min(reusable(profile, above.map_or(0, |a| a.saturating_add(1))));
                let mut rest = &self.items[depth + group_left..];
                while let Some(next) = rest.first() {
                    let n = rest
                        .iter()
                        .take_while(|p| p.profile_id == next.profile_id)
                        .count();
                    bound += n.min(reusable(next, 0));
                    rest = &rest[n..];
                }
                if reused + bound < best.reused {
                    return;
                }
            }
            (_, None) => {}
        }
        let mut starts: Vec<(bool, Placement)> = profile
            .starts
            .iter()
            .filter(|s| is_above(*s))
            .map(|start| {
                let pl = Placement {
                    profile_id: profile.profile_id,
                    start,
                };
                let reuse = match self.goal {
                    Goal::Best(current) => current.contains(&pl),
                    Goal::Any => false,
                };
                (reuse, pl)
            })
            .collect();
        // Reused starts first: the first complete plan then reuses all it can, and the
        // reuse bound above cuts every branch that would give up one. The tie-break is in
        // the score, so the visiting order does not change the result.
        starts.sort_by_key(|(reuse, pl)| (!*reuse, pl.start));
        for (reuse, pl) in starts {
            let mut next = occ.clone();
            // Tags only need to differ from the kept ones (0, 1, …).
            if next
                .place(self.layout, pl, u32::MAX - depth as u32)
                .is_err()
            {
                continue;
            }
            self.chosen.push(pl);
            self.descend(&next, depth + 1, reused + usize::from(reuse));
            self.chosen.pop();
        }
    }

    fn complete(&mut self, occ: &Occupancy, reused: usize) {
        let score = match self.goal {
            Goal::Any => Score {
                reused: 0,
                largest_after: (0, 0),
                longest_free_run: 0,
                lowest_starts: Reverse(Vec::new()),
            },
            Goal::Best(_) => Score {
                reused,
                largest_after: self.largest_placeable(occ),
                longest_free_run: longest_free_run(self.layout, occ),
                lowest_starts: Reverse(self.chosen[self.keep..].iter().map(|p| p.start).collect()),
            },
        };
        if self.best.as_ref().is_none_or(|(best, _)| score > *best) {
            self.best = Some((score, self.chosen.clone()));
        }
    }

    /// (memory slices, compute slices) of the largest profile still placeable: what
    /// [`Occupancy::largest_placeable`] measures, but trying profiles largest first and
    /// stopping at the first that fits, since this runs at every complete plan.
    fn largest_placeable(&self, occ: &Occupancy) -> (u8, u8) {
        self.by_size
            .iter()
            .find(|p| {
                p.starts.iter().any(|start| {
                    occ.can_place(
                        self.layout,
                        Placement {
                            profile_id: p.profile_id,
                            start,
                        },
                    )
                })
            })
            .map_or((0, 0), |p| (p.memory_slices, p.compute_slices))
    }
}

fn longest_free_run(layout: &MigLayout, occ: &Occupancy) -> u8 {
    let used = occ.memory_used();
    let (mut longest, mut run) = (0u8, 0u8);
    for slice in 0..layout.memory_slices.min(32) {
        if used & (1 << slice) == 0 {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

#[cfg(test)]
mod tests;
