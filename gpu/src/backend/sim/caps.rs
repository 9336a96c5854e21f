//! The driver's MIG capability files, as the NVIDIA driver publishes them under
//! `/proc/driver/nvidia/capabilities`: `gpu<minor>/mig/gi<GI>/access` and
//! `…/gi<GI>/ci<CI>/access`, each holding `DeviceFileMinor: <N>`, the minor of the
//! `/dev/nvidia-caps/nvidia-cap<N>` node a container needs for that GPU or compute
//! instance. The plugin reads them to build a MIG device's CDI spec, so the simulator
//! writes them too, and the plugin's real code path runs in every test.
//!
//! The minors are a stable numbering of the simulator's own (the driver's comes from
//! `/proc/driver/nvidia-caps/mig-minors`): distinct for every GPU, GI and CI.

use std::{fs, io, path::Path};

use super::state::SimState;

/// GPU instance ids a GPU can have (H100: up to 7 instances, ids below 15).
const GI_IDS: u32 = 15;
/// Compute instance ids a GPU instance can have, plus one for the GI itself.
const CI_SLOTS: u32 = 9;

/// The minor of a GPU instance's (`ci: None`) or compute instance's capability node.
pub fn minor(gpu_minor: u32, gi: u32, ci: Option<u32>) -> u32 {
    let gi_minor = 1 + (gpu_minor * GI_IDS + gi) * CI_SLOTS;
    ci.map_or(gi_minor, |ci| gi_minor + 1 + ci)
}

/// Brings the capability tree under `root` to the instances in `state`: files of
/// instances that exist are left in place (a reader of one must never find it missing
/// while another instance comes or goes, as with the driver's own files), those of
/// instances gone are removed, new ones are added.
pub fn publish(root: &Path, state: &SimState) -> io::Result<()> {
    for g in &state.gpus {
        // The simulated node numbers its device files like its indices.
        let mig = root.join(format!("gpu{}", g.index)).join("mig");
        let want: std::collections::BTreeMap<String, &super::state::SimGpuInstance> = g
            .instances
            .iter()
            .map(|gi| (format!("gi{}", gi.id), gi))
            .collect();
        match fs::read_dir(&mig) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if !want.contains_key(&name) {
                        fs::remove_dir_all(entry.path())?;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for (name, gi) in want {
            let dir = mig.join(name);
            fs::create_dir_all(&dir)?;
            write_access(&dir, minor(g.index, gi.id, None))?;
            let cis: std::collections::BTreeSet<String> = gi
                .compute_instances
                .iter()
                .map(|ci| format!("ci{}", ci.id))
                .collect();
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("ci") && !cis.contains(&name) {
                    fs::remove_dir_all(entry.path())?;
                }
            }
            for ci in &gi.compute_instances {
                let ci_dir = dir.join(format!("ci{}", ci.id));
                fs::create_dir_all(&ci_dir)?;
                write_access(&ci_dir, minor(g.index, gi.id, Some(ci.id)))?;
            }
        }
    }
    Ok(())
}

/// Rewrites `<dev>/nvidia-caps/` to hold one `nvidia-cap<N>` file per GPU and compute
/// instance in `state` (the node a container of that instance is given).
pub fn publish_nodes(dev: &Path, state: &SimState) -> io::Result<()> {
    let dir = dev.join("nvidia-caps");
    fs::create_dir_all(&dir)?;
    let mut want = std::collections::BTreeSet::new();
    for g in &state.gpus {
        for gi in &g.instances {
            want.insert(minor(g.index, gi.id, None));
            for ci in &gi.compute_instances {
                want.insert(minor(g.index, gi.id, Some(ci.id)));
            }
        }
    }
    for entry in fs::read_dir(&dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let stale = name
            .to_str()
            .and_then(|n| n.strip_prefix("nvidia-cap"))
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| !want.contains(&n));
        if stale {
            fs::remove_file(entry.path())?;
        }
    }
    for n in want {
        let path = dir.join(format!("nvidia-cap{n}"));
        if !path.exists() {
            fs::write(path, b"")?;
        }
    }
    Ok(())
}

/// Writes an `access` file, only when its content differs: a reader never sees it
/// truncated, since an unchanged file is not rewritten and a new one is renamed in whole.
fn write_access(dir: &Path, minor: u32) -> io::Result<()> {
    let path = dir.join("access");
    let text = format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n");
    if fs::read_to_string(&path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    super::state::write_atomic(&path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_are_distinct_across_gpus_instances_and_compute_instances() {
        let mut seen = std::collections::BTreeSet::new();
        for gpu in 0..8 {
            for gi in 0..GI_IDS {
                assert!(seen.insert(minor(gpu, gi, None)));
                for ci in 0..CI_SLOTS - 1 {
                    assert!(seen.insert(minor(gpu, gi, Some(ci))));
                }
            }
        }
    }
}
