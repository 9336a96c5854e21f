//! The inventory file of a simulated node (YAML).
//!
//! ```yaml
//! gpus:
//!   - model: h100-80gb
//!   - model: h100-80gb
//!     migEnabled: true
//!     instances:
//!       - {profile: 3g.40gb, start: 4}
//!   - model: a100-40gb
//!     resettable: false      # like a cloud VM: MIG mode stays pending forever
//!   - model: l4
//! latencies: zero            # or default, or {createGpuInstanceMs: 10, ...}
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::faults::SimLatencies;

/// A simulated node's hardware.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    /// GPUs in index order.
    pub gpus: Vec<InventoryGpu>,
    /// Operation latencies; the reference defaults when absent.
    #[serde(default)]
    pub latencies: Option<LatencySpec>,
}

/// One GPU of the inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InventoryGpu {
    /// Catalogue key or NVML product name.
    pub model: String,
    /// Fixed UUID (`GPU-…`); random when absent.
    #[serde(default)]
    pub uuid: Option<String>,
    /// MIG mode at boot.
    #[serde(default)]
    pub mig_enabled: bool,
    /// Whether the node can reset this GPU (cloud VMs often cannot).
    #[serde(default = "yes")]
    pub resettable: bool,
    /// MIG instances present at boot (each with one full compute instance).
    #[serde(default)]
    pub instances: Vec<InventoryInstance>,
}

fn yes() -> bool {
    true
}

/// A MIG instance present at boot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InventoryInstance {
    /// Profile name (exact) or NVML profile id as a string.
    pub profile: String,
    /// Placement start.
    pub start: u8,
}

/// Latencies in the inventory: a preset or explicit milliseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LatencySpec {
    /// `zero` or `default`.
    Preset(LatencyPreset),
    /// Explicit values; missing ones take the defaults.
    Explicit(SimLatencies),
}

/// Latency presets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatencyPreset {
    /// No delays (tests).
    Zero,
    /// The reference numbers.
    Default,
}

impl LatencySpec {
    /// The latencies this spec means.
    pub fn resolve(&self) -> SimLatencies {
        match self {
            LatencySpec::Preset(LatencyPreset::Zero) => SimLatencies::zero(),
            LatencySpec::Preset(LatencyPreset::Default) => SimLatencies::default(),
            LatencySpec::Explicit(l) => l.clone(),
        }
    }
}

/// Errors reading an inventory.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// File could not be read.
    #[error("reading inventory {path}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// YAML is malformed.
    #[error("parsing inventory")]
    Parse(#[from] serde_yaml::Error),
}

impl Inventory {
    /// Parses inventory YAML.
    pub fn from_yaml(text: &str) -> Result<Self, InventoryError> {
        Ok(serde_yaml::from_str(text)?)
    }

    /// Reads an inventory file.
    pub fn from_file(path: &Path) -> Result<Self, InventoryError> {
        let text = std::fs::read_to_string(path).map_err(|source| InventoryError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let inv = Inventory::from_yaml(
            "gpus: [{model: h100-80gb}, {model: h100-80gb, migEnabled: true, instances: [{profile: 3g.40gb, start: 4}]}, {model: l4}]\nlatencies: zero\n",
        )
        .unwrap();
        assert_eq!(inv.gpus.len(), 3);
        assert!(inv.gpus[1].mig_enabled && inv.gpus[0].resettable);
        assert_eq!(inv.gpus[1].instances[0].start, 4);
        assert_eq!(inv.latencies.unwrap().resolve(), SimLatencies::zero());
    }

    #[test]
    fn explicit_latencies_fill_missing_fields_with_defaults() {
        let inv = Inventory::from_yaml("gpus: []\nlatencies: {createGpuInstanceMs: 5}\n").unwrap();
        let l = inv.latencies.unwrap().resolve();
        assert_eq!(l.create_gpu_instance_ms, 5);
        assert_eq!(
            l.destroy_gpu_instance_ms,
            SimLatencies::default().destroy_gpu_instance_ms
        );
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(Inventory::from_yaml("gpus: [{modle: l4}]").is_err());
    }
}
