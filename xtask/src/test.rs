//! `cargo xtask test`: everything CI checks, in the order that fails fastest.

use std::time::Duration;

use tessera_e2e::{
    K8sVersion, binaries,
    prometheus::{self, PrometheusBins, PrometheusVersion},
};

use crate::{
    controlplane,
    steps::{cargo, human, timed},
};

#[derive(clap::Args)]
pub struct Args {
    /// Kubernetes release for the whole suite (default: newest 1.37 release served).
    #[arg(long, env = "TESSERA_K8S_VERSION")]
    pub version: Option<K8sVersion>,
    /// Minor releases the end-to-end tests also run against (newest patch of each), so
    /// every supported minor is exercised. `--also-minor none` skips them.
    #[arg(long, default_value = "36", value_delimiter = ',')]
    pub also_minor: Vec<String>,
    /// Prometheus 3 release the monitoring tests scrape with, e.g. 3.16.0 (default: the
    /// newest the Go module proxy serves; the newest cached one when it cannot be asked).
    #[arg(long, env = "TESSERA_PROMETHEUS_VERSION")]
    pub prometheus: Option<PrometheusVersion>,
}

/// Builds Prometheus and promtool unless cached; the step prints the build time.
fn build_prometheus(version: Option<PrometheusVersion>) -> anyhow::Result<PrometheusBins> {
    let version = match version {
        Some(v) => v,
        None => match prometheus::newest_release() {
            Ok(v) => v,
            Err(e) => {
                let v = prometheus::newest_cached()?
                    .ok_or_else(|| anyhow::anyhow!("cannot pick a Prometheus release: {e}"))?;
                println!("(could not ask the Go module proxy: {e}; using the cached {v})");
                v
            }
        },
    };
    Ok(prometheus::ensure(version, &mut |line| println!("{line}"))?)
}

pub fn run(args: Args, _rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let mut timings: Vec<(String, Duration)> = Vec::new();
    let mut step = |name: &str, f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<()> {
        let (_, took) = timed(name, f)?;
        timings.push((name.to_string(), took));
        Ok(())
    };
    step("cargo fmt --check", &mut || {
        cargo(&["fmt", "--all", "--", "--check"], &[])
    })?;
    step(
        "cargo clippy (all targets, warnings are errors)",
        &mut || {
            cargo(
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
                &[],
            )
        },
    )?;
    step("CRD drift (cargo xtask crds --check)", &mut || {
        let root = crate::steps::repo_root()?;
        crate::crds::check(&root.join("crds"), &tessera_api::crds::render_all()?)
    })?;
    step(
        "chart and kustomize copies (cargo xtask chart --check)",
        &mut || crate::chart::check(&crate::steps::repo_root()?),
    )?;
    step(
        "docs against the code (cargo xtask docs --check)",
        &mut || crate::docs::check(&crate::steps::repo_root()?),
    )?;
    let mut bins = None;
    step("control plane binaries", &mut || {
        bins = Some(controlplane::build(args.version)?);
        Ok(())
    })?;
    let bins = bins.ok_or_else(|| anyhow::anyhow!("no binaries"))?;
    let mut helm = None;
    step("helm (for the chart's install test)", &mut || {
        helm = Some(controlplane::build_helm()?);
        Ok(())
    })?;
    let helm = helm.ok_or_else(|| anyhow::anyhow!("no helm"))?;
    let mut prom = None;
    step(
        "prometheus and promtool (for the monitoring tests)",
        &mut || {
            prom = Some(build_prometheus(args.prometheus)?);
            Ok(())
        },
    )?;
    let prom = prom.ok_or_else(|| anyhow::anyhow!("no prometheus"))?;
    let mut cdi_tools = None;
    step(
        "nvidia-ctk, the reference CDI library and runc (for the CDI checks)",
        &mut || {
            cdi_tools = Some(controlplane::build_cdi_tools()?);
            Ok(())
        },
    )?;
    let cdi_tools = cdi_tools.ok_or_else(|| anyhow::anyhow!("no CDI tools"))?;
    let mut runtime = None;
    step(
        "containerd, the CNI plugins and crictl (for the containerd nodes)",
        &mut || {
            runtime = Some(controlplane::build_runtime_tools()?);
            Ok(())
        },
    )?;
    let runtime = runtime.ok_or_else(|| anyhow::anyhow!("no container runtime"))?;
    // The end-to-end tests start the plugin and operator binaries and install the
    // simulated driver (its library and tools) on every node: build them first so they
    // never run stale ones.
    step(
        "cargo build -p tessera-plugin -p tessera-operator -p tessera-simdriver -p tessera-cdi-hook -p tessera-probe",
        &mut || {
            cargo(
                &[
                    "build",
                    "-p",
                    "tessera-plugin",
                    "-p",
                    "tessera-operator",
                    "-p",
                    "tessera-simdriver",
                    "-p",
                    "tessera-cdi-hook",
                    "-p",
                    "tessera-probe",
                    "--bins",
                    "--lib",
                ],
                &[],
            )
        },
    )?;
    // The containerd nodes import these: pause, the probe's image, and Tessera's image
    // (what `cargo xtask image` builds), which the chart installs.
    let mut node_images = None;
    let mut image_steps = Vec::new();
    step(
        "the containerd nodes' images (cargo xtask node-images)",
        &mut || {
            node_images = Some(crate::node_images::build(&mut image_steps)?);
            Ok(())
        },
    )?;
    let node_images = node_images.ok_or_else(|| anyhow::anyhow!("no node images"))?;
    let envs = |b: &tessera_e2e::BinDir| {
        let mut envs = vec![
            ("TESSERA_K8S_VERSION", b.version.to_string()),
            ("TESSERA_K8S_BIN_DIR", b.dir.display().to_string()),
            ("TESSERA_HELM", helm.display().to_string()),
            ("TESSERA_PROMETHEUS_BIN_DIR", prom.dir.display().to_string()),
            (
                "TESSERA_NVIDIA_CTK",
                cdi_tools.nvidia_ctk.display().to_string(),
            ),
            ("TESSERA_CDI_INJECT", cdi_tools.inject.display().to_string()),
            ("TESSERA_RUNC", cdi_tools.runc.display().to_string()),
            ("TESSERA_NODE_IMAGES", node_images.dir.display().to_string()),
        ];
        envs.extend(runtime.test_env());
        envs
    };
    step(
        &format!(
            "cargo test --workspace (end-to-end on Kubernetes {})",
            bins.version
        ),
        &mut || cargo(&["test", "--workspace", "--all-targets"], &envs(&bins)),
    )?;
    for minor in args.also_minor.iter().filter(|m| m.as_str() != "none") {
        let minor: u32 = minor.parse().map_err(|_| {
            anyhow::anyhow!("--also-minor takes minor numbers like 36, got {minor}")
        })?;
        if minor == bins.version.minor {
            continue;
        }
        let version = binaries::newest_release(minor).or_else(|e| {
            binaries::newest_cached()?
                .filter(|v| v.minor == minor)
                .ok_or(e)
        })?;
        let mut other = None;
        step(
            &format!("control plane binaries for {version}"),
            &mut || {
                other = Some(controlplane::build(Some(version))?);
                Ok(())
            },
        )?;
        let other = other.ok_or_else(|| anyhow::anyhow!("no binaries"))?;
        step(
            &format!("end-to-end tests on Kubernetes {}", other.version),
            &mut || cargo(&["test", "-p", "tessera-e2e", "--tests"], &envs(&other)),
        )?;
    }
    println!("\nSummary:");
    for (name, took) in &timings {
        println!("  {:>8}  {name}", human(*took));
    }
    println!("all checks passed");
    Ok(())
}
