//! The container runtime of the test bed's containerd nodes, built from the Go module proxy
//! and cached by version like the control-plane binaries ([`crate::binaries`]):
//!
//! - containerd ([`CONTAINERD_VERSION`], `github.com/containerd/containerd/v2`): the
//!   daemon, its runc shim (`containerd-shim-runc-v2`) and `ctr` (to import the locally
//!   built images). Static, without cgo, as containerd's own static release builds are
//!   (the btrfs snapshotter, the one part that needs cgo, is left out by its build tags).
//! - The CNI plugins ([`CNI_PLUGINS_VERSION`], `github.com/containernetworking/plugins`):
//!   `bridge`, `host-local`, `loopback` and `portmap`.
//! - `crictl` ([`CRICTL_VERSION`], `sigs.k8s.io/cri-tools`), the CRI's own client, to ask
//!   a node's containerd what the kubelet made.
//!
//! runc is the one of the CDI checks ([`crate::cdi_tools`]).
//!
//! Layout: `${TESSERA_CACHE}/runtime/{containerd,cni-plugins,crictl}-<version>/{bin,src}`;
//! built into `bin/.partial/` and moved into place when complete.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::bail;

use crate::binaries::{cache_root, create_dir, go_run_with, rename, tools_go, write};

/// The containerd release the test bed's nodes run (the newest 2.x the proxy served when
/// it was pinned).
pub const CONTAINERD_VERSION: &str = "v2.4.2";
/// The CNI plugins release.
pub const CNI_PLUGINS_VERSION: &str = "v1.10.0";
/// The cri-tools release `crictl` comes from.
pub const CRICTL_VERSION: &str = "v1.37.0";

/// The CNI plugins a node's network configuration uses.
pub const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];

/// One Go program set of this module: a module at a version, the packages to build and
/// how to stamp them.
struct Recipe {
    /// Cache directory name (`containerd-v2.4.2`).
    dir: String,
    module: &'static str,
    version: &'static str,
    /// (package, binary name).
    packages: Vec<(String, &'static str)>,
    ldflags: String,
    tags: &'static str,
    what: &'static str,
}

fn containerd() -> Recipe {
    const MODULE: &str = "github.com/containerd/containerd/v2";
    Recipe {
        dir: format!("containerd-{CONTAINERD_VERSION}"),
        module: MODULE,
        version: CONTAINERD_VERSION,
        packages: ["containerd", "containerd-shim-runc-v2", "ctr"]
            .into_iter()
            .map(|b| (format!("{MODULE}/cmd/{b}"), b))
            .collect(),
        // What containerd's Makefile stamps, so `containerd --version` (and the node's
        // `containerRuntimeVersion`) name the release.
        ldflags: format!(
            "-s -w -X {MODULE}/version.Version={} -X {MODULE}/version.Package=github.com/containerd/containerd",
            CONTAINERD_VERSION.trim_start_matches('v')
        ),
        // The Makefile's tags for a static build; `no_grpc` is only for the shim there,
        // and the daemon and ctr need gRPC.
        tags: "urfave_cli_no_docs osusergo netgo static_build",
        what: "containerd, its runc shim and ctr",
    }
}

fn cni_plugins() -> Recipe {
    const MODULE: &str = "github.com/containernetworking/plugins";
    let dirs = [
        ("bridge", "main"),
        ("host-local", "ipam"),
        ("loopback", "main"),
        ("portmap", "meta"),
    ];
    Recipe {
        dir: format!("cni-plugins-{CNI_PLUGINS_VERSION}"),
        module: MODULE,
        version: CNI_PLUGINS_VERSION,
        packages: dirs
            .into_iter()
            .map(|(b, kind)| (format!("{MODULE}/plugins/{kind}/{b}"), b))
            .collect(),
        ldflags: format!(
            "-s -w -X {MODULE}/pkg/utils/buildversion.BuildVersion={CNI_PLUGINS_VERSION}"
        ),
        tags: "",
        what: "the CNI plugins bridge, host-local, loopback and portmap",
    }
}

fn crictl() -> Recipe {
    const MODULE: &str = "sigs.k8s.io/cri-tools";
    Recipe {
        dir: format!("crictl-{CRICTL_VERSION}"),
        module: MODULE,
        version: CRICTL_VERSION,
        packages: vec![(format!("{MODULE}/cmd/crictl"), "crictl")],
        ldflags: format!(
            "-s -w -X {MODULE}/pkg/version.Version={}",
            CRICTL_VERSION.trim_start_matches('v')
        ),
        tags: "",
        what: "crictl",
    }
}

fn runtime_dir() -> anyhow::Result<PathBuf> {
    Ok(cache_root()?.join("runtime"))
}

/// Where a node's runtime binaries are.
#[derive(Clone, Debug)]
pub struct RuntimeTools {
    /// `containerd`, `containerd-shim-runc-v2` and `ctr`.
    pub containerd_bin: PathBuf,
    /// The CNI plugins' directory (containerd's `bin_dirs`).
    pub cni_bin: PathBuf,
    /// `crictl`.
    pub crictl: PathBuf,
    /// `runc`.
    pub runc: PathBuf,
}

impl RuntimeTools {
    /// The tools tests use, without building: `$TESSERA_CONTAINERD_BIN_DIR`,
    /// `$TESSERA_CNI_BIN_DIR`, `$TESSERA_CRICTL` and `$TESSERA_RUNC`, else the cached ones.
    pub fn for_tests() -> anyhow::Result<Self> {
        let pick = |env: &str, cached: PathBuf, probe: &str| -> anyhow::Result<PathBuf> {
            if let Some(p) = std::env::var_os(env) {
                return Ok(p.into());
            }
            if cached.join(probe).is_file() || cached.is_file() {
                return Ok(cached);
            }
            bail!(
                "{} is not built: run `cargo xtask controlplane build` (cargo xtask test does), or set {env}",
                cached.display()
            )
        };
        let root = runtime_dir()?;
        Ok(Self {
            containerd_bin: pick(
                "TESSERA_CONTAINERD_BIN_DIR",
                root.join(containerd().dir).join("bin"),
                "containerd",
            )?,
            cni_bin: pick(
                "TESSERA_CNI_BIN_DIR",
                root.join(cni_plugins().dir).join("bin"),
                "bridge",
            )?,
            crictl: pick(
                "TESSERA_CRICTL",
                root.join(crictl().dir).join("bin/crictl"),
                "",
            )?,
            runc: crate::cdi_tools::CdiTools::runc_for_tests()?,
        })
    }

    /// Builds whatever is not cached (runc with the CDI tools); `progress` gets one line
    /// at a time, with how long each build took.
    pub fn ensure(progress: &mut dyn FnMut(&str)) -> anyhow::Result<Self> {
        let root = runtime_dir()?;
        let containerd_bin = ensure(&root, &containerd(), progress)?;
        let cni_bin = ensure(&root, &cni_plugins(), progress)?;
        let crictl = ensure(&root, &crictl(), progress)?.join("crictl");
        let runc = crate::cdi_tools::ensure_runc(progress)?;
        Ok(Self {
            containerd_bin,
            cni_bin,
            crictl,
            runc,
        })
    }

    /// `containerd`.
    pub fn containerd(&self) -> PathBuf {
        self.containerd_bin.join("containerd")
    }

    /// `ctr`.
    pub fn ctr(&self) -> PathBuf {
        self.containerd_bin.join("ctr")
    }

    /// The environment `cargo xtask test` hands the tests.
    pub fn test_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "TESSERA_CONTAINERD_BIN_DIR",
                self.containerd_bin.display().to_string(),
            ),
            ("TESSERA_CNI_BIN_DIR", self.cni_bin.display().to_string()),
            ("TESSERA_CRICTL", self.crictl.display().to_string()),
        ]
    }
}

/// Builds `recipe` unless all its binaries are cached; returns their directory.
fn ensure(root: &Path, recipe: &Recipe, progress: &mut dyn FnMut(&str)) -> anyhow::Result<PathBuf> {
    let dir = root.join(&recipe.dir);
    let bin = dir.join("bin");
    if recipe.packages.iter().all(|(_, b)| bin.join(b).is_file()) {
        progress(&format!(
            "{} {}: cached in {}",
            recipe.what,
            recipe.version,
            bin.display()
        ));
        return Ok(bin);
    }
    let started = Instant::now();
    let src = dir.join("src");
    let partial = bin.join(".partial");
    create_dir(&src)?;
    create_dir(&partial)?;
    write(
        &src.join("go.mod"),
        &format!(
            "// Generated by tessera-e2e: builds {} from the module proxy.\nmodule tessera.local/{}\n\ngo 1.24.0\n\nrequire {} {}\n",
            recipe.what, recipe.dir, recipe.module, recipe.version
        ),
    )?;
    let packages: Vec<String> = recipe.packages.iter().map(|(p, _)| p.clone()).collect();
    write(&src.join("tools.go"), &tools_go(&packages))?;
    progress(&format!(
        "  {} {}: go mod tidy",
        recipe.what, recipe.version
    ));
    go_run_with(&["mod", "tidy"], &src, &[], progress)?;
    for (package, name) in &recipe.packages {
        let target = partial.join(name);
        let target_str = target.display().to_string();
        progress(&format!("  go build {name} {}", recipe.version));
        let mut args = vec![
            "build",
            "-trimpath",
            "-ldflags",
            &recipe.ldflags,
            "-o",
            &target_str,
        ];
        if !recipe.tags.is_empty() {
            args.extend(["-tags", recipe.tags]);
        }
        args.push(package);
        go_run_with(&args, &src, &[], progress)?;
    }
    for (_, name) in &recipe.packages {
        rename(&partial.join(name), &bin.join(name))?;
    }
    progress(&format!(
        "  {} {} built in {}s",
        recipe.what,
        recipe.version,
        started.elapsed().as_secs()
    ));
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cni_plugin_a_node_names_is_built() {
        let built: Vec<&str> = cni_plugins().packages.iter().map(|(_, b)| *b).collect();
        assert_eq!(built, CNI_PLUGINS);
    }
}
