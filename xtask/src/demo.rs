//! `cargo xtask demo`: a running local cluster with Tessera's API installed.
//!
//! For now: build, start the control plane, install the CRDs, DeviceClasses and samples,
//! show `kubectl get gsp`. It grows as the plugin and operator land.

use std::process::Command;

use anyhow::Context;
use tessera_e2e::{K8sVersion, cluster};

use crate::{controlplane, steps::repo_root};

#[derive(clap::Args)]
pub struct Args {
    /// Kubernetes release (default: newest 1.37 release served).
    #[arg(long, env = "TESSERA_K8S_VERSION")]
    pub version: Option<K8sVersion>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let cp = controlplane::start(args.version, "default").await?;
    let client = cp.admin_client().await?;
    let root = repo_root()?;
    println!("\n==> installing CRDs, DeviceClasses, RBAC and samples");
    cluster::install_crds(&client, &tessera_api::crds::all()).await?;
    for dir in ["config/rbac", "config/deviceclasses", "config/samples"] {
        for applied in cluster::apply_dir(&client, &root.join(dir), false).await? {
            println!("    {}", applied.object);
        }
    }
    let kubectl = cp.bins().path("kubectl");
    println!("\n$ kubectl get gsp");
    let out = Command::new(&kubectl)
        .args(["get", "gsp"])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .with_context(|| format!("running {}", kubectl.display()))?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let bin_dir = cp.bins().dir.clone();
    let state = cp.detach()?;
    println!("\nThe demo cluster keeps running. Use it with:\n");
    println!("export KUBECONFIG={}", state.kubeconfig.display());
    println!("export PATH={}:$PATH", bin_dir.display());
    println!("kubectl get gsp,gpunodes,deviceclasses,resourceslices");
    println!("\nStop it with: cargo xtask controlplane down");
    Ok(())
}
