//! What each GPU offered last outlives the plugin process: `<state-dir>/offers.json`.
//!
//! A GPU changing shape is fenced before it switches (see [`crate::fence`]), because
//! the scheduler may be about to allocate one of its old devices. A plugin that restarts
//! mid-change must know the old shape to fence it: without the record it would take
//! the first offer it computes as applied and switch at once, under an allocation the
//! scheduler decided before the restart. Each record names the GPU's UUID: a GPU
//! replaced at that index starts afresh.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use tessera_gpu::backend::GpuInfo;

use crate::slices::GpuOffer;

/// Reading or writing the record failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{action} {}", .path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an offer record.
    #[error("{} is not a record of the GPUs' offers", .path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

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
    path: PathBuf,
}

impl OfferStore {
    /// The record at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The offers recorded for `gpus` (a GPU with another UUID at its index has none);
    /// no file: none.
    pub fn load(&self, gpus: &[GpuInfo]) -> Result<BTreeMap<u32, GpuOffer>, Error> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(source) => return Err(self.io("reading", source)),
        };
        let record: Record = serde_json::from_str(&text).map_err(|source| Error::Parse {
            path: self.path.clone(),
            source,
        })?;
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
        let text = serde_json::to_string_pretty(&record).unwrap_or_default();
        if fs::read_to_string(&self.path).is_ok_and(|old| old == text) {
            return Ok(());
        }
        crate::health_store::write_atomic(&self.path, text.as_bytes())
            .map_err(|source| self.io("writing", source))
    }

    /// Where the record lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, action: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            action,
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
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
