//! What a container gets from a CDI device, read from the OCI runtime spec the reference
//! CDI library made of it ([`Edits::of`]), and the comparison of Tessera's against
//! NVIDIA's for the same device ([`missing`]): every device node, mount, library link,
//! loader directory and hook NVIDIA's generator gives, Tessera must give too, except the
//! differences listed in [`DOCUMENTED`] (each with its reason in docs/reference/cdi.md).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// What NVIDIA gives and Tessera does not, on purpose: `(item, reason)`. The items are
/// [`Edits`] keys as [`missing`] prints them.
pub const DOCUMENTED: &[(&str, &str)] = &[
    (
        "hook enable-cuda-compat",
        "CUDA forward compatibility from the image's compat libraries: not done (docs/reference/cdi.md, differences)",
    ),
    (
        "hook disable-device-node-modification",
        "a container copy of /proc/driver/nvidia/params: not done; the device cgroup already keeps a container from opening nodes it was not given",
    ),
    (
        "hook update-application-profile",
        "EGL application profile: graphics, out of scope",
    ),
    (
        "hook apply-cuda-memory-limits",
        "NVIDIA_GPU_MEMORY_LIMIT through cgroup v2: Tessera limits memory on the MPS server instead",
    ),
    (
        "env NVIDIA_CTK_LIBCUDA_DIR",
        "read by NVIDIA's own hooks only",
    ),
];

/// The edits of one container, as sets keyed for comparison.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edits {
    /// `path -> (type, major, minor, mode)`.
    pub devices: BTreeMap<String, (String, i64, i64, i64)>,
    /// `container path -> host path`.
    pub mounts: BTreeMap<String, String>,
    /// `link -> target` of the `create-symlinks` hooks.
    pub links: BTreeMap<String, String>,
    /// `update-ldcache` folders.
    pub ld_folders: BTreeSet<String>,
    /// Hooks by `<stage> <subcommand>` (the hook binary differs: NVIDIA's and Tessera's).
    pub hooks: BTreeSet<String>,
    /// `KEY -> value`.
    pub env: BTreeMap<String, String>,
    /// Groups the process joins.
    pub gids: BTreeSet<i64>,
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

impl Edits {
    /// The edits in an OCI runtime spec made from an empty one.
    pub fn of(oci: &Value) -> Self {
        let mut e = Edits::default();
        for d in oci["linux"]["devices"].as_array().into_iter().flatten() {
            e.devices.insert(
                str_of(&d["path"]),
                (
                    str_of(&d["type"]),
                    d["major"].as_i64().unwrap_or(-1),
                    d["minor"].as_i64().unwrap_or(-1),
                    d["fileMode"].as_i64().unwrap_or(-1),
                ),
            );
        }
        for m in oci["mounts"].as_array().into_iter().flatten() {
            e.mounts
                .insert(str_of(&m["destination"]), str_of(&m["source"]));
        }
        let hooks = oci["hooks"].as_object().cloned().unwrap_or_default();
        for (stage, list) in &hooks {
            for h in list.as_array().into_iter().flatten() {
                let args: Vec<String> = h["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(str_of)
                    .collect();
                let sub = args.get(1).cloned().unwrap_or_default();
                e.hooks.insert(format!("{stage} {sub}"));
                let mut it = args.iter().skip(2);
                while let Some(flag) = it.next() {
                    match (sub.as_str(), flag.as_str()) {
                        ("create-symlinks", "--link") => {
                            if let Some((target, link)) = it.next().and_then(|v| v.split_once("::"))
                            {
                                e.links.insert(link.into(), target.into());
                            }
                        }
                        ("update-ldcache", "--folder") => {
                            e.ld_folders.extend(it.next().cloned());
                        }
                        _ => {}
                    }
                }
            }
        }
        for kv in oci["process"]["env"].as_array().into_iter().flatten() {
            if let Some((k, v)) = kv.as_str().and_then(|s| s.split_once('=')) {
                e.env.insert(k.into(), v.into());
            }
        }
        for g in oci["process"]["user"]["additionalGids"]
            .as_array()
            .into_iter()
            .flatten()
        {
            e.gids.extend(g.as_i64());
        }
        e
    }
}

/// What `nvidia` gives that `tessera` lacks or gives differently, one line each, without
/// the [`DOCUMENTED`] differences.
pub fn missing(nvidia: &Edits, tessera: &Edits) -> Vec<String> {
    let documented = |item: &str| DOCUMENTED.iter().any(|(d, _)| *d == item);
    let mut out = Vec::new();
    for (path, n) in &nvidia.devices {
        match tessera.devices.get(path) {
            None => out.push(format!("device {path} {n:?}")),
            Some(t) if (t.0.as_str(), t.1, t.2) != (n.0.as_str(), n.1, n.2) => {
                out.push(format!("device {path}: NVIDIA {n:?}, Tessera {t:?}"));
            }
            Some(_) => {}
        }
    }
    for (dest, src) in &nvidia.mounts {
        match tessera.mounts.get(dest) {
            None => out.push(format!("mount {dest} <- {src}")),
            Some(t) if t != src => out.push(format!("mount {dest}: NVIDIA {src}, Tessera {t}")),
            Some(_) => {}
        }
    }
    for (link, target) in &nvidia.links {
        match tessera.links.get(link) {
            None => out.push(format!("link {link} -> {target}")),
            Some(t) if t != target => {
                out.push(format!("link {link}: NVIDIA -> {target}, Tessera -> {t}"));
            }
            Some(_) => {}
        }
    }
    for f in nvidia.ld_folders.difference(&tessera.ld_folders) {
        out.push(format!("ld folder {f}"));
    }
    for h in &nvidia.hooks {
        let name = h.split_once(' ').map_or(h.as_str(), |(_, s)| s);
        let covered = tessera
            .hooks
            .iter()
            .any(|t| t.split_once(' ').map_or(t.as_str(), |(_, s)| s) == name);
        if !covered && !documented(&format!("hook {name}")) {
            out.push(format!("hook {h}"));
        }
    }
    for (k, v) in &nvidia.env {
        if documented(&format!("env {k}")) {
            continue;
        }
        if tessera.env.get(k) != Some(v) {
            out.push(format!("env {k}={v} (Tessera: {:?})", tessera.env.get(k)));
        }
    }
    for g in nvidia.gids.difference(&tessera.gids) {
        out.push(format!("additional gid {g}"));
    }
    out
}

/// What `tessera` gives beyond `nvidia`, one line each (for the test's log).
pub fn extra(nvidia: &Edits, tessera: &Edits) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(
        tessera
            .devices
            .keys()
            .filter(|k| !nvidia.devices.contains_key(*k))
            .map(|k| format!("device {k}")),
    );
    out.extend(
        tessera
            .mounts
            .iter()
            .filter(|(k, _)| !nvidia.mounts.contains_key(*k))
            .map(|(k, v)| format!("mount {k} <- {v}")),
    );
    out.extend(
        tessera
            .env
            .iter()
            .filter(|(k, _)| !nvidia.env.contains_key(*k))
            .map(|(k, v)| format!("env {k}={v}")),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn oci(hook: &str, link: &str, env: &str) -> Value {
        json!({
            "process": {"env": [env, "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib"]},
            "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}]},
            "mounts": [{"destination": "/usr/lib/libcuda.so.1.2", "source": "/root/usr/lib/libcuda.so.1.2"}],
            "hooks": {"createContainer": [
                {"path": hook, "args": ["x", "create-symlinks", "--link", link]},
                {"path": hook, "args": ["x", "enable-cuda-compat"]},
                {"path": hook, "args": ["x", "update-ldcache", "--folder", "/usr/lib"]}
            ]}
        })
    }

    #[test]
    fn only_undocumented_gaps_count() {
        let nvidia = Edits::of(&oci(
            "/usr/bin/nvidia-cdi-hook",
            "libcuda.so.1::/usr/lib/libcuda.so",
            "NVIDIA_VISIBLE_DEVICES=void",
        ));
        let mut t = oci(
            "/plugins/tessera-cdi-hook",
            "libcuda.so.1::/usr/lib/libcuda.so",
            "NVIDIA_VISIBLE_DEVICES=void",
        );
        t["hooks"]["createContainer"]
            .as_array_mut()
            .unwrap()
            .remove(1);
        let tessera = Edits::of(&t);
        assert_eq!(missing(&nvidia, &tessera), Vec::<String>::new());
        let bad = Edits::of(&oci(
            "/h",
            "libcuda.so.2::/usr/lib/libcuda.so",
            "NVIDIA_VISIBLE_DEVICES=GPU-1",
        ));
        let gaps = missing(&nvidia, &bad);
        assert_eq!(gaps.len(), 2, "{gaps:?}");
        let mut no_dev = tessera.clone();
        no_dev.devices.clear();
        assert_eq!(missing(&nvidia, &no_dev).len(), 1);
    }
}
