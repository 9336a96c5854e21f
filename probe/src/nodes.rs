//! The device nodes of the container.

use std::{collections::BTreeMap, os::unix::fs::FileTypeExt, path::Path};

use crate::{Env, Report};

/// The NVIDIA major of `nvidia<N>`, `nvidiactl` and `nvidia-modeset`.
const NVIDIA_MAJOR: u32 = 195;

/// A character device found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

/// The node at `path`, if it is a character device.
pub fn node(path: &Path) -> Option<Node> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    m.file_type().is_char_device().then(|| Node {
        major: rustix::fs::major(m.rdev()),
        minor: rustix::fs::minor(m.rdev()),
    })
}

/// Majors by name from `/proc/devices` (the kernel's: on a simulated node it lacks the
/// driver's dynamic ones, which are then reported, not checked).
pub fn majors(proc_devices: &Path) -> BTreeMap<String, u32> {
    std::fs::read_to_string(proc_devices)
        .unwrap_or_default()
        .lines()
        .take_while(|l| !l.starts_with("Block"))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let major = it.next()?.parse().ok()?;
            Some((it.next()?.to_string(), major))
        })
        .collect()
}

/// Checks the control nodes, the GPU nodes and the capability nodes.
pub fn check(env: &Env, majors: &BTreeMap<String, u32>, r: &mut Report) {
    let expect = |name: &str, major: Option<u32>, minor: u32, required: bool, r: &mut Report| {
        let path = env.dev.join(name);
        match node(&path) {
            Some(n) if major.is_none_or(|m| m == n.major) && n.minor == minor => {
                r.found(format!("{} {}:{}", path.display(), n.major, n.minor));
            }
            Some(n) => r.missing(format!(
                "{} is {}:{}, the driver's is {}:{minor}",
                path.display(),
                n.major,
                n.minor,
                major.map_or("?".into(), |m| m.to_string())
            )),
            None if required => r.missing(format!("{} (no such character device)", path.display())),
            None => {}
        }
    };
    expect("nvidiactl", Some(NVIDIA_MAJOR), 255, true, r);
    expect("nvidia-uvm", majors.get("nvidia-uvm").copied(), 0, true, r);
    expect(
        "nvidia-uvm-tools",
        majors.get("nvidia-uvm").copied(),
        1,
        false,
        r,
    );
    expect("nvidia-modeset", Some(NVIDIA_MAJOR), 254, false, r);
    let mut gpus = 0;
    for entry in std::fs::read_dir(&env.dev).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(minor) = name
            .strip_prefix("nvidia")
            .and_then(|m| m.parse::<u32>().ok())
        {
            gpus += 1;
            expect(&name, Some(NVIDIA_MAJOR), minor, true, r);
        }
    }
    if gpus == 0 {
        r.missing(format!(
            "no GPU device node /dev/nvidia<N> in {}",
            env.dev.display()
        ));
    }
    let caps_major = majors.get("nvidia-caps").copied();
    let mut caps = 0;
    for entry in std::fs::read_dir(env.dev.join("nvidia-caps"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(minor) = name
            .strip_prefix("nvidia-cap")
            .and_then(|m| m.parse::<u32>().ok())
        {
            caps += 1;
            expect(&format!("nvidia-caps/{name}"), caps_major, minor, true, r);
        }
    }
    if env.vars.contains_key("TESSERA_MIG_PROFILE") && caps < 2 {
        r.missing(format!(
            "a MIG device needs its GPU instance's and compute instance's capability nodes; {caps} in {}/nvidia-caps",
            env.dev.display()
        ));
    }
}
