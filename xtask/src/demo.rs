//! `cargo xtask demo`: a local cluster with Tessera running on three simulated GPU nodes.
//!
//! Builds what is needed, starts the control plane, installs the CRDs, DeviceClasses,
//! RBAC and sample policies, starts per node the real kubelet code (a hollow kubelet
//! with the kubelet's DRA manager) and a real `tessera-plugin` (simulated GPUs), runs the
//! sample workloads of `config/workloads`, adds a node whose pods are real containers
//! (containerd, runc, CNI; `tessera_e2e::containerd_node`) with a pod on it, prints what a
//! user would look at, and keeps running until Ctrl-C with a KUBECONFIG kubectl can use.

use std::{process::Command, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use tessera_e2e::{
    ControlPlane, K8sVersion, cluster,
    containerd_node::{ContainerdNode, NodeConfig},
    demo::DemoCluster,
    node_images::PAUSE_IN_IMAGE,
};

use crate::{
    controlplane,
    steps::{build_node_binaries, repo_root},
};

#[derive(clap::Args)]
pub struct Args {
    /// Kubernetes release (default: newest 1.37 release served).
    #[arg(long, env = "TESSERA_K8S_VERSION")]
    pub version: Option<K8sVersion>,
    /// Set everything up, print it, and stop again instead of waiting for Ctrl-C.
    #[arg(long)]
    pub once: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    println!("==> building tessera-plugin, tessera-operator and the simulated NVIDIA driver");
    build_node_binaries()?;
    let cp = controlplane::start(args.version, "default", true).await?;
    let client = cp.admin_client().await?;
    let root = repo_root()?;
    println!("\n==> installing CRDs, RBAC and DeviceClasses");
    cluster::install_crds(&client, &tessera_api::crds::all()).await?;
    for dir in ["config/rbac", "config/deviceclasses"] {
        for applied in cluster::apply_dir(&client, &root.join(dir), false).await? {
            println!("    {}", applied.object);
        }
    }
    println!(
        "\n==> starting three simulated GPU nodes (the real kubelet code and a real tessera-plugin each), the operator, and the sample policies"
    );
    let demo = DemoCluster::start(&cp, &mut |line| println!("    {line}")).await?;
    println!("\n==> running the sample workloads in config/workloads");
    let pods = demo.run_workloads(&cp, Duration::from_secs(120)).await?;
    println!("    {} pods running", pods.len());
    println!(
        "\n==> a node whose pods are real containers: containerd with CDI, runc and a CNI bridge (the images are built here)"
    );
    let containerd = match containerd_node(&cp).await {
        Ok(node) => Some(node),
        Err(e) => {
            // It needs root (its own namespaces, buildah); the rest of the demo does not.
            println!("    skipped: {e:#}");
            None
        }
    };

    let kubectl = cp.bins().path("kubectl");
    for what in [
        vec!["get", "nodes", "-o", "wide", "-L", "tessera.dev/pool"],
        vec!["get", "gsp"],
        vec!["describe", "gsp", "l4-mps-shares"],
        vec!["get", "gpunodes"],
        vec![
            "get",
            "gpunodes",
            "-o",
            "custom-columns=NODE:.metadata.name,GPU:.spec.gpus[*].index,STRATEGY:.spec.gpus[*].strategy,POLICY:.spec.gpus[*].policy",
        ],
        vec!["get", "pods", "-o", "wide"],
        vec![
            "get",
            "resourceclaims",
            "-o",
            "custom-columns=CLAIM:.metadata.name,NODE:.status.allocation.devices.results[0].pool,DEVICE:.status.allocation.devices.results[0].device,MADE:.status.devices[0].data",
        ],
        vec![
            "get",
            "resourceslices",
            "-o",
            "custom-columns=SLICE:.metadata.name,NODE:.spec.nodeName,GENERATION:.spec.pool.generation,DEVICES:.spec.devices[*].name",
        ],
    ] {
        println!("\n$ kubectl {}", what.join(" "));
        let out = Command::new(&kubectl)
            .args(&what)
            .env("KUBECONFIG", cp.kubeconfig_path())
            .output()
            .with_context(|| format!("running {}", kubectl.display()))?;
        print!("{}", shorten(&String::from_utf8_lossy(&out.stdout)));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
    println!("\n$ kubectl tessera status");
    let kubeconfig = cp.kubeconfig_path().to_path_buf();
    // The CLI makes a runtime of its own, so it runs off this one.
    let table = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let mut argv: Vec<std::ffi::OsString> = vec![
            "kubectl-tessera".into(),
            "status".into(),
            "--kubeconfig".into(),
        ];
        argv.push(kubeconfig.into_os_string());
        tessera_cli::run(argv, &mut out).map(|()| out)
    })
    .await??;
    print!("{}", shorten(&String::from_utf8_lossy(&table)));
    println!("\nThe demo cluster is running. In another terminal:\n");
    println!("export KUBECONFIG={}", cp.kubeconfig_path().display());
    println!("export PATH={}:$PATH", cp.bins().dir.display());
    println!("kubectl describe gpunode gpu-h100");
    println!("cargo run -q -p tessera-cli -- status   # kubectl tessera status");
    println!("kubectl delete pod finetune   # the plugin destroys its MIG partition");
    if args.once {
        println!("\n(--once: stopping)");
    } else {
        println!("\nPress Ctrl-C to stop everything.");
        tokio::signal::ctrl_c().await?;
    }
    drop(containerd);
    drop(demo);
    drop(cp);
    println!("stopped");
    Ok(())
}

/// The containerd node `cpu-ctr` (no GPUs) and a pod running on it in a container.
async fn containerd_node(cp: &ControlPlane) -> anyhow::Result<ContainerdNode> {
    controlplane::build_runtime_tools()?;
    let images = crate::node_images::build(&mut Vec::new())?;
    let node = ContainerdNode::start(
        cp,
        NodeConfig {
            name: "cpu-ctr",
            labels: &[],
            inventory: None,
        },
        &images,
    )
    .await?;
    let client = cp.admin_client().await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "in-a-container"},
        "spec": {
            "nodeName": "cpu-ctr",
            "containers": [{"name": "pause", "image": images.probe, "command": [PAUSE_IN_IMAGE]}]
        }
    }))?;
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await?;
    cluster::wait_pod_running(
        &client,
        "default",
        "in-a-container",
        Duration::from_secs(60),
    )
    .await?;
    println!("    node cpu-ctr is Ready; pod in-a-container runs in a runc container there");
    Ok(node)
}

/// Keeps the device lists readable: a slice of an H100 has 26 devices.
fn shorten(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.chars().count() > 160 {
                format!("{}…", l.chars().take(159).collect::<String>())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}
