//! Per-GPU MIG occupancy: which memory and compute slices are used, by which instance,
//! and what can still be placed.
//!
//! This is the *hardware* model that the simulated backend enforces and that the
//! counter scheme of [`crate::counters`] is proven against. Its rules:
//!
//! - a profile starts only at one of its listed starts;
//! - memory slices `[start, start + memory_slices)` are exclusive;
//! - compute slices are positional: compute slice `k` belongs to memory slice `k`
//!   (memory slice 7 has no compute slice of its own), so an instance uses compute slices
//!   `[start, start + compute_slices)`. This is a model: NVML's placement API speaks only
//!   of memory slices; it reproduces the published stranding facts (3g + 3g leaves one
//!   compute slice idle, 7 × 1g leaves memory slice 7 idle);
//! - at most `max_instances` of each profile, at most `max_gpu_instances` in total;
//! - at most one `+me` instance per GPU (it takes the media engines).

use serde::{Deserialize, Serialize};

use crate::catalog::{MigLayout, MigProfile};

/// A MIG placement: a profile at a start (memory-slice index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// NVML profile id.
    pub profile_id: u32,
    /// First memory slice.
    pub start: u8,
}

/// One instance recorded in an [`Occupancy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Occupant {
    /// Where it sits.
    pub placement: Placement,
    /// Caller's identity for the instance (the GPU-instance id in backends).
    pub tag: u32,
}

/// Why a placement is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The profile id is not one of the GPU's profiles.
    #[error("unknown MIG profile id {0}")]
    UnknownProfile(u32),
    /// The start is not one the profile may use.
    #[error("profile {profile} cannot start at memory slice {start}; valid starts: {valid:?}")]
    InvalidStart {
        /// Profile name.
        profile: String,
        /// Requested start.
        start: u8,
        /// Valid starts.
        valid: Vec<u8>,
    },
    /// Memory slices already used by another instance.
    #[error("profile {profile} at {start}: memory slices {slices:?} are in use")]
    MemoryInUse {
        /// Profile name.
        profile: String,
        /// Requested start.
        start: u8,
        /// The conflicting slices.
        slices: Vec<u8>,
    },
    /// Compute slices already used by another instance.
    #[error("profile {profile} at {start}: compute slices {slices:?} are in use")]
    ComputeInUse {
        /// Profile name.
        profile: String,
        /// Requested start.
        start: u8,
        /// The conflicting slices.
        slices: Vec<u8>,
    },
    /// The profile's instance limit is reached.
    #[error("profile {profile} already has its maximum of {max} instances")]
    ProfileLimit {
        /// Profile name.
        profile: String,
        /// The limit.
        max: u8,
    },
    /// The GPU's instance limit is reached.
    #[error("the GPU already has its maximum of {0} GPU instances")]
    GpuInstanceLimit(u8),
    /// A `+me` instance already holds the media engines.
    #[error("profile {0}: another +me instance already holds the GPU's media engines")]
    MediaEnginesTaken(String),
    /// The tag is already used by another occupant.
    #[error("instance tag {0} is already in use")]
    DuplicateTag(u32),
    /// No occupant with that tag.
    #[error("no instance with tag {0}")]
    UnknownTag(u32),
}

/// Memory-slice mask of a profile placed at `start`.
pub fn memory_mask(profile: &MigProfile, start: u8) -> u32 {
    range_mask(start, profile.memory_slices)
}

/// Compute-slice mask of a profile placed at `start` (positional model, see module docs).
pub fn compute_mask(profile: &MigProfile, start: u8) -> u32 {
    range_mask(start, profile.compute_slices)
}

fn range_mask(start: u8, len: u8) -> u32 {
    let len = u32::from(len).min(32);
    let ones = if len == 32 {
        u32::MAX
    } else {
        (1u32 << len) - 1
    };
    ones.checked_shl(u32::from(start)).unwrap_or(0)
}

fn bits(mask: u32) -> Vec<u8> {
    (0u8..32).filter(|i| mask & (1 << i) != 0).collect()
}

/// The MIG occupancy of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Occupancy {
    memory: u32,
    compute: u32,
    occupants: Vec<Occupant>,
}

impl Occupancy {
    /// An empty GPU.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds an occupancy from placements, tagging them 0, 1, 2, …
    pub fn from_placements(
        layout: &MigLayout,
        placements: &[Placement],
    ) -> Result<Self, PlacementError> {
        let mut occ = Self::new();
        for (tag, pl) in (0u32..).zip(placements) {
            occ.place(layout, *pl, tag)?;
        }
        Ok(occ)
    }

    /// Used memory slices as a bit mask.
    pub fn memory_used(&self) -> u32 {
        self.memory
    }

    /// Used compute slices as a bit mask.
    pub fn compute_used(&self) -> u32 {
        self.compute
    }

    /// The instances on the GPU, in placement order.
    pub fn occupants(&self) -> &[Occupant] {
        &self.occupants
    }

    /// Whether no instance is placed.
    pub fn is_empty(&self) -> bool {
        self.occupants.is_empty()
    }

    /// Which occupant uses memory slice `slice`.
    pub fn memory_owner(&self, layout: &MigLayout, slice: u8) -> Option<&Occupant> {
        self.occupants.iter().find(|o| {
            layout
                .profile(o.placement.profile_id)
                .is_some_and(|p| memory_mask(p, o.placement.start) & (1 << slice) != 0)
        })
    }

    /// Checks whether `placement` can be added; the error says why not.
    pub fn check(&self, layout: &MigLayout, placement: Placement) -> Result<(), PlacementError> {
        let profile = layout
            .profile(placement.profile_id)
            .ok_or(PlacementError::UnknownProfile(placement.profile_id))?;
        let start = placement.start;
        if !profile.starts.contains(start)
            || u32::from(start) + u32::from(profile.memory_slices) > u32::from(layout.memory_slices)
        {
            return Err(PlacementError::InvalidStart {
                profile: profile.name.clone(),
                start,
                valid: profile.starts.iter().collect(),
            });
        }
        let mem = memory_mask(profile, start) & self.memory;
        if mem != 0 {
            return Err(PlacementError::MemoryInUse {
                profile: profile.name.clone(),
                start,
                slices: bits(mem),
            });
        }
        let cmp = compute_mask(profile, start) & self.compute;
        if cmp != 0 {
            return Err(PlacementError::ComputeInUse {
                profile: profile.name.clone(),
                start,
                slices: bits(cmp),
            });
        }
        if self.occupants.len() >= usize::from(layout.max_gpu_instances) {
            return Err(PlacementError::GpuInstanceLimit(layout.max_gpu_instances));
        }
        let same = self
            .occupants
            .iter()
            .filter(|o| o.placement.profile_id == profile.profile_id)
            .count();
        if same >= usize::from(profile.max_instances) {
            return Err(PlacementError::ProfileLimit {
                profile: profile.name.clone(),
                max: profile.max_instances,
            });
        }
        if profile.media_extension && self.media_extension_used(layout) {
            return Err(PlacementError::MediaEnginesTaken(profile.name.clone()));
        }
        Ok(())
    }

    fn media_extension_used(&self, layout: &MigLayout) -> bool {
        self.occupants.iter().any(|o| {
            layout
                .profile(o.placement.profile_id)
                .is_some_and(|p| p.media_extension)
        })
    }

    /// Whether `placement` can be added.
    pub fn can_place(&self, layout: &MigLayout, placement: Placement) -> bool {
        self.check(layout, placement).is_ok()
    }

    /// Every placement that can be added now, profiles in table order, starts ascending.
    pub fn feasible_placements(&self, layout: &MigLayout) -> Vec<Placement> {
        layout
            .all_placements()
            .map(|(p, start)| Placement {
                profile_id: p.profile_id,
                start,
            })
            .filter(|pl| self.can_place(layout, *pl))
            .collect()
    }

    /// The feasible starts of one profile, ascending.
    pub fn feasible_starts(&self, layout: &MigLayout, profile_id: u32) -> Vec<u8> {
        layout
            .profile(profile_id)
            .map(|p| {
                p.starts
                    .iter()
                    .filter(|s| {
                        self.can_place(
                            layout,
                            Placement {
                                profile_id,
                                start: *s,
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Adds an instance at `placement` identified by `tag`.
    pub fn place(
        &mut self,
        layout: &MigLayout,
        placement: Placement,
        tag: u32,
    ) -> Result<(), PlacementError> {
        if self.occupants.iter().any(|o| o.tag == tag) {
            return Err(PlacementError::DuplicateTag(tag));
        }
        self.check(layout, placement)?;
        let profile = layout
            .profile(placement.profile_id)
            .ok_or(PlacementError::UnknownProfile(placement.profile_id))?;
        self.memory |= memory_mask(profile, placement.start);
        self.compute |= compute_mask(profile, placement.start);
        self.occupants.push(Occupant { placement, tag });
        Ok(())
    }

    /// Removes the instance with `tag` and returns it.
    pub fn free(&mut self, layout: &MigLayout, tag: u32) -> Result<Occupant, PlacementError> {
        let pos = self
            .occupants
            .iter()
            .position(|o| o.tag == tag)
            .ok_or(PlacementError::UnknownTag(tag))?;
        let occ = self.occupants.remove(pos);
        self.recompute_masks(layout);
        Ok(occ)
    }

    fn recompute_masks(&mut self, layout: &MigLayout) {
        let (mut mem, mut cmp) = (0, 0);
        for o in &self.occupants {
            if let Some(p) = layout.profile(o.placement.profile_id) {
                mem |= memory_mask(p, o.placement.start);
                cmp |= compute_mask(p, o.placement.start);
            }
        }
        self.memory = mem;
        self.compute = cmp;
    }

    /// The largest profile that can still be placed somewhere (most memory slices, then
    /// most compute slices; a plain profile wins over its `+me` twin).
    pub fn largest_placeable<'l>(&self, layout: &'l MigLayout) -> Option<&'l MigProfile> {
        layout
            .profiles
            .iter()
            .filter(|p| !self.feasible_starts(layout, p.profile_id).is_empty())
            .max_by_key(|p| (p.memory_slices, p.compute_slices, !p.media_extension))
    }

    /// Used compute slices and memory slices, as counts.
    pub fn used_slices(&self) -> (u32, u32) {
        (self.compute.count_ones(), self.memory.count_ones())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::find_model;

    fn a100() -> MigLayout {
        find_model("a100-40gb").unwrap().mig.clone().unwrap()
    }

    fn pl(profile_id: u32, start: u8) -> Placement {
        Placement { profile_id, start }
    }

    #[test]
    fn a_3g_cannot_start_at_2() {
        let err = Occupancy::new().check(&a100(), pl(9, 2)).unwrap_err();
        assert!(
            matches!(err, PlacementError::InvalidStart { start: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn four_g_plus_three_g_fill_the_gpu_exactly() {
        let l = a100();
        let occ = Occupancy::from_placements(&l, &[pl(5, 0), pl(9, 4)]).unwrap();
        assert_eq!(occ.used_slices(), (7, 8));
        assert!(occ.feasible_placements(&l).is_empty());
        assert_eq!(occ.largest_placeable(&l), None);
    }

    #[test]
    fn seven_1g_instances_leave_memory_slice_7_stranded() {
        let l = a100();
        let pls: Vec<_> = (0..7).map(|s| pl(19, s)).collect();
        let occ = Occupancy::from_placements(&l, &pls).unwrap();
        assert_eq!(occ.used_slices(), (7, 7));
        assert!(occ.feasible_placements(&l).is_empty());
    }

    #[test]
    fn only_one_plus_me_instance_fits_on_a_gpu() {
        let l = a100();
        let occ = Occupancy::from_placements(&l, &[pl(20, 0)]).unwrap();
        assert_eq!(
            occ.check(&l, pl(20, 3)),
            Err(PlacementError::ProfileLimit {
                profile: "1g.5gb+me".into(),
                max: 1
            })
        );
    }

    #[test]
    fn a_3g_at_0_blocks_a_4g_and_a_2g_at_2() {
        let l = a100();
        let occ = Occupancy::from_placements(&l, &[pl(9, 0)]).unwrap();
        assert!(!occ.can_place(&l, pl(5, 0)));
        assert!(!occ.can_place(&l, pl(14, 2)));
        assert_eq!(occ.feasible_starts(&l, 14), vec![4]);
        assert_eq!(occ.largest_placeable(&l).unwrap().profile_id, 9);
    }

    #[test]
    fn freeing_an_instance_makes_its_slices_placeable_again() {
        let l = a100();
        let mut occ = Occupancy::from_placements(&l, &[pl(9, 0), pl(15, 6)]).unwrap();
        assert!(!occ.can_place(&l, pl(9, 4)));
        occ.free(&l, 1).unwrap();
        assert!(occ.can_place(&l, pl(9, 4)));
        assert_eq!(occ.free(&l, 7), Err(PlacementError::UnknownTag(7)));
    }

    #[test]
    fn an_overlap_names_the_conflicting_slices() {
        let l = a100();
        let occ = Occupancy::from_placements(&l, &[pl(15, 2)]).unwrap();
        let err = occ.check(&l, pl(19, 3)).unwrap_err();
        assert_eq!(
            err,
            PlacementError::MemoryInUse {
                profile: "1g.5gb".into(),
                start: 3,
                slices: vec![3]
            }
        );
    }
}
