//! A real container made from a CDI spec: the reference CDI library injects a device into
//! runc's own default config, and runc (built from the module proxy, [`crate::cdi_tools`])
//! runs `tessera-probe` in it, with the spec's device nodes, mounts and hooks applied by
//! the runtime itself. Until the test bed's kubelets run containerd (a later change), this
//! is where a CDI spec meets a container runtime.
//!
//! The root file system is distroless-like, made from this machine's files: the probe and
//! the C library it and the driver's libraries need, in Debian's multiarch directory, an
//! empty `/etc`, no shell and no `ldconfig`. The one thing the test bed adds to what the
//! spec gives is the simulated kernel (the node's `var/lib/tessera-sim`, read-only at the
//! same path): a real driver keeps that state in the kernel, which every container of a
//! node shares without a mount.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// The `tessera-probe` binary: `$TESSERA_PROBE_BIN`, else next to the test executable's
/// target directory (`cargo xtask test` builds it first).
pub fn probe_binary() -> anyhow::Result<PathBuf> {
    crate::process::workspace_binary("tessera-probe", "TESSERA_PROBE_BIN")
}

/// Where the probe is in the container.
pub const PROBE_IN_CONTAINER: &str = "/usr/local/bin/tessera-probe";
/// The C library's directory in the container.
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// What the probe said and how it ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Exit code.
    pub code: i32,
    /// Its stdout and stderr.
    pub output: String,
    /// The container's root file system, after the run (its `/etc/ld.so.cache`, links).
    pub rootfs: PathBuf,
}

/// The shared objects `binary` needs, as this machine's loader resolves them.
fn needed(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = l
                .split("=>")
                .nth(1)
                .unwrap_or(l)
                .split_whitespace()
                .next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Makes the root file system under `rootfs`: the probe and the C library its loader and
/// the simulated driver's libraries (`driver_lib`) need.
pub fn make_rootfs(rootfs: &Path, probe: &Path, driver_lib: &Path) -> anyhow::Result<()> {
    for dir in [
        "etc",
        "tmp",
        "proc",
        "sys",
        "dev",
        "usr/local/bin",
        LIB_DIR,
        "lib64",
    ] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    std::fs::copy(
        probe,
        rootfs.join(PROBE_IN_CONTAINER.trim_start_matches('/')),
    )
    .context("copying the probe")?;
    let mut libs = needed(probe)?;
    libs.extend(needed(driver_lib)?);
    for lib in libs {
        let name = lib.file_name().context("a library without a name")?;
        let to = if name.to_string_lossy().starts_with("ld-linux") {
            rootfs.join("lib64").join(name)
        } else {
            rootfs.join(LIB_DIR).join(name)
        };
        if !to.exists() {
            std::fs::copy(&lib, &to).with_context(|| format!("copying {}", lib.display()))?;
        }
    }
    Ok(())
}

/// runc's default config (`runc spec`) for a container running the probe in `rootfs`,
/// with the simulated kernel at `kernel` (see the module docs).
pub fn base_config(runc: &Path, bundle: &Path, kernel: &Path) -> anyhow::Result<Value> {
    let out = Command::new(runc)
        .arg("spec")
        .current_dir(bundle)
        .output()
        .context("running runc spec")?;
    if !out.status.success() {
        bail!("runc spec: {}", String::from_utf8_lossy(&out.stderr));
    }
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    std::fs::remove_file(&path)?;
    config["root"] = json!({"path": "rootfs", "readonly": false});
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!([PROBE_IN_CONTAINER]);
    config["process"]["env"] = json!(["PATH=/usr/local/bin:/usr/bin:/bin"]);
    let kernel_path = kernel.display().to_string();
    config["mounts"]
        .as_array_mut()
        .context("runc's config has no mounts")?
        .push(json!({
            "destination": format!("/{}", tessera_simdriver::root::KERNEL_DIR),
            "source": kernel_path,
            "type": "bind",
            "options": ["rbind", "ro"]
        }));
    Ok(config)
}

/// Runs the container of `config` (an OCI spec) from `bundle` with `runc run`, named `id`.
pub fn run(runc: &Path, bundle: &Path, id: &str, config: &Value) -> anyhow::Result<Outcome> {
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec_pretty(config)?,
    )?;
    let state = bundle.join("runc-state");
    let out = Command::new(runc)
        .arg("--root")
        .arg(&state)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .output()
        .context("running runc run")?;
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // runc removes what it made for the container when `run` returns.
    Ok(Outcome {
        code: out.status.code().unwrap_or(-1),
        output,
        rootfs: bundle.join("rootfs"),
    })
}
