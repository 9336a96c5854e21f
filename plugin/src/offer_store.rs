//! What each GPU offered last outlives the plugin process: `<state-dir>/offers.json`.
//!
//! A GPU changing shape is fenced before it switches (see [`crate::fence`]), because
//! the scheduler may be about to allocate one of its old devices. A plugin that restarts
//! mid-change must know the old shape to fence it: without the record it would take
//! the first offer it computes as applied and switch at once, under an allocation the
//! scheduler decided before the restart. Each record names the GPU's UUID: a GPU
//! replaced at that index starts afresh.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};
use tessera_gpu::backend::GpuInfo;

pub use crate::record_file::Error;
use crate::{record_file::RecordFile, slices::GpuOffer};

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// By GPU UUID.
    gpus: BTreeMap<String, Entry>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Entry {
    index: u32,
    offer: GpuOffer,
}

/// The record of one node's applied offers.
#[derive(Clone, Debug)]
pub struct OfferStore {
    file: RecordFile,
}

impl OfferStore {
    /// The record at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            file: RecordFile::new(path.into(), "the GPUs' offers"),
        }
    }

    /// The offers recorded for `gpus` (a GPU with another UUID at its index has none);
    /// no file: none.
    pub fn load(&self, gpus: &[GpuInfo]) -> Result<BTreeMap<u32, GpuOffer>, Error> {
        let Some(record) = self.file.read::<Record>()? else {
            return Ok(BTreeMap::new());
        };
        Ok(record
            .gpus
            .into_iter()
            .filter(|(uuid, e)| gpus.iter().any(|g| g.index == e.index && &g.uuid == uuid))
            .map(|(_, e)| (e.index, e.offer))
            .collect())
    }

    /// Records `applied`; writes only when the content changes.
    pub fn save(&self, applied: &BTreeMap<u32, GpuOffer>, gpus: &[GpuInfo]) -> Result<(), Error> {
        let record = Record {
            gpus: applied
                .iter()
                .filter_map(|(index, offer)| {
                    let gpu = gpus.iter().find(|g| g.index == *index)?;
                    Some((
                        gpu.uuid.clone(),
                        Entry {
                            index: *index,
                            offer: offer.clone(),
                        },
                    ))
                })
                .collect(),
        };
        self.file.write(&record)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use tessera_gpu::find_model;

    use super::*;

    fn gpu(index: u32, uuid: &str) -> GpuInfo {
        GpuInfo {
            uuid: uuid.into(),
            ..GpuInfo::from_model(find_model("h100-80gb").unwrap(), index)
        }
    }

    fn mps() -> GpuOffer {
        GpuOffer::Mps {
            max_clients: 8,
            default_thread_percentage: 12,
            default_memory_mib: 4096,
        }
    }

    #[test]
    fn offers_survive_a_restart_and_a_replaced_gpu_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let store = OfferStore::new(dir.path().join("offers.json"));
        assert!(
            store.load(&[gpu(0, "GPU-a")]).unwrap().is_empty(),
            "no file"
        );
        let applied = BTreeMap::from([
            (
                0,
                GpuOffer::DynamicMig {
                    allowed_profile_ids: vec![19],
                },
            ),
            (1, mps()),
        ]);
        let gpus = [gpu(0, "GPU-a"), gpu(1, "GPU-b")];
        store.save(&applied, &gpus).unwrap();
        assert_eq!(store.load(&gpus).unwrap(), applied);
        let swapped = [gpu(0, "GPU-a"), gpu(1, "GPU-new")];
        assert_eq!(
            store.load(&swapped).unwrap(),
            BTreeMap::from([(0, applied[&0].clone())])
        );
    }

    #[test]
    fn an_unreadable_record_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offers.json");
        fs::write(&path, "not json").unwrap();
        let err = OfferStore::new(&path).load(&[]).unwrap_err();
        assert!(err.to_string().contains("offers.json"), "{err}");
    }
}
