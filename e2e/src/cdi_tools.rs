//! The real consumers of Tessera's CDI specs, built from the Go module proxy and cached
//! like the control-plane binaries ([`crate::binaries`]):
//!
//! - NVIDIA's own generator, `nvidia-ctk` of `github.com/NVIDIA/nvidia-container-toolkit`
//!   ([`NCT_VERSION`]), whose `cdi generate` runs against a simulated node's driver root
//!   through the simulated `libnvidia-ml` ([`generate`]). It loads NVML with `dlopen`
//!   (go-nvml), so it is built with cgo.
//! - `tessera-cdi-inject` (`e2e/cdi-inject/main.go`): the reference CDI library
//!   (`tags.cncf.io/container-device-interface`, [`CDI_VERSION`], the code containerd and
//!   CRI-O run) loading a spec directory and injecting devices into an OCI runtime spec
//!   ([`inject`]).
//!
//! - `runc` ([`RUNC_VERSION`], `github.com/opencontainers/runc`, cgo for its `nsenter`,
//!   with seccomp as runc's own releases are: a pod asking for the `RuntimeDefault`
//!   profile, as the operator's does, cannot start on a runc without it), which runs a
//!   probe in a container made from the OCI spec the reference library produced
//!   ([`crate::runc`]), and the containers of the test bed's containerd nodes. It links
//!   libseccomp (Debian's `libseccomp-dev` to build, `libseccomp2` to run).
//!
//! Layout: `${TESSERA_CACHE}/cdi-tools/{nvidia-ctk-<version>,runc-<version>-seccomp}/{bin,src}` and
//! `${TESSERA_CACHE}/cdi-tools/cdi-inject-<source hash>/{bin,src}`; built into
//! `bin/.partial/` and moved into place when complete.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, bail};

use crate::binaries::{cache_root, create_dir, go_run, go_run_with, rename, tools_go, write};

/// The NVIDIA Container Toolkit release whose generator the specs are checked against.
pub const NCT_VERSION: &str = "v1.20.2";
/// The runc release containers are run with.
pub const RUNC_VERSION: &str = "v1.5.3";
/// The reference CDI library release (what containerd 2.x vendors).
pub const CDI_VERSION: &str = "v1.1.2";
const NCT_MODULE: &str = "github.com/NVIDIA/nvidia-container-toolkit";
const INJECT_SOURCE: &str = include_str!("../cdi-inject/main.go");
/// The OCI runtime-spec module release the helper is built with.
const RUNTIME_SPEC_VERSION: &str = "v1.3.0";

fn tools_dir() -> anyhow::Result<PathBuf> {
    Ok(cache_root()?.join("cdi-tools"))
}

fn ctk_dir() -> anyhow::Result<PathBuf> {
    Ok(tools_dir()?.join(format!("nvidia-ctk-{NCT_VERSION}")))
}

fn runc_dir() -> anyhow::Result<PathBuf> {
    Ok(tools_dir()?.join(format!("runc-{RUNC_VERSION}-seccomp")))
}

/// The header a seccomp build of runc compiles against (Debian's `libseccomp-dev`).
pub const SECCOMP_HEADER: &str = "/usr/include/seccomp.h";

fn inject_dir() -> anyhow::Result<PathBuf> {
    // FNV-1a of the source: a cache key.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in INJECT_SOURCE
        .bytes()
        .chain(CDI_VERSION.bytes())
        .chain(RUNTIME_SPEC_VERSION.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Ok(tools_dir()?.join(format!("cdi-inject-{h:016x}")))
}

/// The two tools.
#[derive(Clone, Debug)]
pub struct CdiTools {
    /// `nvidia-ctk`.
    pub nvidia_ctk: PathBuf,
    /// `tessera-cdi-inject`.
    pub inject: PathBuf,
    /// `runc`.
    pub runc: PathBuf,
}

impl CdiTools {
    /// The tools tests use, without building: `$TESSERA_NVIDIA_CTK` and
    /// `$TESSERA_CDI_INJECT`, else the cached ones.
    pub fn for_tests() -> anyhow::Result<Self> {
        let pick = |env: &str, cached: PathBuf| -> anyhow::Result<PathBuf> {
            if let Some(p) = std::env::var_os(env) {
                return Ok(p.into());
            }
            if cached.is_file() {
                return Ok(cached);
            }
            bail!(
                "{} is not built: run `cargo xtask controlplane build` (cargo xtask test does), or set {env}",
                cached.display()
            )
        };
        Ok(Self {
            nvidia_ctk: pick("TESSERA_NVIDIA_CTK", ctk_dir()?.join("bin/nvidia-ctk"))?,
            inject: pick(
                "TESSERA_CDI_INJECT",
                inject_dir()?.join("bin/tessera-cdi-inject"),
            )?,
            runc: pick("TESSERA_RUNC", runc_dir()?.join("bin/runc"))?,
        })
    }

    /// runc for tests, without building: `$TESSERA_RUNC`, else the cached one.
    pub fn runc_for_tests() -> anyhow::Result<PathBuf> {
        if let Some(p) = std::env::var_os("TESSERA_RUNC") {
            return Ok(p.into());
        }
        let cached = runc_dir()?.join("bin/runc");
        if cached.is_file() {
            return Ok(cached);
        }
        bail!(
            "{} is not built: run `cargo xtask controlplane build` (cargo xtask test does), or set TESSERA_RUNC",
            cached.display()
        )
    }

    /// Builds whatever is not cached; `progress` gets one line at a time, with how long
    /// each build took.
    pub fn ensure(progress: &mut dyn FnMut(&str)) -> anyhow::Result<Self> {
        let nvidia_ctk = ensure_ctk(progress)?;
        let inject = ensure_inject(progress)?;
        let runc = ensure_runc(progress)?;
        Ok(Self {
            nvidia_ctk,
            inject,
            runc,
        })
    }
}

/// Builds runc (with seccomp) unless it is cached; returns its path.
pub(crate) fn ensure_runc(progress: &mut dyn FnMut(&str)) -> anyhow::Result<PathBuf> {
    let root = runc_dir()?;
    let bin = root.join("bin/runc");
    if bin.is_file() {
        progress(&format!("runc {RUNC_VERSION}: cached in {}", bin.display()));
        return Ok(bin);
    }
    if !Path::new(SECCOMP_HEADER).is_file() {
        bail!(
            "building runc with seccomp needs libseccomp's headers ({SECCOMP_HEADER}): install Debian's libseccomp-dev (cargo xtask test does when run as root)"
        );
    }
    let started = Instant::now();
    let src = root.join("src");
    let partial = root.join("bin/.partial");
    create_dir(&src)?;
    create_dir(&partial)?;
    let module = "github.com/opencontainers/runc";
    write(
        &src.join("go.mod"),
        &format!(
            "// Generated by tessera-e2e: builds runc from the module proxy.\nmodule tessera.local/runc-bin\n\ngo 1.24.0\n\nrequire {module} {RUNC_VERSION}\n"
        ),
    )?;
    write(&src.join("tools.go"), &tools_go(&[module.to_string()]))?;
    progress(&format!("  runc {RUNC_VERSION}: go mod tidy"));
    go_run(&["mod", "tidy"], &src, progress)?;
    let target = partial.join("runc");
    let target_str = target.display().to_string();
    // What runc's Makefile stamps, so `runc --version` names the release.
    let ldflags = format!("-X main.version={}", RUNC_VERSION.trim_start_matches('v'));
    progress(&format!("  runc {RUNC_VERSION}: go build (cgo, seccomp)"));
    go_run_with(
        &[
            "build",
            "-trimpath",
            "-tags",
            "seccomp",
            "-ldflags",
            &ldflags,
            "-o",
            &target_str,
            module,
        ],
        &src,
        &[("CGO_ENABLED", "1")],
        progress,
    )?;
    rename(&target, &bin)?;
    progress(&format!(
        "  runc {RUNC_VERSION} built in {}s",
        started.elapsed().as_secs()
    ));
    Ok(bin)
}

fn ensure_ctk(progress: &mut dyn FnMut(&str)) -> anyhow::Result<PathBuf> {
    let root = ctk_dir()?;
    let bin = root.join("bin/nvidia-ctk");
    if bin.is_file() {
        progress(&format!(
            "nvidia-ctk {NCT_VERSION}: cached in {}",
            bin.display()
        ));
        return Ok(bin);
    }
    let started = Instant::now();
    let src = root.join("src");
    let partial = root.join("bin/.partial");
    create_dir(&src)?;
    create_dir(&partial)?;
    write(
        &src.join("go.mod"),
        &format!(
            "// Generated by tessera-e2e: builds NVIDIA's CDI generator from the module proxy.\nmodule tessera.local/nvidia-ctk-bin\n\ngo 1.26.0\n\nrequire {NCT_MODULE} {NCT_VERSION}\n"
        ),
    )?;
    let cmd = format!("{NCT_MODULE}/cmd/nvidia-ctk");
    write(&src.join("tools.go"), &tools_go(std::slice::from_ref(&cmd)))?;
    progress(&format!("  nvidia-ctk {NCT_VERSION}: go mod tidy"));
    go_run(&["mod", "tidy"], &src, progress)?;
    let target = partial.join("nvidia-ctk");
    let target_str = target.display().to_string();
    progress(&format!(
        "  nvidia-ctk {NCT_VERSION}: go build (cgo, for go-nvml's dlopen)"
    ));
    go_run_with(
        &["build", "-trimpath", "-o", &target_str, &cmd],
        &src,
        &[("CGO_ENABLED", "1")],
        progress,
    )?;
    rename(&target, &bin)?;
    progress(&format!(
        "  nvidia-ctk {NCT_VERSION} built in {}s",
        started.elapsed().as_secs()
    ));
    Ok(bin)
}

fn ensure_inject(progress: &mut dyn FnMut(&str)) -> anyhow::Result<PathBuf> {
    let root = inject_dir()?;
    let bin = root.join("bin/tessera-cdi-inject");
    if bin.is_file() {
        progress(&format!("tessera-cdi-inject: cached in {}", bin.display()));
        return Ok(bin);
    }
    let started = Instant::now();
    let src = root.join("src");
    let partial = root.join("bin/.partial");
    create_dir(&src)?;
    create_dir(&partial)?;
    write(
        &src.join("go.mod"),
        &format!(
            "// Generated by tessera-e2e: the reference CDI library from the module proxy.\nmodule tessera.local/cdi-inject\n\ngo 1.24.0\n\nrequire (\n\ttags.cncf.io/container-device-interface {CDI_VERSION}\n\tgithub.com/opencontainers/runtime-spec {RUNTIME_SPEC_VERSION}\n)\n"
        ),
    )?;
    write(&src.join("main.go"), INJECT_SOURCE)?;
    progress(&format!(
        "  tessera-cdi-inject (CDI {CDI_VERSION}): go mod tidy"
    ));
    go_run(&["mod", "tidy"], &src, progress)?;
    let target = partial.join("tessera-cdi-inject");
    let target_str = target.display().to_string();
    go_run(
        &["build", "-trimpath", "-o", &target_str, "."],
        &src,
        progress,
    )?;
    rename(&target, &bin)?;
    progress(&format!(
        "  tessera-cdi-inject built in {}s",
        started.elapsed().as_secs()
    ));
    Ok(bin)
}

/// Runs `nvidia-ctk cdi generate` against the simulated driver root `root`, writing the
/// spec to `out` (its extension picks the format). NVIDIA's generator reads the MIG minors
/// table at the host's `/proc/driver/nvidia-caps/mig-minors`, not under the driver root,
/// so it runs in a mount namespace of its own where the root's `proc/driver` is bound over
/// `/proc/driver`: the node's kernel, as the simulated node has it (root needed).
pub fn generate(nvidia_ctk: &Path, root: &Path, out: &Path) -> anyhow::Result<String> {
    let output = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0/proc/driver" /proc/driver && exec "$1" cdi generate --driver-root "$0" --output "$2""#)
        .arg(root)
        .arg(nvidia_ctk)
        .arg(out)
        .output()
        .context("running nvidia-ctk cdi generate (unshare)")?;
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        bail!(
            "nvidia-ctk cdi generate --driver-root {} failed ({}):\n{log}",
            root.display(),
            output.status
        );
    }
    Ok(log)
}

/// Injects `devices` (fully qualified CDI ids) from the specs in `spec_dir` into the OCI
/// spec `base` (an empty one when `None`) with the reference CDI library; returns the
/// resulting OCI spec.
pub fn inject(
    helper: &Path,
    spec_dir: &Path,
    base: Option<&Path>,
    devices: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let mut cmd = Command::new(helper);
    cmd.arg("--spec-dir").arg(spec_dir);
    if let Some(b) = base {
        cmd.arg("--base").arg(b);
    }
    let output = cmd
        .args(devices)
        .output()
        .with_context(|| format!("running {}", helper.display()))?;
    if !output.status.success() {
        bail!(
            "the reference CDI library refused {devices:?} from {}:\n{}",
            spec_dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("reading the injected OCI spec")
}
