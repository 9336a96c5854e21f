//! The driver's MIG capability files, as the NVIDIA driver publishes them under
//! `/proc/driver/nvidia/capabilities`: `gpu<minor>/mig/gi<GI>/access` and
//! `…/gi<GI>/ci<CI>/access`, each holding `DeviceFileMinor: <N>`, the minor of the
//! `/dev/nvidia-caps/nvidia-cap<N>` node a container needs for that GPU or compute
//! instance. The plugin reads them to build a MIG device's CDI spec, so the simulator
//! writes them too, and the plugin's real code path runs in every test.
//!
//! The minors follow the driver's own table, `/proc/driver/nvidia-caps/mig-minors`
//! (MIG user guide, "Device Nodes and Capabilities"): `config 1`, `monitor 2`, then per GPU
//! minor and GPU-instance id (0-14) the GI's `access` followed by its CIs 0-7, so
//! `gpu0/gi0/access` is 3, `gpu0/gi0/ci0/access` 4 and `gpu0/gi1/access` 12. NVIDIA's CDI
//! generator reads that table ([`mig_minors`]) and the plugin the `access` files; both must
//! name the same node.

use std::{fs, io, path::Path};

use super::state::SimState;

/// GPU instance ids a GPU can have (H100: up to 7 instances, ids below 15).
const GI_IDS: u32 = 15;
/// Compute instance ids a GPU instance can have.
const CI_IDS: u32 = 8;
/// Slots of one GPU instance in the table: its own, then its compute instances'.
const CI_SLOTS: u32 = CI_IDS + 1;
/// Minors 1 and 2 are `config` and `monitor`.
const FIRST_GI_MINOR: u32 = 3;

/// The minor of a GPU instance's (`ci: None`) or compute instance's capability node.
pub fn minor(gpu_minor: u32, gi: u32, ci: Option<u32>) -> u32 {
    let gi_minor = FIRST_GI_MINOR + (gpu_minor * GI_IDS + gi) * CI_SLOTS;
    ci.map_or(gi_minor, |ci| gi_minor + 1 + ci)
}

/// The text of `/proc/driver/nvidia-caps/mig-minors` for GPUs of minors `0..gpus`.
pub fn mig_minors(gpus: u32) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    for gpu in 0..gpus {
        for gi in 0..GI_IDS {
            out.push_str(&format!(
                "gpu{gpu}/gi{gi}/access {}\n",
                minor(gpu, gi, None)
            ));
            for ci in 0..CI_IDS {
                out.push_str(&format!(
                    "gpu{gpu}/gi{gi}/ci{ci}/access {}\n",
                    minor(gpu, gi, Some(ci))
                ));
            }
        }
    }
    out
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

/// Rewrites `<dev>/nvidia-caps/` to hold one `nvidia-cap<N>` character device per GPU and
/// compute instance in `state` (the node a container of that instance is given), as
/// `nvidia-modprobe` creates them on a real node.
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
            super::devices::make_char_device(
                &path,
                super::devices::CAPS_MAJOR,
                n,
                super::devices::CAP_NODE_MODE,
            )?;
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
                for ci in 0..CI_IDS {
                    assert!(seen.insert(minor(gpu, gi, Some(ci))));
                }
            }
        }
        assert!(
            !seen.contains(&1) && !seen.contains(&2),
            "config and monitor"
        );
    }

    #[test]
    fn minors_match_the_drivers_table() {
        // MIG user guide: gpu0/gi0/access 3, gpu0/gi0/ci0/access 4, gpu0/gi1/access 12.
        assert_eq!(minor(0, 0, None), 3);
        assert_eq!(minor(0, 0, Some(0)), 4);
        assert_eq!(minor(0, 0, Some(7)), 11);
        assert_eq!(minor(0, 1, None), 12);
        let table = mig_minors(2);
        assert!(table.starts_with("config 1\nmonitor 2\ngpu0/gi0/access 3\n"));
        assert!(table.contains(&format!("gpu1/gi2/ci3/access {}\n", minor(1, 2, Some(3)))));
        assert_eq!(table.lines().count(), 2 + 2 * 15 * 9);
    }
}
