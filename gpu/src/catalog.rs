//! The catalogue of GPU models Tessera knows, with their MIG profiles.
//!
//! The table is what the simulated backend enforces and what `kubectl tessera profiles`
//! prints. The NVML backend never relies on it: it reads profiles and placements from the
//! driver at run time ([`crate::backend::nvml`]). Profiles are keyed on the NVML profile
//! id and slice counts; names are marketing labels that change with board memory
//! (see `gpu-hardware.md` §1), so code must never map names by prefix.
//!
//! Sources for every figure are in `../shared/reference/gpu-hardware.md` §2 (from the repository root); a figure
//! not confirmed by a primary source or a real capture is marked "unverified" next to it.
//! The tables themselves are in the `models` submodule.

mod models;

use serde::{Deserialize, Serialize};

/// GPU architecture, as far as Tessera's behaviour depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// A100 / A30 / A10: MIG mode changes need a GPU reset.
    Ampere,
    /// L4.
    Ada,
    /// H100 / H200: MIG mode toggles without reset when the GPU is idle.
    Hopper,
    /// B200 and newer.
    Blackwell,
    /// Anything NVML reports that we do not model.
    Unknown,
}

impl Architecture {
    /// Whether a MIG mode change takes effect immediately (on an idle GPU) instead of
    /// staying pending until a GPU reset (`gpu-hardware.md` §4).
    pub fn mig_toggle_without_reset(self) -> bool {
        matches!(self, Architecture::Hopper | Architecture::Blackwell)
    }

    /// Lower-case name used in attributes and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Architecture::Ampere => "ampere",
            Architecture::Ada => "ada",
            Architecture::Hopper => "hopper",
            Architecture::Blackwell => "blackwell",
            Architecture::Unknown => "unknown",
        }
    }
}

/// Set of valid placement starts (memory-slice indices) as a bit mask: bit `i` = start `i`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "Vec<u8>", from = "Vec<u8>")]
pub struct StartSet(pub u32);

impl StartSet {
    /// Builds the set from a list of starts (starts ≥ 32 are ignored: no GPU has them).
    pub fn from_starts(starts: &[u8]) -> Self {
        StartSet(
            starts
                .iter()
                .filter(|s| **s < 32)
                .fold(0, |m, s| m | (1u32 << s)),
        )
    }

    /// Whether `start` is a valid start.
    pub fn contains(self, start: u8) -> bool {
        start < 32 && self.0 & (1u32 << start) != 0
    }

    /// The starts in ascending order.
    pub fn iter(self) -> impl Iterator<Item = u8> {
        (0u8..32).filter(move |s| self.contains(*s))
    }

    /// Number of valid starts.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether there is no valid start.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl From<StartSet> for Vec<u8> {
    fn from(s: StartSet) -> Self {
        s.iter().collect()
    }
}

impl From<Vec<u8>> for StartSet {
    fn from(v: Vec<u8>) -> Self {
        StartSet::from_starts(&v)
    }
}

/// Engines a GPU instance of a profile owns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Engines {
    /// Copy engines.
    pub copy: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG decoders.
    pub jpeg: u32,
    /// Optical-flow accelerators.
    pub ofa: u32,
}

/// One MIG GPU-instance profile of a GPU model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigProfile {
    /// Marketing name, e.g. `1g.10gb+me`. A label only.
    pub name: String,
    /// NVML `GpuInstanceProfileInfo.id` (the "ID" column of `nvidia-smi mig -lgip`).
    pub profile_id: u32,
    /// Compute slices (GPCs).
    pub compute_slices: u8,
    /// Memory slices; also the placement size.
    pub memory_slices: u8,
    /// Memory in MiB (NVML `memorySizeMB`).
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Maximum number of instances of this profile on one GPU.
    pub max_instances: u8,
    /// Valid placement starts.
    pub starts: StartSet,
    /// `+me`: the one instance per GPU that gets the media engines (REV1 profiles).
    pub media_extension: bool,
    /// Engines owned by one instance.
    pub engines: Engines,
}

/// The MIG geometry of a GPU model: slice counts and profiles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigLayout {
    /// Compute slices of the whole GPU (7 on A100/H100/H200).
    pub compute_slices: u8,
    /// Memory slices of the whole GPU (8 on A100/H100/H200).
    pub memory_slices: u8,
    /// Maximum number of GPU instances on one GPU.
    pub max_gpu_instances: u8,
    /// Profiles, in the order NVML lists them (smallest first).
    pub profiles: Vec<MigProfile>,
}

impl MigLayout {
    /// The profile with NVML profile id `id`.
    pub fn profile(&self, id: u32) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.profile_id == id)
    }

    /// The profile whose name is `name` (exact match; names are labels, never prefixes).
    pub fn profile_by_name(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Every (profile, start) pair the hardware could ever offer, profiles in table order.
    pub fn all_placements(&self) -> impl Iterator<Item = (&MigProfile, u8)> {
        self.profiles
            .iter()
            .flat_map(|p| p.starts.iter().map(move |s| (p, s)))
    }
}

/// A GPU model of the catalogue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuModel {
    /// Catalogue key, e.g. `h100-80gb`.
    pub id: String,
    /// Product names NVML reports for this model (`nvmlDeviceGetName`).
    pub product_names: Vec<String>,
    /// Architecture.
    pub architecture: Architecture,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Total framebuffer memory in MiB as NVML reports it.
    pub memory_mib: u64,
    /// SMs of the whole GPU with MIG off.
    pub sm_count: u32,
    /// MIG geometry, `None` for GPUs without MIG.
    pub mig: Option<MigLayout>,
}

/// Error for a model name the catalogue does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown GPU model {name:?}; known models: {}", known.join(", "))]
pub struct UnknownModel {
    /// The name asked for.
    pub name: String,
    /// Catalogue keys.
    pub known: Vec<String>,
}

/// All models of the catalogue.
pub fn catalog() -> &'static [GpuModel] {
    &models::CATALOG
}

/// Looks a model up by catalogue key (`a100-40gb`, case-insensitive) or by NVML product
/// name (`NVIDIA H200`, case-insensitive).
pub fn find_model(name: &str) -> Result<&'static GpuModel, UnknownModel> {
    let wanted = name.trim().to_ascii_lowercase();
    catalog()
        .iter()
        .find(|m| {
            m.id == wanted
                || m.product_names
                    .iter()
                    .any(|p| p.to_ascii_lowercase() == wanted)
        })
        .ok_or_else(|| UnknownModel {
            name: name.to_string(),
            known: catalog().iter().map(|m| m.id.clone()).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_found_by_key_and_by_nvml_product_name() {
        assert_eq!(find_model("a100-40gb").unwrap().id, "a100-40gb");
        assert_eq!(find_model("NVIDIA H200").unwrap().id, "h200-141gb");
        assert_eq!(find_model("nvidia h100 80gb hbm3").unwrap().id, "h100-80gb");
    }

    #[test]
    fn an_unknown_model_lists_the_known_ones() {
        let err = find_model("v100").unwrap_err();
        assert!(
            err.to_string()
                .contains("a100-40gb, a100-80gb, h100-80gb, h200-141gb")
        );
    }

    #[test]
    fn every_mig_model_has_the_seven_profile_ids_of_a_seven_slice_gpu() {
        for m in catalog().iter().filter(|m| m.mig.is_some()) {
            let ids: Vec<u32> = m
                .mig
                .as_ref()
                .unwrap()
                .profiles
                .iter()
                .map(|p| p.profile_id)
                .collect();
            assert_eq!(ids, vec![19, 20, 15, 14, 9, 5, 0], "{}", m.id);
        }
    }

    #[test]
    fn a100_40gb_profiles_match_the_reference_table() {
        let l = find_model("a100-40gb").unwrap().mig.clone().unwrap();
        let p = l.profile_by_name("1g.10gb").unwrap();
        assert_eq!(
            (
                p.profile_id,
                p.compute_slices,
                p.memory_slices,
                p.memory_mib
            ),
            (15, 1, 2, 9856)
        );
        assert_eq!(p.starts.iter().collect::<Vec<_>>(), vec![0, 2, 4, 6]);
        let p = l.profile(9).unwrap();
        assert_eq!(
            (p.name.as_str(), p.max_instances, p.sm_count),
            ("3g.20gb", 2, 42)
        );
        assert_eq!(p.starts.iter().collect::<Vec<_>>(), vec![0, 4]);
    }

    #[test]
    fn profile_names_are_unique_within_a_model() {
        for m in catalog().iter().filter_map(|m| m.mig.as_ref()) {
            let mut names: Vec<&str> = m.profiles.iter().map(|p| p.name.as_str()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), m.profiles.len());
        }
    }
}
