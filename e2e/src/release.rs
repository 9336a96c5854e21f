//! Tessera installed on the test bed as a platform team installs it: `helm install` of
//! `charts/tessera` with the image built locally ([`NodeImages`]), on containerd nodes
//! ([`crate::containerd_node`]). The plugin runs as the chart's DaemonSet pod, in a
//! container with the chart's mounts, security context and ServiceAccount; the operator
//! as its Deployment, from the same image.
//!
//! The values ([`test_bed_values`]) are documented knobs of the chart: the image, the
//! driver root where the GPU Operator keeps a containerized driver, and two flags of the
//! plugin pointing at the simulated kernel's `/proc` files (`plugin.extraArgs`).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use anyhow::{Context, bail};

use crate::{ControlPlane, containerd_node::DRIVER_ROOT, node_images::NodeImages, repo_root};

/// The release name.
pub const RELEASE: &str = "tessera";
/// The namespace it is installed in.
pub const NAMESPACE: &str = "tessera-system";

/// The chart's values for the test bed.
pub fn test_bed_values(images: &NodeImages) -> String {
    let (repository, tag) = images.tessera_repository_and_tag();
    format!(
        "# Tessera on the test bed's containerd nodes.\n\
         image:\n  repository: {repository}\n  tag: {tag}\n\
         plugin:\n\
         \x20 driver:\n\
         \x20   # The simulated driver, where the GPU Operator keeps a containerized one.\n\
         \x20   root: {DRIVER_ROOT}\n\
         \x20 extraArgs:\n\
         \x20   # The simulated kernel shows what a real one shows under /proc in the\n\
         \x20   # driver root (a real node's /proc is the container's own).\n\
         \x20   - --nvidia-caps-root=/driver-root/proc/driver/nvidia/capabilities\n\
         \x20   - --proc-devices=/driver-root/proc/devices\n"
    )
}

/// Helm with its own config, cache and data directories (so it neither reads a user's
/// Helm setup nor races another test's), pointed at the test bed.
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Helm {
    /// Helm for the control plane `cp` (`$TESSERA_HELM` or the cached build).
    pub fn new(cp: &ControlPlane) -> anyhow::Result<Self> {
        Ok(Self {
            bin: crate::helm::for_tests()?,
            home: tempfile::tempdir()?,
            kubeconfig: cp.kubeconfig_path().to_path_buf(),
        })
    }

    /// Runs `helm <args>`.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        Command::new(&self.bin)
            .args(args)
            .env("HELM_CONFIG_HOME", self.home.path().join("config"))
            .env("HELM_CACHE_HOME", self.home.path().join("cache"))
            .env("HELM_DATA_HOME", self.home.path().join("data"))
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .with_context(|| format!("running {}", self.bin.display()))
    }

    /// Runs `helm <args>` and returns stdout; fails with Helm's output.
    pub fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args)?;
        if !out.status.success() {
            bail!(
                "helm {} failed:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `helm install` (or, with `upgrade`, `helm upgrade`) of the repository's chart with
    /// the values file `values` and `extra` arguments, waiting until every workload is
    /// ready.
    pub fn install(&self, values: &Path, upgrade: bool, extra: &[&str]) -> anyhow::Result<()> {
        let chart = repo_root().join("charts/tessera");
        let chart = chart.to_str().context("the chart's path is not UTF-8")?;
        let values = values.to_str().context("the values' path is not UTF-8")?;
        let mut args = if upgrade {
            vec!["upgrade", RELEASE, chart, "-n", NAMESPACE]
        } else {
            vec![
                "install",
                RELEASE,
                chart,
                "-n",
                NAMESPACE,
                "--create-namespace",
            ]
        };
        args.extend(["-f", values, "--wait", "--timeout", "5m"]);
        args.extend_from_slice(extra);
        self.ok(&args).map(|_| ())
    }
}
