//! `cargo xtask controlplane build|up|env|down`.

use std::path::PathBuf;

use anyhow::Context;
use tessera_e2e::{
    BinDir, ControlPlane, ControlPlaneOptions, K8sVersion, binaries,
    controlplane::{read_state, stop_detached},
};

use crate::steps::{human, timed};

#[derive(clap::Subcommand)]
pub enum Command {
    /// Build kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, the
    /// hollow kubelet, Helm, the CDI tools (NVIDIA's generator, the reference CDI
    /// library, runc) and the containerd nodes' runtime (containerd, the CNI plugins,
    /// crictl) from the Go module proxy into the cache (skips what is cached).
    Build(VersionArg),
    /// Start the control plane and print the KUBECONFIG export.
    Up {
        #[command(flatten)]
        version: VersionArg,
        /// Return once it is ready and leave it running (stop it with `controlplane down`).
        #[arg(long)]
        detach: bool,
    },
    /// Print the environment (KUBECONFIG, PATH with kubectl) of the running control plane.
    Env,
    /// Stop the detached control plane; no process is left behind.
    Down,
}

#[derive(clap::Args, Clone)]
pub struct VersionArg {
    /// Kubernetes release, e.g. 1.37.2 or 1.36.3. Default: the newest 1.37 release the Go
    /// module proxy serves (the newest cached one when the proxy cannot be reached).
    #[arg(long, env = "TESSERA_K8S_VERSION")]
    pub version: Option<K8sVersion>,
}

/// Where `up --detach` keeps its state: outside the repository, next to the binaries.
pub fn run_dir(name: &str) -> anyhow::Result<PathBuf> {
    Ok(binaries::cache_root()?.join("run").join(name))
}

/// The version to use when none is given.
pub fn resolve(version: Option<K8sVersion>) -> anyhow::Result<K8sVersion> {
    if let Some(v) = version {
        return Ok(v);
    }
    match binaries::newest_release(37) {
        Ok(v) => Ok(v),
        Err(e) => {
            let cached = binaries::newest_cached()?;
            let v = cached.with_context(|| format!("cannot pick a Kubernetes version: {e}"))?;
            println!("(could not ask the Go module proxy: {e}; using the cached {v})");
            Ok(v)
        }
    }
}

/// Builds what is missing and returns the binaries.
pub fn build(version: Option<K8sVersion>) -> anyhow::Result<BinDir> {
    let version = resolve(version)?;
    let (bins, _) = timed(
        &format!("control plane binaries for Kubernetes {version}"),
        || Ok(binaries::ensure(version, &mut |line| println!("{line}"))?),
    )?;
    Ok(bins)
}

/// Builds Helm (for the chart's install test) unless it is cached; prints the build time.
pub fn build_helm() -> anyhow::Result<PathBuf> {
    let (helm, _) = timed(
        &format!(
            "helm {} from the Go module proxy",
            tessera_e2e::helm::HELM_VERSION
        ),
        || Ok(tessera_e2e::helm::ensure(&mut |line| println!("{line}"))?),
    )?;
    Ok(helm)
}

/// Builds NVIDIA's CDI generator and the reference CDI library's helper (for the CDI
/// checks) unless they are cached; prints the build time.
pub fn build_cdi_tools() -> anyhow::Result<tessera_e2e::cdi_tools::CdiTools> {
    if !std::path::Path::new(tessera_e2e::cdi_tools::SECCOMP_HEADER).is_file() {
        // runc is built with seccomp, as its releases are.
        crate::image::install_debian_packages(&["libseccomp-dev"])?;
    }
    let (tools, _) = timed(
        &format!(
            "nvidia-ctk {}, the CDI {} helper and runc {} from the Go module proxy",
            tessera_e2e::cdi_tools::NCT_VERSION,
            tessera_e2e::cdi_tools::CDI_VERSION,
            tessera_e2e::cdi_tools::RUNC_VERSION
        ),
        || tessera_e2e::cdi_tools::CdiTools::ensure(&mut |line| println!("{line}")),
    )?;
    Ok(tools)
}

/// Builds containerd, the CNI plugins and crictl (for the test bed's containerd nodes)
/// unless they are cached; prints the build time.
pub fn build_runtime_tools() -> anyhow::Result<tessera_e2e::runtime_tools::RuntimeTools> {
    let (tools, _) = timed(
        &format!(
            "containerd {}, the CNI plugins {} and crictl {} from the Go module proxy",
            tessera_e2e::runtime_tools::CONTAINERD_VERSION,
            tessera_e2e::runtime_tools::CNI_PLUGINS_VERSION,
            tessera_e2e::runtime_tools::CRICTL_VERSION
        ),
        || tessera_e2e::runtime_tools::RuntimeTools::ensure(&mut |line| println!("{line}")),
    )?;
    Ok(tools)
}

pub async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Build(v) => {
            let bins = build(v.version)?;
            println!("binaries in {}", bins.dir.display());
            let helm = build_helm()?;
            println!("helm in {}", helm.display());
            let tools = build_cdi_tools()?;
            println!(
                "nvidia-ctk in {}, tessera-cdi-inject in {}, runc in {}",
                tools.nvidia_ctk.display(),
                tools.inject.display(),
                tools.runc.display()
            );
            let runtime = build_runtime_tools()?;
            println!(
                "containerd in {}, CNI plugins in {}, crictl in {}",
                runtime.containerd_bin.display(),
                runtime.cni_bin.display(),
                runtime.crictl.display()
            );
            Ok(())
        }
        Command::Up { version, detach } => up(version.version, detach).await,
        Command::Env => {
            let state = read_state(&run_dir("default")?)?;
            print_env(&state.kubeconfig, &state.bin_dir);
            Ok(())
        }
        Command::Down => {
            let dir = run_dir("default")?;
            let n = stop_detached(&dir)?;
            println!("stopped the control plane ({n} processes were running)");
            Ok(())
        }
    }
}

fn print_env(kubeconfig: &std::path::Path, bin_dir: &std::path::Path) {
    println!("export KUBECONFIG={}", kubeconfig.display());
    println!("export PATH={}:$PATH", bin_dir.display());
}

/// Starts a control plane in `run/<name>`; returns it still attached.
/// Starts a control plane in the run directory `name`; with `node_network`, containerd
/// nodes can join it (`tessera_e2e::ControlPlaneOptions::node_network`).
pub async fn start(
    version: Option<K8sVersion>,
    name: &str,
    node_network: bool,
) -> anyhow::Result<ControlPlane> {
    let bins = build(version)?;
    let dir = run_dir(name)?;
    if read_state(&dir).is_ok() {
        let n = stop_detached(&dir)?;
        if n > 0 {
            println!(
                "stopped a previous control plane in {} ({n} processes)",
                dir.display()
            );
        }
    }
    println!("\n==> starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager");
    let started = std::time::Instant::now();
    let cp = ControlPlane::start(ControlPlaneOptions {
        dir: Some(dir),
        node_network,
        ..ControlPlaneOptions::new(bins)
    })
    .await?;
    println!(
        "<== control plane ready at {} in {}",
        cp.server(),
        human(started.elapsed())
    );
    println!("    logs: {}", cp.dir().join("logs").display());
    Ok(cp)
}

async fn up(version: Option<K8sVersion>, detach: bool) -> anyhow::Result<()> {
    let cp = start(version, "default", false).await?;
    if detach {
        let bin_dir = cp.bins().dir.clone();
        let state = cp.detach()?;
        println!("\nThe control plane keeps running. Point kubectl at it with:\n");
        print_env(&state.kubeconfig, &bin_dir);
        println!("\nStop it with: cargo xtask controlplane down");
        return Ok(());
    }
    println!("\nPoint kubectl at it with:\n");
    print_env(cp.kubeconfig_path(), &cp.bins().dir);
    println!("\nPress Ctrl-C to stop.");
    tokio::signal::ctrl_c().await?;
    drop(cp);
    println!("stopped");
    Ok(())
}
