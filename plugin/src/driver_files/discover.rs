//! Which of the driver's files a container gets: the rules of NVIDIA's CDI generator
//! (NCT `pkg/nvcdi/driver-nvml.go`, `internal/lookup/root`, `internal/discover`;
//! containers.md §1.1), over a [`HostFs`] so they run on a node described in memory.
//!
//! - Library directories: the installer's standard directories under the driver root
//!   holding a `lib*.so.<driver version>`; their files `*.so.<version>` (and those of
//!   their `vdpau/` subdirectory, and the legacy `libnvidia-nvvm70.so.*`) are mounted,
//!   every one, as NVIDIA does (no capability filtering).
//! - Links: the SONAME and `.so` links the host has next to each library (what `ldconfig`
//!   and the installer made), recreated in the container by the hook; and
//!   `libcuda.so -> libcuda.so.1`, which NVIDIA always adds ("many applications wrongly
//!   assume that libcuda.so exists"), and GBM's `gbm/nvidia-drm_gbm.so ->
//!   ../libnvidia-allocator.so.1` where the allocator library is there.
//! - Binaries, first found in the executable directories of the root: `nvidia-smi`,
//!   `nvidia-debugdump`, `nvidia-persistenced`, the MPS pair, `nvidia-imex(-ctl)`.
//! - GSP firmware: `nvidia/<version>/gsp*.bin` under `lib/firmware[/updates][/<release>]`.
//! - IPC sockets of `nvidia-persistenced` and `nvidia-fabricmanager` under `run` or
//!   `var/run`.
//!
//! Paths are resolved inside the root (a `lib -> usr/lib` link of a merged-/usr system
//! names the same directory as `usr/lib`), and every result is relative to the root:
//! the caller puts the host's and the container's prefixes on.

use std::{
    collections::BTreeSet,
    path::{Component, Path, PathBuf},
};

use super::host::{HostFs, Kind};

/// Directories (relative to the driver root) where installers put the libraries, in
/// NVIDIA's search order.
pub const LIBRARY_DIRS: [&str; 10] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib/x86_64-linux-gnu/nvidia/current",
    "usr/lib/aarch64-linux-gnu/nvidia/current",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib/x86_64-linux-gnu/nvidia/current",
    "lib/aarch64-linux-gnu/nvidia/current",
];

/// The driver's binaries a container gets when the root has them.
pub const BINARIES: [&str; 7] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
];

/// Where binaries are looked for, in `PATH` order.
const BINARY_DIRS: [&str; 6] = [
    "usr/local/sbin",
    "usr/local/bin",
    "usr/sbin",
    "usr/bin",
    "sbin",
    "bin",
];

/// The daemons' sockets a container gets when they are there.
const SOCKETS: [&str; 2] = ["nvidia-persistenced/socket", "nvidia-fabricmanager/socket"];

/// A link the hook makes in the container.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Link {
    /// What it points at, as on the host (a name in the same directory).
    pub target: String,
    /// The link, relative to the root.
    pub link: PathBuf,
}

/// The driver's files, relative to the driver root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Directories holding the libraries (and their `vdpau/` where it has libraries).
    pub lib_dirs: Vec<PathBuf>,
    /// Library files.
    pub libraries: Vec<PathBuf>,
    /// Links to make next to them.
    pub links: Vec<Link>,
    /// Binaries.
    pub binaries: Vec<PathBuf>,
    /// Firmware files.
    pub firmware: Vec<PathBuf>,
    /// IPC sockets.
    pub sockets: Vec<PathBuf>,
}

/// `rel` resolved inside `root`, links followed (an absolute link target is taken from
/// the root, `..` stops at it), if it exists.
pub fn resolve(fs: &dyn HostFs, root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut todo: Vec<PathBuf> = rel
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    let mut done = PathBuf::new();
    let mut hops = 0;
    while let Some(next) = todo.pop() {
        if next == Path::new("..") {
            done.pop();
            continue;
        }
        let candidate = done.join(&next);
        let meta = fs.meta(&root.join(&candidate)).ok()?;
        if meta.kind != Kind::Symlink {
            done = candidate;
            continue;
        }
        hops += 1;
        if hops > 40 {
            return None;
        }
        let target = fs.read_link(&root.join(&candidate)).ok()?;
        if target.is_absolute() {
            done = PathBuf::new();
        }
        for c in target.components().rev() {
            match c {
                Component::Normal(n) => todo.push(PathBuf::from(n)),
                Component::ParentDir => todo.push(PathBuf::from("..")),
                _ => {}
            }
        }
    }
    Some(done)
}

fn is_kind(fs: &dyn HostFs, root: &Path, rel: &Path, kind: Kind) -> bool {
    fs.meta(&root.join(rel)).is_ok_and(|m| m.kind == kind)
}

fn names(fs: &dyn HostFs, dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs
        .list(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect();
    out.sort();
    out
}

/// Whether `name` is a library of the version: `*.so.<version>`.
pub fn is_versioned(name: &str, version: &str) -> bool {
    name.strip_suffix(version)
        .and_then(|s| s.strip_suffix(".so."))
        .is_some_and(|stem| !stem.is_empty())
}

/// The part of a library name before `.so`: `libcuda` for `libcuda.so.1`.
pub fn stem(name: &str) -> &str {
    name.find(".so").map_or(name, |i| &name[..i])
}

/// The driver's files under `root` for driver `version`; the kernel's `release` names
/// firmware directories.
pub fn discover(fs: &dyn HostFs, root: &Path, version: &str, release: &str) -> Found {
    let mut found = Found::default();
    let mut dirs = BTreeSet::new();
    let mut ordered = Vec::new();
    for candidate in LIBRARY_DIRS {
        let Some(dir) = resolve(fs, root, Path::new(candidate)) else {
            continue;
        };
        if !is_kind(fs, root, &dir, Kind::Dir) || dirs.contains(&dir) {
            continue;
        }
        let has_driver = names(fs, &root.join(&dir)).iter().any(|n| {
            n.starts_with("lib")
                && is_versioned(n, version)
                && is_kind(fs, root, &dir.join(n), Kind::File)
        });
        if has_driver {
            dirs.insert(dir.clone());
            ordered.push(dir);
        }
    }
    let mut libraries = BTreeSet::new();
    let mut links = BTreeSet::new();
    for dir in &ordered {
        for d in [dir.clone(), dir.join("vdpau")] {
            if !is_kind(fs, root, &d, Kind::Dir) {
                continue;
            }
            let entries = names(fs, &root.join(&d));
            let libs: Vec<&String> = entries
                .iter()
                .filter(|n| {
                    (is_versioned(n, version) || n.starts_with("libnvidia-nvvm70.so."))
                        && is_kind(fs, root, &d.join(n), Kind::File)
                })
                .collect();
            if libs.is_empty() {
                continue;
            }
            if !found.lib_dirs.contains(&d) {
                found.lib_dirs.push(d.clone());
            }
            for lib in &libs {
                libraries.insert(d.join(lib));
                match stem(lib) {
                    "libcuda" => {
                        links.insert(Link {
                            target: "libcuda.so.1".into(),
                            link: d.join("libcuda.so"),
                        });
                    }
                    // GBM finds the driver's backend by this name (NCT `graphics.go`).
                    "libnvidia-allocator" => {
                        links.insert(Link {
                            target: "../libnvidia-allocator.so.1".into(),
                            link: d.join("gbm/nvidia-drm_gbm.so"),
                        });
                    }
                    _ => {}
                }
            }
            for name in &entries {
                if let Some(target) = link_to_library(fs, root, &d, name, &libs) {
                    links.insert(Link {
                        target,
                        link: d.join(name),
                    });
                }
            }
        }
    }
    found.libraries = libraries.into_iter().collect();
    found.links = links.into_iter().collect();
    for name in BINARIES {
        let hit = BINARY_DIRS.iter().find_map(|dir| {
            let p = resolve(fs, root, &Path::new(dir).join(name))?;
            fs.meta(&root.join(&p))
                .is_ok_and(|m| m.kind == Kind::File && m.mode & 0o111 != 0)
                .then_some(p)
        });
        found.binaries.extend(hit);
    }
    let mut firmware = BTreeSet::new();
    for base in [
        format!("lib/firmware/updates/{release}"),
        "lib/firmware/updates".into(),
        format!("lib/firmware/{release}"),
        "lib/firmware".into(),
    ] {
        let Some(dir) = resolve(fs, root, &Path::new(&base).join("nvidia").join(version)) else {
            continue;
        };
        for n in names(fs, &root.join(&dir)) {
            if n.starts_with("gsp")
                && n.ends_with(".bin")
                && is_kind(fs, root, &dir.join(&n), Kind::File)
            {
                firmware.insert(dir.join(n));
            }
        }
    }
    found.firmware = firmware.into_iter().collect();
    for socket in SOCKETS {
        let hit = ["run", "var/run"].iter().find_map(|base| {
            let p = resolve(fs, root, &Path::new(base).join(socket))?;
            is_kind(fs, root, &p, Kind::Socket).then_some(p)
        });
        found.sockets.extend(hit);
    }
    found
}

/// The target of `name`, when it is a link in `dir` that leads (through links in the same
/// directory) to one of `libs` and carries that library's name (`libcuda.so.1`,
/// `libcuda.so` for `libcuda.so.580.95.05`).
fn link_to_library(
    fs: &dyn HostFs,
    root: &Path,
    dir: &Path,
    name: &str,
    libs: &[&String],
) -> Option<String> {
    if !is_kind(fs, root, &dir.join(name), Kind::Symlink) {
        return None;
    }
    let first = fs.read_link(&root.join(dir).join(name)).ok()?;
    let first = first.to_str()?.to_string();
    let mut current = first.clone();
    for _ in 0..8 {
        if current.contains('/') {
            return None;
        }
        if let Some(lib) = libs.iter().find(|l| l.as_str() == current) {
            return (stem(name) == stem(lib)).then_some(first);
        }
        current = fs
            .read_link(&root.join(dir).join(&current))
            .ok()?
            .to_str()?
            .to_string();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver_files::host::mem::MemFs;

    const V: &str = "580.95.05";

    /// A Debian-style install with a merged /usr (`lib -> usr/lib`).
    fn debian() -> MemFs {
        let fs = MemFs::default();
        let lib = "/r/usr/lib/x86_64-linux-gnu";
        fs.link("/r/lib", "usr/lib")
            .file(format!("{lib}/libcuda.so.{V}"))
            .link(format!("{lib}/libcuda.so.1"), &format!("libcuda.so.{V}"))
            .file(format!("{lib}/libnvidia-ml.so.{V}"))
            .link(
                format!("{lib}/libnvidia-ml.so.1"),
                &format!("libnvidia-ml.so.{V}"),
            )
            .link(format!("{lib}/libnvidia-ml.so"), "libnvidia-ml.so.1")
            .file(format!("{lib}/libnvidia-gpucomp.so.{V}"))
            .file(format!("{lib}/vdpau/libvdpau_nvidia.so.{V}"))
            .link(
                format!("{lib}/vdpau/libvdpau_nvidia.so.1"),
                &format!("libvdpau_nvidia.so.{V}"),
            )
            // Another version's leftovers and an unrelated library are not the driver's.
            .file(format!("{lib}/libcuda.so.570.1.2"))
            .file(format!("{lib}/libz.so.1.2.13"))
            .link(format!("{lib}/libunrelated.so"), &format!("libcuda.so.{V}"))
            .file("/r/usr/bin/nvidia-smi")
            .file("/r/usr/bin/nvidia-cuda-mps-control")
            .file(format!("/r/usr/lib/firmware/nvidia/{V}/gsp_ga10x.bin"))
            .socket("/r/run/nvidia-persistenced/socket")
            .socket("/r/tmp/nvidia-mps/control");
        fs
    }

    #[test]
    fn the_driver_version_picks_libraries_links_binaries_firmware_and_sockets() {
        let fs = debian();
        let f = discover(&fs, Path::new("/r"), V, "6.8.0");
        let lib = Path::new("usr/lib/x86_64-linux-gnu");
        assert_eq!(f.lib_dirs, [lib.to_path_buf(), lib.join("vdpau")]);
        assert_eq!(
            f.libraries,
            [
                lib.join(format!("libcuda.so.{V}")),
                lib.join(format!("libnvidia-gpucomp.so.{V}")),
                lib.join(format!("libnvidia-ml.so.{V}")),
                lib.join(format!("vdpau/libvdpau_nvidia.so.{V}")),
            ]
        );
        let links: Vec<(String, PathBuf)> = f
            .links
            .iter()
            .map(|l| (l.target.clone(), l.link.clone()))
            .collect();
        assert_eq!(
            links,
            [
                ("libcuda.so.1".into(), lib.join("libcuda.so")),
                (format!("libcuda.so.{V}"), lib.join("libcuda.so.1")),
                ("libnvidia-ml.so.1".into(), lib.join("libnvidia-ml.so")),
                (
                    format!("libnvidia-ml.so.{V}"),
                    lib.join("libnvidia-ml.so.1")
                ),
                (
                    format!("libvdpau_nvidia.so.{V}"),
                    lib.join("vdpau/libvdpau_nvidia.so.1")
                ),
            ]
        );
        assert_eq!(
            f.binaries,
            [
                Path::new("usr/bin/nvidia-smi"),
                Path::new("usr/bin/nvidia-cuda-mps-control")
            ]
        );
        // Found through lib -> usr/lib, named by where it is.
        assert_eq!(
            f.firmware,
            [PathBuf::from(format!(
                "usr/lib/firmware/nvidia/{V}/gsp_ga10x.bin"
            ))]
        );
        // A host MPS daemon's pipe directory is not a socket NVIDIA's rules mount here.
        assert_eq!(f.sockets, [Path::new("run/nvidia-persistenced/socket")]);
    }

    #[test]
    fn another_version_finds_nothing() {
        let f = discover(&debian(), Path::new("/r"), "590.1.1", "6.8.0");
        assert!(f.libraries.is_empty() && f.lib_dirs.is_empty());
    }

    #[test]
    fn links_resolve_inside_the_root() {
        let fs = MemFs::default();
        fs.link("/r/lib", "/usr/lib")
            .dir("/r/usr/lib")
            .link("/r/usr/lib/up", "../../../..");
        assert_eq!(
            resolve(&fs, Path::new("/r"), Path::new("lib")),
            Some("usr/lib".into())
        );
        assert_eq!(
            resolve(&fs, Path::new("/r"), Path::new("usr/lib/up")),
            Some(PathBuf::new())
        );
        assert_eq!(resolve(&fs, Path::new("/r"), Path::new("nope")), None);
        assert!(is_versioned("libcuda.so.580.95.05", "580.95.05"));
        assert!(!is_versioned(".so.580.95.05", "580.95.05"));
        assert!(!is_versioned("libcuda.so.580.95.055", "580.95.05"));
    }
}
