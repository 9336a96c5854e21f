//! The kubelet of one simulated node: the **real kubelet code** (`tessera-hollow-kubelet`,
//! built from `e2e/hollow-kubelet/` against the suite's Kubernetes release), with the
//! kubelet's own plugin manager, DRA manager, pod workers and status manager. Its
//! container runtime is simulated (an in-process fake CRI), so pods "run" without
//! containers; or, started with [`HollowKubelet::start_with_runtime`], it is a containerd
//! node's kubelet and pods run in real containers ([`crate::containerd_node`]).
//!
//! The kubelet registers its Node itself, finds the plugin's registration socket in
//! `<root>/plugins_registry/` with its plugin watcher, registers it through its own gRPC
//! client, prepares and unprepares claims over the plugin's DRA socket, hands the CDI ids
//! to the runtime (recorded in `<root>/containers.jsonl`), watches device health and fills
//! `allocatedResourcesStatus` in the pod status. It opens no TCP port.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde::Deserialize;

use crate::{BinDir, ControlPlane, wait::eventually};

/// How long a kubelet gets to register its Node and report Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One `CreateContainer` the kubelet asked of the (fake) runtime.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    /// UID of the pod.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the pod.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Runtime container id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The CDI device ids the kubelet passed.
    pub cdi_devices: Vec<String>,
}

/// A real container runtime for the kubelet (`--container-runtime-endpoint`) and what
/// goes with it.
#[derive(Clone, Debug)]
pub struct RealRuntime {
    /// The runtime's CRI endpoint as the kubelet names it (`unix:///run/...`).
    pub endpoint: String,
    /// The node's address; the kubelet server listens there.
    pub node_ip: std::net::Ipv4Addr,
    /// The CA of the client certificates the kubelet server accepts (the API server's).
    pub client_ca: PathBuf,
    /// The command that runs a program inside the node (`nsenter -t <pid> -m -n --`).
    pub enter: Vec<String>,
    /// The kubeconfig the kubelet uses: the API server as the node reaches it.
    pub kubeconfig: PathBuf,
    /// The kubelet's root directory as this process sees it.
    pub host_root: PathBuf,
}

/// A running hollow kubelet.
pub struct HollowKubelet {
    node: String,
    binary: PathBuf,
    /// The root directory as the kubelet names it.
    root: PathBuf,
    /// The same directory as this process sees it.
    host_root: PathBuf,
    kubeconfig: PathBuf,
    labels: String,
    log: PathBuf,
    runtime: Option<RealRuntime>,
    child: Option<Child>,
}

impl HollowKubelet {
    /// Starts the kubelet of `node` with its root directory at `root` (absolute and short:
    /// the plugin's sockets go below it), and waits until its Node is Ready.
    pub async fn start(
        cp: &ControlPlane,
        node: &str,
        root: &Path,
        labels: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::start_inner(cp, node, root, labels, None).await
    }

    /// Starts the kubelet of `node` on a real container runtime, inside the node
    /// (`runtime.enter`), with its root directory at `root` as the node names it, and
    /// waits until its Node is Ready.
    pub async fn start_with_runtime(
        cp: &ControlPlane,
        node: &str,
        root: &Path,
        labels: &[(&str, &str)],
        runtime: RealRuntime,
    ) -> anyhow::Result<Self> {
        Self::start_inner(cp, node, root, labels, Some(runtime)).await
    }

    async fn start_inner(
        cp: &ControlPlane,
        node: &str,
        root: &Path,
        labels: &[(&str, &str)],
        runtime: Option<RealRuntime>,
    ) -> anyhow::Result<Self> {
        let host_root = runtime
            .as_ref()
            .map_or_else(|| root.to_path_buf(), |r| r.host_root.clone());
        std::fs::create_dir_all(&host_root)?;
        let mut kubelet = Self {
            node: node.to_string(),
            binary: binary(cp.bins())?,
            root: root.to_path_buf(),
            // The test bed's API server authorizes by RBAC alone (no Node authorizer), so
            // the admin identity stands in for a node credential.
            kubeconfig: runtime.as_ref().map_or_else(
                || cp.kubeconfig_path().to_path_buf(),
                |r| r.kubeconfig.clone(),
            ),
            labels: labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
            log: host_root.join("kubelet.log"),
            host_root,
            runtime,
            child: None,
        };
        kubelet.spawn()?;
        kubelet.wait_ready(cp).await?;
        Ok(kubelet)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = match self.runtime.as_ref().and_then(|r| r.enter.split_first()) {
            Some((enter, args)) => {
                let mut c = Command::new(enter);
                c.args(args).arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        if let Some(r) = &self.runtime {
            cmd.arg("--container-runtime-endpoint")
                .arg(&r.endpoint)
                .arg("--node-ip")
                .arg(r.node_ip.to_string())
                .arg("--client-ca-file")
                .arg(&r.client_ca);
        }
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--node-name", &self.node])
            .arg("--root-dir")
            .arg(&self.root)
            .args(["--node-labels", &self.labels])
            .arg(format!(
                "--v={}",
                std::env::var("TESSERA_KUBELET_VERBOSITY").unwrap_or_else(|_| "2".into())
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group, so a Ctrl-C meant for the test runner does not
            // reach it before the plugin's shutdown has run.
            .process_group(0);
        self.child = Some(
            cmd.spawn()
                .with_context(|| format!("starting {}", self.binary.display()))?,
        );
        Ok(())
    }

    async fn wait_ready(&mut self, cp: &ControlPlane) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(cp.admin_client().await?);
        let name = self.node.clone();
        let result = eventually(
            &format!("the kubelet of {name} to report its Node Ready"),
            READY_TIMEOUT,
            || {
                let nodes = nodes.clone();
                let name = name.clone();
                async move {
                    let node = nodes.get_opt(&name).await.ok()??;
                    let ready = node
                        .status?
                        .conditions?
                        .into_iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    ready.then_some(())
                }
            },
        )
        .await;
        if let Err(e) = result {
            bail!("{e}\nkubelet log:\n{}", self.log_tail(30));
        }
        if !self.running() {
            bail!(
                "the kubelet of {} exited:\n{}",
                self.node,
                self.log_tail(30)
            );
        }
        Ok(())
    }

    /// The node this kubelet runs.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Where the kubelet's plugin watcher looks for registration sockets (as this
    /// process sees it).
    pub fn registry_dir(&self) -> PathBuf {
        self.host_root.join("plugins_registry")
    }

    /// Where plugins put their service sockets (as this process sees it).
    pub fn plugins_dir(&self) -> PathBuf {
        self.host_root.join("plugins")
    }

    /// The kubelet's root directory as it names it (inside its node).
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// Kills the kubelet with SIGKILL, as a crash would. Its DRA checkpoint stays on disk;
    /// the fake runtime's containers die with it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the kubelet and starts it again on the same root directory; returns once its
    /// Node is Ready again.
    pub async fn restart(&mut self, cp: &ControlPlane) -> anyhow::Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready(cp).await
    }

    /// Whether the kubelet process still runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Every `CreateContainer` the kubelet asked of the runtime, oldest first.
    pub fn containers(&self) -> Vec<ContainerRecord> {
        let text =
            std::fs::read_to_string(self.host_root.join("containers.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The CDI ids the kubelet passed for each container of the pod with `pod_uid` (the
    /// latest creation of each container).
    pub fn cdi_devices(&self, pod_uid: &str) -> BTreeMap<String, Vec<String>> {
        self.containers()
            .into_iter()
            .filter(|r| r.pod_uid == pod_uid)
            .map(|r| (r.container, r.cdi_devices))
            .collect()
    }

    /// [`HollowKubelet::cdi_devices`] without repeats. A 1.36 kubelet that restarted passes
    /// each id twice: it appends the answer of its new NodePrepareResources call to the
    /// ids it had checkpointed (1.37 does not). The runtime sees the same devices.
    pub fn cdi_device_sets(&self, pod_uid: &str) -> BTreeMap<String, BTreeSet<String>> {
        self.cdi_devices(pod_uid)
            .into_iter()
            .map(|(container, ids)| (container, ids.into_iter().collect()))
            .collect()
    }

    /// The kubelet's log.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Last lines of the kubelet's log.
    pub fn log_tail(&self, n: usize) -> String {
        crate::process::tail(&self.log, n)
    }
}

impl Drop for HollowKubelet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== kubelet of {} (last lines)\n{}",
                self.node,
                self.log_tail(20)
            );
        }
        self.kill();
    }
}

fn binary(bins: &BinDir) -> anyhow::Result<PathBuf> {
    let path = bins.hollow_kubelet();
    if !path.is_file() {
        bail!(
            "{} is not built: run `cargo xtask controlplane build --version {}` (cargo xtask test does)",
            path.display(),
            bins.version
        );
    }
    Ok(path)
}
