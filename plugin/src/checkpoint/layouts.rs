//! The record of each GPU's static MIG layout: the instances Tessera holds on a GPU
//! whether or not a claim uses them.
//!
//! An instance is recorded before it is created (without an identity), and its identity
//! is added once it exists. A crash between the two leaves an instance at a recorded
//! placement, which the next pass takes as Tessera's. Instances found at a planned
//! placement are adopted: handed out like Tessera's, never destroyed.

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::{CHECKPOINT_VERSION, CheckpointStore, Error, MigIdentity, Result};

/// The instances one GPU holds for its static layout.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldLayout {
    /// UUID of the GPU: a record for another board (a swap at the same index) is void.
    pub gpu_uuid: String,
    /// The instances, by placement.
    #[serde(default)]
    pub instances: Vec<HeldInstance>,
}

/// One instance of a static layout.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeldInstance {
    /// NVML GPU instance profile id.
    pub profile_id: u32,
    /// Profile name.
    pub profile: String,
    /// First memory slice.
    pub start: u8,
    /// Number of memory slices.
    pub size: u8,
    /// Identity once the instance exists (absent: its creation is under way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<MigIdentity>,
    /// Found on the GPU rather than made by Tessera: handed out, never destroyed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
}

/// One GPU's file: the layout plus the format version and the boot it was written in.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayoutFile {
    version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
    gpu: u32,
    layout: HeldLayout,
}

impl CheckpointStore {
    fn layout_name(gpu: u32) -> String {
        format!("gpu-{gpu}.json")
    }

    /// Reads every GPU's layout. A layout of an earlier boot is void (the reboot took its
    /// instances) and its file is removed.
    pub(super) fn load_layouts(
        &self,
        unreadable: &mut Vec<PathBuf>,
    ) -> Result<BTreeMap<u32, HeldLayout>> {
        let mut layouts = BTreeMap::new();
        for (path, text) in self.records(&self.layouts, unreadable)? {
            let Some(file) = self.parse::<LayoutFile>(&path, &text, unreadable)? else {
                continue;
            };
            if file.version != CHECKPOINT_VERSION {
                return Err(Error::Version {
                    path,
                    found: file.version,
                });
            }
            if self.earlier_boot(file.boot_id.as_deref()) {
                self.remove(&path)?;
                continue;
            }
            layouts.insert(file.gpu, file.layout);
        }
        Ok(layouts)
    }

    /// Writes one GPU's layout atomically; an empty layout removes the file. Written
    /// before an instance is created, so it is synced where records cannot be voided by
    /// boot (see the module docs of [`super`]).
    pub fn save_layout(&self, gpu: u32, layout: &HeldLayout) -> Result<()> {
        if layout.instances.is_empty() {
            return self.remove(&self.layouts.join(Self::layout_name(gpu)));
        }
        let file = LayoutFile {
            version: CHECKPOINT_VERSION.to_string(),
            boot_id: self.boot_id.clone(),
            gpu,
            layout: layout.clone(),
        };
        let sync = self.boot_id.is_none();
        self.write(&self.layouts, &Self::layout_name(gpu), &file, sync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> HeldLayout {
        HeldLayout {
            gpu_uuid: "GPU-a".into(),
            instances: vec![
                HeldInstance {
                    profile_id: 5,
                    profile: "4g.20gb".into(),
                    start: 0,
                    size: 4,
                    created: Some(MigIdentity {
                        gpu_instance_id: 1,
                        compute_instance_id: 0,
                        uuid: "MIG-1".into(),
                    }),
                    adopted: false,
                },
                HeldInstance {
                    profile_id: 9,
                    profile: "3g.20gb".into(),
                    start: 4,
                    size: 4,
                    created: None,
                    adopted: true,
                },
            ],
        }
    }

    #[test]
    fn layouts_read_back_and_an_empty_one_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path(), Some("boot-a".into()));
        store.save_layout(3, &layout()).unwrap();
        assert_eq!(store.load().unwrap().layouts[&3], layout());
        store.save_layout(3, &HeldLayout::default()).unwrap();
        assert!(store.load().unwrap().layouts.is_empty());
        assert!(!dir.path().join("layouts/gpu-3.json").exists());
        // Removing what is not there is fine.
        store.save_layout(3, &HeldLayout::default()).unwrap();
    }

    #[test]
    fn a_layout_of_an_earlier_boot_is_void_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        CheckpointStore::new(dir.path(), Some("boot-a".into()))
            .save_layout(0, &layout())
            .unwrap();
        let after = CheckpointStore::new(dir.path(), Some("boot-b".into()));
        assert!(after.load().unwrap().layouts.is_empty());
        assert!(!dir.path().join("layouts/gpu-0.json").exists());
    }

    #[test]
    fn a_torn_layout_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("layouts")).unwrap();
        std::fs::write(dir.path().join("layouts/gpu-1.json"), "{\"version\":").unwrap();
        let cp = CheckpointStore::new(dir.path(), None).load().unwrap();
        assert!(cp.layouts.is_empty());
        assert_eq!(cp.unreadable.len(), 1);
        assert!(dir.path().join("layouts/gpu-1.json.unreadable").exists());
    }
}
