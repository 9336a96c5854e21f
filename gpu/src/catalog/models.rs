//! The catalogue's data: the MIG profile tables of every model and the [`CATALOG`] they
//! make up. Sources for every figure are in `/work/shared/reference/gpu-hardware.md` §2.

use std::sync::LazyLock;

use super::{Architecture, Engines, GpuModel, MigLayout, MigProfile, StartSet};

/// Shorthand for a table row: name, id, compute slices, memory slices, MiB, SMs, max,
/// starts, +me, engines (CE, DEC, JPEG, OFA).
#[allow(clippy::too_many_arguments)]
fn p(
    name: &str,
    profile_id: u32,
    compute_slices: u8,
    memory_slices: u8,
    memory_mib: u64,
    sm_count: u32,
    max_instances: u8,
    starts: &[u8],
    media_extension: bool,
    (copy, decoders, jpeg, ofa): (u32, u32, u32, u32),
) -> MigProfile {
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
        // No profile of these models has an encoder (H100/H200 captures show ENC 0; the
        // A100 tables list none).
        engines: Engines {
            copy,
            decoders,
            encoders: 0,
            jpeg,
            ofa,
        },
    }
}

const ONE_SLICE: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const TWO_SLICE_1G: &[u8] = &[0, 2, 4, 6];
const TWO_SLICE_2G: &[u8] = &[0, 2, 4];
const FOUR_SLICE_3G: &[u8] = &[0, 4];
const AT_ZERO: &[u8] = &[0];

fn seven_slice(profiles: Vec<MigProfile>) -> MigLayout {
    MigLayout {
        compute_slices: 7,
        memory_slices: 8,
        max_gpu_instances: 7,
        profiles,
    }
}

/// A100 profiles: geometry, ids, SMs and engines are identical on 40 GB and 80 GB boards
/// (MIG User Guide; KEP-4815 table; go-nvml A100 mock for placements).
fn a100(names: [&str; 7], mib: [u64; 7]) -> MigLayout {
    seven_slice(vec![
        p(
            names[0],
            19,
            1,
            1,
            mib[0],
            14,
            7,
            ONE_SLICE,
            false,
            (1, 0, 0, 0),
        ),
        p(
            names[1],
            20,
            1,
            1,
            mib[1],
            14,
            1,
            ONE_SLICE,
            true,
            (1, 1, 1, 1),
        ),
        p(
            names[2],
            15,
            1,
            2,
            mib[2],
            14,
            4,
            TWO_SLICE_1G,
            false,
            (1, 1, 0, 0),
        ),
        p(
            names[3],
            14,
            2,
            2,
            mib[3],
            28,
            3,
            TWO_SLICE_2G,
            false,
            (2, 1, 0, 0),
        ),
        p(
            names[4],
            9,
            3,
            4,
            mib[4],
            42,
            2,
            FOUR_SLICE_3G,
            false,
            (3, 2, 0, 0),
        ),
        p(
            names[5],
            5,
            4,
            4,
            mib[5],
            56,
            1,
            AT_ZERO,
            false,
            (4, 2, 0, 0),
        ),
        p(
            names[6],
            0,
            7,
            8,
            mib[6],
            98,
            1,
            AT_ZERO,
            false,
            (7, 5, 1, 1),
        ),
    ])
}

/// GH100 profiles (H100 / H200): same geometry as A100, more SMs and engines.
fn gh100(names: [&str; 7], mib: [u64; 7]) -> MigLayout {
    seven_slice(vec![
        p(
            names[0],
            19,
            1,
            1,
            mib[0],
            16,
            7,
            ONE_SLICE,
            false,
            (1, 1, 1, 0),
        ),
        p(
            names[1],
            20,
            1,
            1,
            mib[1],
            16,
            1,
            ONE_SLICE,
            true,
            (1, 1, 1, 1),
        ),
        p(
            names[2],
            15,
            1,
            2,
            mib[2],
            26,
            4,
            TWO_SLICE_1G,
            false,
            (1, 1, 1, 0),
        ),
        p(
            names[3],
            14,
            2,
            2,
            mib[3],
            32,
            3,
            TWO_SLICE_2G,
            false,
            (2, 2, 2, 0),
        ),
        p(
            names[4],
            9,
            3,
            4,
            mib[4],
            60,
            2,
            FOUR_SLICE_3G,
            false,
            (3, 3, 3, 0),
        ),
        p(
            names[5],
            5,
            4,
            4,
            mib[5],
            64,
            1,
            AT_ZERO,
            false,
            (4, 4, 4, 0),
        ),
        p(
            names[6],
            0,
            7,
            8,
            mib[6],
            132,
            1,
            AT_ZERO,
            false,
            (8, 7, 7, 1),
        ),
    ])
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
            // Memory per profile: KEP-4815 table and MIG User Guide.
            mig: Some(a100(
                [
                    "1g.5gb",
                    "1g.5gb+me",
                    "1g.10gb",
                    "2g.10gb",
                    "3g.20gb",
                    "4g.20gb",
                    "7g.40gb",
                ],
                [4864, 4864, 9856, 9856, 19968, 19968, 40192],
            )),
        },
        GpuModel {
            id: "a100-80gb".into(),
            product_names: names(&["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"]),
            architecture: Architecture::Ampere,
            compute_capability: (8, 0),
            // Nominal 80 GiB (NVML's exact total unverified).
            memory_mib: 81920,
            sm_count: 108,
            // Memory per profile from the go-nvml mock only (unverified); geometry as A100-40GB.
            mig: Some(a100(
                [
                    "1g.10gb",
                    "1g.10gb+me",
                    "1g.20gb",
                    "2g.20gb",
                    "3g.40gb",
                    "4g.40gb",
                    "7g.80gb",
                ],
                [9856, 9856, 19968, 19968, 40192, 40192, 80384],
            )),
        },
        GpuModel {
            id: "h100-80gb".into(),
            // PCIe boards report other SM counts (114); read them from NVML.
            product_names: names(&["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"]),
            architecture: Architecture::Hopper,
            compute_capability: (9, 0),
            // As nvidia-smi commonly reports an H100 80GB HBM3 (unverified on our hardware).
            memory_mib: 81559,
            sm_count: 132,
            // Profiles from a real `nvidia-smi mig -lgip` capture (jbarrow.ai); MiB derived
            // from its GiB column (9.75 / 19.62 / 39.50 / 79.25), exact MiB unverified.
            // Placements confirmed in part by `-lgi` captures (DCGM#138, NDRA#933).
            mig: Some(gh100(
                [
                    "1g.10gb",
                    "1g.10gb+me",
                    "1g.20gb",
                    "2g.20gb",
                    "3g.40gb",
                    "4g.40gb",
                    "7g.80gb",
                ],
                [9984, 9984, 20096, 20096, 40448, 40448, 81152],
            )),
        },
        GpuModel {
            id: "h200-141gb".into(),
            product_names: names(&["NVIDIA H200", "NVIDIA H200 NVL"]),
            architecture: Architecture::Hopper,
            compute_capability: (9, 0),
            // Verified: docs/hardware/h200-nvidia-smi-2026-11-29.txt (143771 MiB, CC 9.0).
            memory_mib: 143771,
            sm_count: 132,
            // Verified on a real H200, driver 580.159.04
            // (docs/hardware/h200-nvidia-smi-2026-11-29.txt): profile ids, SMs, engines,
            // placements {0..6}:1 (19, 20), {0,2,4,6}:2 (15), {0,2,4}:2 (14), {0,4}:4 (9),
            // {0}:4 (5), {0}:8 (0), and memory 16.00 / 32.50 / 69.75 / 140.00 GiB. The MiB
            // values are verified too: NVML `memorySizeMB` read by our NVML backend on that
            // H200 the same day (gpu/tests/data/h200-nvml-profiles-2026-11-29.json).
            mig: Some(gh100(
                [
                    "1g.18gb",
                    "1g.18gb+me",
                    "1g.35gb",
                    "2g.35gb",
                    "3g.71gb",
                    "4g.71gb",
                    "7g.141gb",
                ],
                [16384, 16384, 33280, 33280, 71424, 71424, 143360],
            )),
        },
        GpuModel {
            id: "l4".into(),
            product_names: names(&["NVIDIA L4"]),
            architecture: Architecture::Ada,
            compute_capability: (8, 9),
            // 23034 MiB as commonly reported by nvidia-smi on L4 (unverified).
            memory_mib: 23034,
            sm_count: 58,
            mig: None,
        },
        GpuModel {
            id: "a10".into(),
            product_names: names(&["NVIDIA A10"]),
            architecture: Architecture::Ampere,
            compute_capability: (8, 6),
            // 23028 MiB as commonly reported by nvidia-smi on A10 (unverified).
            memory_mib: 23028,
            sm_count: 72,
            mig: None,
        },
    ]
});
