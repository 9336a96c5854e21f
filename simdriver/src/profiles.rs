//! NVML's profile *indices* (the `NVML_GPU_INSTANCE_PROFILE_*` and
//! `NVML_COMPUTE_INSTANCE_PROFILE_*` enums of nvml.h), which NVML's profile queries take,
//! for the catalogue's profiles, which are keyed by profile *id*.

use tessera_gpu::{MigLayout, MigProfile};

/// The `NVML_GPU_INSTANCE_PROFILE_*` index of `p`: by compute slices, with the name's
/// suffix choosing the variant (`+me`: REV1, `+gfx`, `-me`, `+me.all`), and a one-slice
/// profile with two memory slices being REV2 (`1g.20gb` on an H100).
pub fn gpu_instance_index(p: &MigProfile) -> Option<u32> {
    let suffix = p.name.find(['+', '-']).map(|i| &p.name[i..]).unwrap_or("");
    Some(match (suffix, p.compute_slices) {
        ("", 1) if p.memory_slices == 2 => 9,
        ("", 1) => 0,
        ("", 2) => 1,
        ("", 3) => 2,
        ("", 4) => 3,
        ("", 7) => 4,
        ("", 8) => 5,
        ("", 6) => 6,
        ("+me", 1) => 7,
        ("+me", 2) => 8,
        ("+gfx", 1) => 10,
        ("+gfx", 2) => 11,
        ("+gfx", 4) => 12,
        ("-me", 1) => 13,
        ("-me", 2) => 14,
        ("+me.all", 1) => 15,
        ("+me.all", 2) => 16,
        _ => return None,
    })
}

/// The profile of `layout` at NVML profile index `index`.
pub fn by_index(layout: &MigLayout, index: u32) -> Option<&MigProfile> {
    layout
        .profiles
        .iter()
        .find(|p| gpu_instance_index(p) == Some(index))
}

/// Compute slices of the `NVML_COMPUTE_INSTANCE_PROFILE_*` index (`1_SLICE` … `6_SLICE`;
/// the graphics-only `1_SLICE_REV1` is not simulated).
pub fn compute_slices_of_index(index: u32) -> Option<u8> {
    Some(match index {
        0 => 1,
        1 => 2,
        2 => 3,
        3 => 4,
        4 => 7,
        5 => 8,
        6 => 6,
        _ => return None,
    })
}

/// The compute-instance profile index spanning `slices` compute slices.
pub fn compute_index_of_slices(slices: u8) -> Option<u32> {
    (0..7).find(|i| compute_slices_of_index(*i) == Some(slices))
}

/// Whether a GPU instance of `gi_slices` compute slices offers compute instances of
/// `ci_slices` (`nvidia-smi mig -lcip`: a 7-slice instance splits 1, 2, 3, 4 or 7 ways;
/// smaller ones into 1 or 2 slices or whole).
pub fn compute_size_fits(gi_slices: u8, ci_slices: u8) -> bool {
    ci_slices == gi_slices
        || (ci_slices < gi_slices && matches!(ci_slices, 1 | 2))
        || (gi_slices >= 7 && matches!(ci_slices, 3 | 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogue_profile_has_one_distinct_index() {
        for model in tessera_gpu::catalog() {
            let Some(layout) = &model.mig else { continue };
            let mut seen = std::collections::BTreeSet::new();
            for p in &layout.profiles {
                let i = gpu_instance_index(p)
                    .unwrap_or_else(|| panic!("{}: {} has no index", model.id, p.name));
                assert!(seen.insert(i), "{}: index {i} twice", model.id);
                assert_eq!(by_index(layout, i), Some(p));
            }
        }
    }

    #[test]
    fn h100_indices_match_nvml_h() {
        let layout = tessera_gpu::find_model("h100-80gb")
            .expect("known")
            .mig
            .as_ref()
            .expect("MIG");
        let index = |name: &str| {
            gpu_instance_index(layout.profile_by_name(name).expect("profile")).expect("index")
        };
        assert_eq!(index("1g.10gb"), 0);
        assert_eq!(index("1g.10gb+me"), 7);
        assert_eq!(index("1g.20gb"), 9);
        assert_eq!(index("2g.20gb"), 1);
        assert_eq!(index("3g.40gb"), 2);
        assert_eq!(index("4g.40gb"), 3);
        assert_eq!(index("7g.80gb"), 4);
    }

    #[test]
    fn compute_profiles_follow_the_gpu_instance_size() {
        assert!(compute_size_fits(7, 3));
        assert!(compute_size_fits(4, 2));
        assert!(!compute_size_fits(4, 3));
        assert!(!compute_size_fits(2, 3));
        assert_eq!(compute_index_of_slices(7), Some(4));
        assert_eq!(compute_index_of_slices(5), None);
    }
}
