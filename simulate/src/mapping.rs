//! From a trace's GPU share to what a claim asks of Tessera: a MIG profile or an MPS
//! share. openb gives no GPU memory per pod and no MIG hardware, so the share
//! (`gpu_milli`) is read as a share of both compute and memory of the modelled GPU.
//!
//! - MIG: the smallest profile (fewest compute slices, then fewest memory slices; `+me`
//!   profiles left out, they are the same slices with the media engines) whose compute
//!   *and* memory fractions both cover the share. On a 7/8-slice GPU whichever of the two
//!   is scarcer decides: `1g` single-memory up to 1/8, `1g` double-memory up to 1/7,
//!   `2g` up to 2/8, `3g` up to 3/7, `4g` up to 4/8, the whole-GPU profile above (the
//!   test below pins the edges).
//! - MPS: `computePercent` = ⌈share / 10⌉ and memory = ⌈share × M / 1000⌉ MiB, where M is
//!   the memory the plugin's MPS device advertises; the scheduler rounds the memory up to
//!   the device's request policy.

use serde::Serialize;
use tessera_gpu::catalog::{MigLayout, MigProfile};

use crate::workload::WHOLE_GPU_MILLI;

/// The MIG profile that covers `milli` of a GPU with `layout`, `None` for a share of 0 or
/// above 1000.
pub fn mig_profile(layout: &MigLayout, milli: u32) -> Option<&MigProfile> {
    if milli == 0 || milli > WHOLE_GPU_MILLI {
        return None;
    }
    let covers = |slices: u8, total: u8| {
        u64::from(slices) * u64::from(WHOLE_GPU_MILLI) >= u64::from(milli) * u64::from(total)
    };
    layout
        .profiles
        .iter()
        .filter(|p| !p.media_extension)
        .filter(|p| {
            covers(p.compute_slices, layout.compute_slices)
                && covers(p.memory_slices, layout.memory_slices)
        })
        .min_by_key(|p| (p.compute_slices, p.memory_slices, p.profile_id))
}

/// An MPS share: what a claim requests of the MPS device's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsShare {
    /// `computePercent` requested (1–100).
    pub compute_percent: u32,
    /// Memory requested in MiB.
    pub memory_mib: u64,
}

/// The MPS share for `milli` of a GPU whose MPS device advertises `device_memory_mib`.
pub fn mps_share(milli: u32, device_memory_mib: u64) -> MpsShare {
    let milli = milli.clamp(1, WHOLE_GPU_MILLI);
    MpsShare {
        compute_percent: milli.div_ceil(10),
        memory_mib: (u64::from(milli) * device_memory_mib).div_ceil(u64::from(WHOLE_GPU_MILLI)),
    }
}

/// Compute given to a pod beyond its share when it runs in `profile`, in milli-GPU.
pub fn mig_waste(layout: &MigLayout, profile: &MigProfile, milli: u32) -> u32 {
    let given = u32::from(profile.compute_slices) * WHOLE_GPU_MILLI
        / u32::from(layout.compute_slices.max(1));
    given.saturating_sub(milli)
}

/// One row of the mapping table in the report: the shares that map to a profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MappingRow {
    /// Smallest share of the range, milli-GPU.
    pub from_milli: u32,
    /// Largest share of the range, milli-GPU.
    pub to_milli: u32,
    /// The MIG profile.
    pub profile: String,
}

/// The mapping from share to profile as ranges, for the report.
pub fn mapping_table(layout: &MigLayout) -> Vec<MappingRow> {
    let mut rows: Vec<MappingRow> = Vec::new();
    for milli in 1..=WHOLE_GPU_MILLI {
        let Some(p) = mig_profile(layout, milli) else {
            continue;
        };
        match rows.last_mut() {
            Some(r) if r.profile == p.name => r.to_milli = milli,
            _ => rows.push(MappingRow {
                from_milli: milli,
                to_milli: milli,
                profile: p.name.clone(),
            }),
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gpu::find_model;

    fn h100() -> &'static MigLayout {
        find_model("h100-80gb").unwrap().mig.as_ref().unwrap()
    }

    fn name(milli: u32) -> &'static str {
        mig_profile(h100(), milli).unwrap().name.as_str()
    }

    #[test]
    fn a_share_maps_to_the_smallest_profile_covering_compute_and_memory() {
        // 1/8 of the memory is 125 milli: a 1g.10gb holds it, 126 needs the 1g.20gb.
        assert_eq!(name(125), "1g.10gb");
        assert_eq!(name(126), "1g.20gb");
        // 1/7 of the compute is 142.86 milli.
        assert_eq!(name(142), "1g.20gb");
        assert_eq!(name(143), "2g.20gb");
        // 2/8 of the memory, 3/7 of the compute, 4/8 of the memory.
        assert_eq!((name(250), name(251)), ("2g.20gb", "3g.40gb"));
        assert_eq!((name(428), name(429)), ("3g.40gb", "4g.40gb"));
        assert_eq!((name(500), name(501)), ("4g.40gb", "7g.80gb"));
        assert_eq!(name(1000), "7g.80gb");
        assert!(mig_profile(h100(), 0).is_none() && mig_profile(h100(), 1001).is_none());
    }

    #[test]
    fn the_table_covers_every_share_once_in_order() {
        let rows = mapping_table(h100());
        assert_eq!(rows.first().unwrap().from_milli, 1);
        assert_eq!(rows.last().unwrap().to_milli, 1000);
        for w in rows.windows(2) {
            assert_eq!(w[0].to_milli + 1, w[1].from_milli);
        }
        let names: Vec<&str> = rows.iter().map(|r| r.profile.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"
            ]
        );
    }

    #[test]
    fn an_mps_share_rounds_compute_and_memory_up() {
        assert_eq!(
            mps_share(465, 81408),
            MpsShare {
                compute_percent: 47,
                memory_mib: 37855
            }
        );
        assert_eq!(mps_share(1000, 81408).memory_mib, 81408);
        assert_eq!(mps_share(1, 81408).compute_percent, 1);
    }

    #[test]
    fn waste_is_compute_given_beyond_the_share() {
        let l = h100();
        let p = mig_profile(l, 470).unwrap();
        assert_eq!(mig_waste(l, p, 470), 571 - 470);
        let p = mig_profile(l, 1000).unwrap();
        assert_eq!(mig_waste(l, p, 1000), 0);
    }
}
