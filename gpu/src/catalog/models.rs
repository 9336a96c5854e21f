//! The catalogue's data: the MIG profile tables of every model and the [`CATALOG`] they
//! make up. Sources for every figure are in `../shared/reference/gpu-hardware.md` §2 (from
//! the repository root).
//!
//! Each model has its own table, one profile per line, in the column order of the tables
//! in §2, so that a person can check it against the doc line by line. The tables are
//! exempt from rustfmt, which would undo the column alignment.

use std::sync::LazyLock;

use super::{Architecture, Engines, GpuModel, MigLayout, MigProfile, StartSet};

/// One line of a profile table. The columns are §2's, in its order, plus `+me`, which
/// the doc carries in the profile name:
///
/// | column | field |
/// |---|---|
/// | profile | [`MigProfile::name`] |
/// | GI | [`MigProfile::profile_id`] |
/// | C | [`MigProfile::compute_slices`] |
/// | M | [`MigProfile::memory_slices`] (also the placement size) |
/// | memory | [`MigProfile::memory_mib`], in MiB |
/// | SMs | [`MigProfile::sm_count`] |
/// | CE / DEC / JPEG / OFA | [`MigProfile::engines`] |
/// | max | [`MigProfile::max_instances`] |
/// | starts | [`MigProfile::starts`] |
/// | +me | [`MigProfile::media_extension`] |
type Row = (
    &'static str,
    u32,
    u8,
    u8,
    u64,
    u32,
    [u32; 4],
    u8,
    &'static [u8],
    bool,
);

/// A100-40GB (§2.1). Memory per profile: KEP-4815 table and MIG User Guide; placements
/// from the go-nvml A100 mock.
#[rustfmt::skip]
const A100_40GB: &[Row] = &[
    // profile      GI  C  M  memory  SMs  CE/DEC/JPEG/OFA  max  starts                   +me
    ("1g.5gb",      19, 1, 1,   4864,  14, [1, 0, 0, 0],      7, &[0, 1, 2, 3, 4, 5, 6], false),
    ("1g.5gb+me",   20, 1, 1,   4864,  14, [1, 1, 1, 1],      1, &[0, 1, 2, 3, 4, 5, 6], true),
    ("1g.10gb",     15, 1, 2,   9856,  14, [1, 1, 0, 0],      4, &[0, 2, 4, 6],          false),
    ("2g.10gb",     14, 2, 2,   9856,  28, [2, 1, 0, 0],      3, &[0, 2, 4],             false),
    ("3g.20gb",      9, 3, 4,  19968,  42, [3, 2, 0, 0],      2, &[0, 4],                false),
    ("4g.20gb",      5, 4, 4,  19968,  56, [4, 2, 0, 0],      1, &[0],                   false),
    ("7g.40gb",      0, 7, 8,  40192,  98, [7, 5, 1, 1],      1, &[0],                   false),
];

/// A100-80GB (§2.2): A100-40GB's geometry, ids, SMs, engines and placements (MIG User
/// Guide) with its own names; memory per profile from the go-nvml mock only (unverified).
#[rustfmt::skip]
const A100_80GB: &[Row] = &[
    // profile      GI  C  M  memory  SMs  CE/DEC/JPEG/OFA  max  starts                   +me
    ("1g.10gb",     19, 1, 1,   9856,  14, [1, 0, 0, 0],      7, &[0, 1, 2, 3, 4, 5, 6], false),
    ("1g.10gb+me",  20, 1, 1,   9856,  14, [1, 1, 1, 1],      1, &[0, 1, 2, 3, 4, 5, 6], true),
    ("1g.20gb",     15, 1, 2,  19968,  14, [1, 1, 0, 0],      4, &[0, 2, 4, 6],          false),
    ("2g.20gb",     14, 2, 2,  19968,  28, [2, 1, 0, 0],      3, &[0, 2, 4],             false),
    ("3g.40gb",      9, 3, 4,  40192,  42, [3, 2, 0, 0],      2, &[0, 4],                false),
    ("4g.40gb",      5, 4, 4,  40192,  56, [4, 2, 0, 0],      1, &[0],                   false),
    ("7g.80gb",      0, 7, 8,  80384,  98, [7, 5, 1, 1],      1, &[0],                   false),
];

/// H100-80GB (§2.3), from a real `nvidia-smi mig -lgip` capture (jbarrow.ai). The MiB
/// are derived from its GiB column (exact MiB unverified); placements confirmed in part
/// by `-lgi` captures (DCGM#138, NDRA#933).
#[rustfmt::skip]
const H100_80GB: &[Row] = &[
    // profile      GI  C  M  memory  SMs  CE/DEC/JPEG/OFA  max  starts                   +me
    ("1g.10gb",     19, 1, 1,   9984,  16, [1, 1, 1, 0],      7, &[0, 1, 2, 3, 4, 5, 6], false),
    ("1g.10gb+me",  20, 1, 1,   9984,  16, [1, 1, 1, 1],      1, &[0, 1, 2, 3, 4, 5, 6], true),
    ("1g.20gb",     15, 1, 2,  20096,  26, [1, 1, 1, 0],      4, &[0, 2, 4, 6],          false),
    ("2g.20gb",     14, 2, 2,  20096,  32, [2, 2, 2, 0],      3, &[0, 2, 4],             false),
    ("3g.40gb",      9, 3, 4,  40448,  60, [3, 3, 3, 0],      2, &[0, 4],                false),
    ("4g.40gb",      5, 4, 4,  40448,  64, [4, 4, 4, 0],      1, &[0],                   false),
    ("7g.80gb",      0, 7, 8,  81152, 132, [8, 7, 7, 1],      1, &[0],                   false),
];

/// H200-141GB (§2.4). Verified on a real H200, driver 580.159.04
/// (docs/hardware/h200-nvidia-smi-2026-11-29.txt): profile ids, SMs, engines, placements
/// and memory; the MiB are NVML `memorySizeMB` as our NVML backend read it on that H200
/// the same day (gpu/tests/data/h200-nvml-profiles-2026-11-29.json, checked by
/// `tests/h200_capture.rs`). Where §2.4's older capture differs, this one wins.
#[rustfmt::skip]
const H200_141GB: &[Row] = &[
    // profile      GI  C  M  memory  SMs  CE/DEC/JPEG/OFA  max  starts                   +me
    ("1g.18gb",     19, 1, 1,  16384,  16, [1, 1, 1, 0],      7, &[0, 1, 2, 3, 4, 5, 6], false),
    ("1g.18gb+me",  20, 1, 1,  16384,  16, [1, 1, 1, 1],      1, &[0, 1, 2, 3, 4, 5, 6], true),
    ("1g.35gb",     15, 1, 2,  33280,  26, [1, 1, 1, 0],      4, &[0, 2, 4, 6],          false),
    ("2g.35gb",     14, 2, 2,  33280,  32, [2, 2, 2, 0],      3, &[0, 2, 4],             false),
    ("3g.71gb",      9, 3, 4,  71424,  60, [3, 3, 3, 0],      2, &[0, 4],                false),
    ("4g.71gb",      5, 4, 4,  71424,  64, [4, 4, 4, 0],      1, &[0],                   false),
    ("7g.141gb",     0, 7, 8, 143360, 132, [8, 7, 7, 1],      1, &[0],                   false),
];

fn profile(row: &Row) -> MigProfile {
    let &(
        name,
        profile_id,
        compute_slices,
        memory_slices,
        memory_mib,
        sm_count,
        [copy, decoders, jpeg, ofa],
        max_instances,
        starts,
        media_extension,
    ) = row;
    MigProfile {
        name: name.to_string(),
        profile_id,
        compute_slices,
        memory_slices,
        memory_mib,
        sm_count,
        max_instances,
        starts: StartSet::from_starts(starts),
        media_extension,
        // No profile of these models has an encoder (the H100/H200 captures show none;
        // the A100 tables list none), hence no column for them.
        engines: Engines {
            copy,
            decoders,
            encoders: 0,
            jpeg,
            ofa,
        },
    }
}

/// The layout of a GPU with 7 compute and 8 memory slices (A100, H100, H200; §3).
fn seven_slice(table: &[Row]) -> MigLayout {
    MigLayout {
        compute_slices: 7,
        memory_slices: 8,
        max_gpu_instances: 7,
        profiles: table.iter().map(profile).collect(),
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

pub(super) static CATALOG: LazyLock<Vec<GpuModel>> = LazyLock::new(|| {
    vec![
        GpuModel {
            id: "a100-40gb".into(),
            product_names: names(&["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"]),
            architecture: Architecture::Ampere,
            compute_capability: (8, 0),
            // Nominal 40 GiB (NVML's exact total unverified).
            memory_mib: 40960,
            sm_count: 108,
            mig: Some(seven_slice(A100_40GB)),
        },
        GpuModel {
            id: "a100-80gb".into(),
            product_names: names(&["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"]),
            architecture: Architecture::Ampere,
            compute_capability: (8, 0),
            // Nominal 80 GiB (NVML's exact total unverified).
            memory_mib: 81920,
            sm_count: 108,
            mig: Some(seven_slice(A100_80GB)),
        },
        GpuModel {
            id: "h100-80gb".into(),
            // PCIe boards report other SM counts; read them from NVML.
            product_names: names(&["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"]),
            architecture: Architecture::Hopper,
            compute_capability: (9, 0),
            // As nvidia-smi commonly reports an H100 80GB HBM3 (unverified on our hardware).
            memory_mib: 81559,
            sm_count: 132,
            mig: Some(seven_slice(H100_80GB)),
        },
        GpuModel {
            id: "h200-141gb".into(),
            product_names: names(&["NVIDIA H200", "NVIDIA H200 NVL"]),
            architecture: Architecture::Hopper,
            compute_capability: (9, 0),
            // Verified: docs/hardware/h200-nvidia-smi-2026-11-29.txt.
            memory_mib: 143771,
            sm_count: 132,
            mig: Some(seven_slice(H200_141GB)),
        },
        GpuModel {
            id: "l4".into(),
            product_names: names(&["NVIDIA L4"]),
            architecture: Architecture::Ada,
            compute_capability: (8, 9),
            // As commonly reported by nvidia-smi on L4 (unverified).
            memory_mib: 23034,
            sm_count: 58,
            mig: None,
        },
        GpuModel {
            id: "a10".into(),
            product_names: names(&["NVIDIA A10"]),
            architecture: Architecture::Ampere,
            compute_capability: (8, 6),
            // As commonly reported by nvidia-smi on A10 (unverified).
            memory_mib: 23028,
            sm_count: 72,
            mig: None,
        },
    ]
});

#[cfg(test)]
mod tests {
    use super::*;

    /// A row without the columns that differ between boards of one die (name, memory).
    fn geometry(row: &Row) -> (u32, u8, u8, u32, [u32; 4], u8, &'static [u8], bool) {
        let &(_, gi, c, m, _, sms, engines, max, starts, me) = row;
        (gi, c, m, sms, engines, max, starts, me)
    }

    #[test]
    fn boards_of_one_die_share_everything_but_names_and_memory() {
        // §2.2: A100-80GB = A100-40GB but for names and memory; §2.4: H200 is expected
        // to equal H100 (same GH100 die).
        for (a, b) in [(A100_40GB, A100_80GB), (H100_80GB, H200_141GB)] {
            let ga: Vec<_> = a.iter().map(geometry).collect();
            let gb: Vec<_> = b.iter().map(geometry).collect();
            assert_eq!(ga, gb);
        }
    }

    #[test]
    fn only_the_media_extension_profiles_are_named_plus_me() {
        for table in [A100_40GB, A100_80GB, H100_80GB, H200_141GB] {
            for row in table {
                assert_eq!(row.0.ends_with("+me"), row.9, "{}", row.0);
            }
        }
    }
}
