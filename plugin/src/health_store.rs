//! GPU faults outlive the plugin process: `<state-dir>/gpu-health.json`.
//!
//! A fatal XID or a lost GPU is reported once, as an event; a plugin that restarts after it
//! would otherwise offer the GPU again, untainted and Ready. So each fault is recorded with
//! the GPU's UUID and the node's boot ID, and loaded at start-up.
//!
//! A record is cleared only by evidence that the GPU recovered: the node rebooted (a reboot
//! resets every GPU; one still broken faults again or fails to be read), or the GPU at
//! that index has another UUID (it was replaced). An admin who repaired a GPU without a
//! reboot deletes the file and restarts the plugin.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};
use tessera_gpu::backend::GpuInfo;

pub use crate::record_file::Error;
use crate::{record_file::RecordFile, status::GpuHealthState};

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The boot the faults were seen in.
    boot_id: Option<String>,
    /// Faulty GPUs by UUID.
    gpus: BTreeMap<String, Fault>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Fault {
    index: u32,
    message: String,
}

/// The record of faulty GPUs of one node.
#[derive(Clone, Debug)]
pub struct HealthStore {
    file: RecordFile,
    boot_id: Option<String>,
}

impl HealthStore {
    /// The record at `path`, for the boot `boot_id` (`None`: unknown, records never void).
    pub fn new(path: impl Into<PathBuf>, boot_id: Option<String>) -> Self {
        Self {
            file: RecordFile::new(path.into(), "GPU faults"),
            boot_id,
        }
    }

    /// The faults recorded in this boot for GPUs that are still the same hardware.
    pub fn load(&self, gpus: &[GpuInfo]) -> Result<BTreeMap<u32, GpuHealthState>, Error> {
        let Some(record) = self.file.read::<Record>()? else {
            return Ok(BTreeMap::new());
        };
        if self.boot_id.is_some() && record.boot_id != self.boot_id {
            tracing::info!(path = %self.file.path().display(), "the node rebooted since the recorded GPU faults; they are cleared");
            return Ok(BTreeMap::new());
        }
        Ok(current_faults(&record, gpus))
    }

    /// Records the unhealthy GPUs of `health`; writes only when the content changes.
    pub fn save(
        &self,
        health: &BTreeMap<u32, GpuHealthState>,
        gpus: &[GpuInfo],
    ) -> Result<(), Error> {
        let record = Record {
            boot_id: self.boot_id.clone(),
            gpus: health
                .iter()
                .filter(|(_, h)| !h.healthy)
                .filter_map(|(index, h)| {
                    let gpu = gpus.iter().find(|g| g.index == *index)?;
                    Some((
                        gpu.uuid.clone(),
                        Fault {
                            index: *index,
                            message: h.message.clone().unwrap_or_default(),
                        },
                    ))
                })
                .collect(),
        };
        self.file.write(&record)
    }
}

/// The faults whose GPU is still at its index with the same UUID.
fn current_faults(record: &Record, gpus: &[GpuInfo]) -> BTreeMap<u32, GpuHealthState> {
    record
        .gpus
        .iter()
        .filter_map(|(uuid, fault)| {
            // A GPU that cannot be read at all is no proof that it was replaced.
            let same = gpus.iter().any(|g| {
                g.index == fault.index && (&g.uuid == uuid || g.is_unreadable())
            });
            if !same {
                tracing::info!(gpu = fault.index, %uuid, "the GPU that faulted was replaced; its fault is cleared");
            }
            same.then(|| {
                (
                    fault.index,
                    GpuHealthState {
                        healthy: false,
                        message: Some(fault.message.clone()),
                    },
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use tessera_gpu::{backend::GpuInfo, find_model};

    use super::*;

    fn gpu(index: u32, uuid: &str) -> GpuInfo {
        GpuInfo {
            uuid: uuid.into(),
            ..GpuInfo::from_model(find_model("h100-80gb").unwrap(), index)
        }
    }

    fn faulty(message: &str) -> GpuHealthState {
        GpuHealthState {
            healthy: false,
            message: Some(message.into()),
        }
    }

    #[test]
    fn a_fault_survives_a_restart_in_the_same_boot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu-health.json");
        let gpus = [gpu(0, "GPU-a"), gpu(1, "GPU-b")];
        let store = HealthStore::new(&path, Some("boot-1".into()));
        let health = BTreeMap::from([
            (
                0,
                GpuHealthState {
                    healthy: true,
                    message: None,
                },
            ),
            (1, faulty("xid-79")),
        ]);

        store.save(&health, &gpus).unwrap();
        let loaded = HealthStore::new(&path, Some("boot-1".into()))
            .load(&gpus)
            .unwrap();

        assert_eq!(loaded, BTreeMap::from([(1, faulty("xid-79"))]));
    }

    #[test]
    fn a_reboot_or_a_replaced_gpu_clears_the_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu-health.json");
        let gpus = [gpu(0, "GPU-a"), gpu(1, "GPU-b")];
        HealthStore::new(&path, Some("boot-1".into()))
            .save(
                &BTreeMap::from([(0, faulty("gpu-lost")), (1, faulty("xid-48"))]),
                &gpus,
            )
            .unwrap();

        let after_reboot = HealthStore::new(&path, Some("boot-2".into()))
            .load(&gpus)
            .unwrap();
        let replaced = HealthStore::new(&path, Some("boot-1".into()))
            .load(&[gpu(0, "GPU-new"), gpu(1, "GPU-b")])
            .unwrap();

        assert!(after_reboot.is_empty(), "{after_reboot:?}");
        assert_eq!(replaced, BTreeMap::from([(1, faulty("xid-48"))]));
    }

    #[test]
    fn no_file_means_healthy_and_a_bad_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu-health.json");
        let store = HealthStore::new(&path, None);
        assert!(store.load(&[gpu(0, "GPU-a")]).unwrap().is_empty());
        std::fs::write(&path, "not json").unwrap();
        let err = store.load(&[gpu(0, "GPU-a")]).unwrap_err();
        assert!(err.to_string().contains("gpu-health.json"), "{err}");
    }
}
