//! A node whose pods run in real containers: containerd (CDI on) and runc, pod networking
//! from the CNI plugins, and the real kubelet code ([`HollowKubelet`] against containerd's
//! CRI endpoint) driving them, like a machine of the cluster. Tessera is installed on it
//! as a platform team installs it, from its image by its chart ([`crate::release`]).
//!
//! The node lives in namespaces of its own, so several test beds share a machine and the
//! host is left as it was:
//!
//! - **Network**: its own namespace with a loopback carrying the node's address
//!   (`10.201.0.<n>`) and the `kubernetes` Service's (`10.0.0.1`), where a relay reaches
//!   the API server on this machine's loopback ([`crate::netns::forward`]); the CNI
//!   bridge (`cni0`, pods on `10.244.<n>.0/24`). The API server reaches the kubelet and
//!   the pods through its egress proxy ([`crate::egress`]). No kube-proxy: the
//!   `kubernetes` Service is the one Service address pods can use.
//! - **Mounts**: its own namespace, where the node's directories stand at the paths a
//!   node has them: `<dir>/run` on `/run` (containerd's state, `/run/cdi` (=
//!   `/var/run/cdi`), `/run/tessera`), `<dir>/var-lib` on `/var/lib` (`/var/lib/kubelet`,
//!   `/var/lib/containerd`, `/var/lib/cni`), and the simulated driver's root on
//!   `/run/nvidia/driver`, where the GPU Operator keeps a containerized driver. So the
//!   chart installs with its defaults but the driver root, a documented value.
//!
//! The simulated GPUs appear as a driver host's do: the driver root holds the driver's
//! libraries, tools, firmware and its `dev/` with real character devices (the device root
//! the plugin's CDI specs name), and runc creates those nodes in a container and binds
//! the files. What a real driver keeps in the kernel, the simulator keeps in files of the
//! driver root (`var/lib/tessera-sim`, `proc/`, `dev/nvidia-caps`); they are mounts of
//! their own on the node, as `/proc` and `/dev` are, so the plugin's read-only mount of
//! the driver root leaves them writable, and every container sees the simulated kernel's
//! state (`/var/lib/tessera-sim`, read-only) through containerd's base runtime spec, as
//! every container of a real node shares its kernel.

use std::{
    io::{BufRead, BufReader},
    net::{Ipv4Addr, SocketAddr},
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tessera_simdriver::SimRoot;
use tokio::task::JoinHandle;

use crate::{
    ControlPlane,
    certs::KUBERNETES_SERVICE_IP,
    egress::{Cidr, Routes},
    kubelet::{HollowKubelet, RealRuntime},
    netns::{self, NetNs, Target},
    node_images::NodeImages,
    plugin::simdriver_built,
    runtime_tools::RuntimeTools,
    wait::eventually,
};

/// The kubelet's root directory on the node.
pub const KUBELET_DIR: &str = "/var/lib/kubelet";
/// Where the node keeps a containerized NVIDIA driver (the GPU Operator's driver root).
pub const DRIVER_ROOT: &str = "/run/nvidia/driver";
/// containerd's socket on the node.
const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// The simulated kernel's directories of the driver root, mounts of their own.
const KERNEL_MOUNTS: [&str; 3] = [tessera_simdriver::root::KERNEL_DIR, "proc", "dev"];
/// How long containerd gets to answer after it started.
const CONTAINERD_READY: Duration = Duration::from_secs(60);
/// What a node directory's name starts with (in the temp dir), for the orphan sweep.
const DIR_PREFIX: &str = "tessera-ctrnode-";

/// What [`ContainerdNode::start`] sets up.
#[derive(Clone, Debug, Default)]
pub struct NodeConfig<'a> {
    /// Node name.
    pub name: &'a str,
    /// Labels the kubelet registers the Node with.
    pub labels: &'a [(&'a str, &'a str)],
    /// The simulated GPUs (inventory YAML); `None`: a node without GPUs.
    pub inventory: Option<&'a str>,
}

/// What a node leaves in its directory so that a later run can clean up after a test
/// process that died without running destructors.
#[derive(Serialize, Deserialize, Debug)]
struct State {
    owner_pid: u32,
    /// Inode of the node's network namespace: its processes are found by it.
    netns_inode: u64,
}

/// A running containerd node.
pub struct ContainerdNode {
    /// The node's kubelet (stopped first, before the runtime under it).
    pub kubelet: HollowKubelet,
    runtime: NodeRuntime,
}

/// The node without its kubelet: namespaces, directories, containerd, the relay to the
/// API server and the egress routes. Dropping it stops and removes everything.
struct NodeRuntime {
    name: String,
    dir: PathBuf,
    node_ip: Ipv4Addr,
    pod_cidr: Cidr,
    has_driver: bool,
    tools: RuntimeTools,
    holder: Child,
    netns: NetNs,
    netns_inode: u64,
    containerd: Option<Child>,
    relay: Option<JoinHandle<()>>,
    routes: Routes,
}

impl ContainerdNode {
    /// Starts the node: its namespaces and directories, the simulated driver (if it has
    /// GPUs), containerd with `images` imported, and the kubelet, which registers the
    /// Node; returns once the Node is Ready. The control plane must have been started with
    /// [`crate::ControlPlaneOptions::node_network`].
    pub async fn start(
        cp: &ControlPlane,
        config: NodeConfig<'_>,
        images: &NodeImages,
    ) -> anyhow::Result<Self> {
        sweep_orphans();
        let routes = cp
            .node_routes()
            .context("the control plane was started without node_network")?
            .clone();
        let api_port = cp.api_port().context("the API server has no port")?;
        let tools = RuntimeTools::for_tests()?;
        let index = free_index(&routes)?;
        let node_ip = Ipv4Addr::new(10, 201, 0, index);
        let pod_cidr = Cidr::new(Ipv4Addr::new(10, 244, index, 0), 24);
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir_in("/tmp")?
            .keep();
        let has_driver = config.inventory.is_some();
        let mut holder = match prepare_dir(&dir, config.inventory)
            .and_then(|()| spawn_holder(&dir, node_ip, has_driver))
        {
            Ok(h) => h,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let ns = NetNs::of_process(holder.id()).and_then(|ns| {
            let inode = std::fs::metadata(ns.path())?.ino();
            Ok((ns, inode))
        });
        let (netns, netns_inode) = match ns {
            Ok(n) => n,
            Err(e) => {
                let _ = holder.kill();
                let _ = holder.wait();
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        // From here on, dropping `runtime` undoes everything.
        let mut runtime = NodeRuntime {
            name: config.name.to_string(),
            dir: dir.clone(),
            node_ip,
            pod_cidr,
            has_driver,
            tools,
            holder,
            netns,
            netns_inode,
            containerd: None,
            relay: None,
            routes,
        };
        std::fs::write(
            dir.join("node.json"),
            serde_json::to_vec(&State {
                owner_pid: std::process::id(),
                netns_inode,
            })?,
        )?;
        runtime.relay = Some(netns::forward(
            runtime
                .netns
                .bind(SocketAddr::new(KUBERNETES_SERVICE_IP.parse()?, 443))
                .await
                .context("listening on the kubernetes Service's address in the node")?,
            Target::Here(SocketAddr::from(([127, 0, 0, 1], api_port))),
        ));
        runtime
            .routes
            .add(Cidr::new(node_ip, 32), runtime.netns.clone());
        runtime.routes.add(pod_cidr, runtime.netns.clone());
        let enter = runtime.enter();
        write_containerd_config(&dir, &runtime.tools, images, pod_cidr, has_driver)?;
        runtime.containerd = Some(spawn_containerd(&dir, &runtime.tools, &enter)?);
        runtime.wait_containerd().await?;
        for (name, reference) in images.all() {
            runtime
                .ctr(&["images", "import"], Some(&images.archive(name)))
                .with_context(|| format!("importing {reference} into the node's containerd"))?;
        }
        write_kubeconfig(cp, &dir.join("kubelet.kubeconfig"))?;
        let kubelet = HollowKubelet::start_with_runtime(
            cp,
            config.name,
            Path::new(KUBELET_DIR),
            config.labels,
            RealRuntime {
                endpoint: format!("unix://{CONTAINERD_SOCKET}"),
                node_ip,
                client_ca: cp.kubelet_client_ca(),
                enter,
                kubeconfig: dir.join("kubelet.kubeconfig"),
                host_root: dir.join("var-lib/kubelet"),
            },
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}\ncontainerd log:\n{}",
                crate::process::tail(&runtime.containerd_log(), 20)
            )
        })?;
        Ok(Self { kubelet, runtime })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.runtime.name
    }

    /// The node's address.
    pub fn node_ip(&self) -> Ipv4Addr {
        self.runtime.node_ip
    }

    /// The pods' address range.
    pub fn pod_cidr(&self) -> Cidr {
        self.runtime.pod_cidr
    }

    /// A path of the node (`/run/cdi`, `/var/lib/kubelet/...`) as this process sees it.
    pub fn host_path(&self, node_path: &str) -> PathBuf {
        host_path(&self.runtime.dir, node_path)
    }

    /// The node's simulated NVIDIA driver (as this process sees it).
    pub fn driver(&self) -> Option<SimRoot> {
        self.runtime
            .has_driver
            .then(|| SimRoot::new(self.runtime.dir.join("driver")))
    }

    /// The CDI spec directory containerd reads (`/var/run/cdi` on the node).
    pub fn cdi_dir(&self) -> PathBuf {
        self.host_path("/var/run/cdi")
    }

    /// The node's network namespace (to reach its pods).
    pub fn netns(&self) -> &NetNs {
        &self.runtime.netns
    }

    /// Runs `crictl` against the node's containerd.
    pub fn crictl(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.runtime.crictl(args)
    }

    /// GETs `path` from `ip:port` inside the node's network (a pod's endpoint): (status,
    /// body).
    pub async fn http_get(&self, ip: &str, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = SocketAddr::new(ip.parse()?, port);
        let mut s = self.runtime.netns.connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await?;
        let status = buf
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        Ok((status, body))
    }

    /// containerd's log.
    pub fn containerd_log(&self) -> PathBuf {
        self.runtime.containerd_log()
    }
}

impl Drop for ContainerdNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== containerd of {} (last lines)\n{}",
                self.runtime.name,
                crate::process::tail(&self.containerd_log(), 20)
            );
        }
        // The kubelet goes first, so it does not restart what the runtime stops.
        self.kubelet.kill();
    }
}

impl NodeRuntime {
    fn enter(&self) -> Vec<String> {
        enter_command(self.holder.id())
    }

    fn containerd_log(&self) -> PathBuf {
        self.dir.join("logs/containerd.log")
    }

    fn crictl(&self, args: &[&str]) -> anyhow::Result<Output> {
        let enter = self.enter();
        Command::new(&enter[0])
            .args(&enter[1..])
            .arg(&self.tools.crictl)
            .args(["--runtime-endpoint", &format!("unix://{CONTAINERD_SOCKET}")])
            .args(["--timeout", "30s"])
            .args(args)
            .output()
            .context("running crictl in the node")
    }

    /// `ctr -n k8s.io <args> [file]` against the node's containerd.
    fn ctr(&self, args: &[&str], file: Option<&Path>) -> anyhow::Result<String> {
        let enter = self.enter();
        let mut cmd = Command::new(&enter[0]);
        cmd.args(&enter[1..])
            .arg(self.tools.ctr())
            .args(["--address", CONTAINERD_SOCKET, "--namespace", "k8s.io"])
            .args(args);
        if let Some(f) = file {
            cmd.arg(f);
        }
        let out = cmd.output().context("running ctr in the node")?;
        if !out.status.success() {
            bail!(
                "ctr {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    async fn wait_containerd(&mut self) -> anyhow::Result<()> {
        let result = eventually("containerd to answer", CONTAINERD_READY, || {
            let exited = self
                .containerd
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            let ok = !exited && self.ctr(&["version"], None).is_ok();
            async move { (exited || ok).then_some(exited) }
        })
        .await;
        match result {
            Ok(false) => Ok(()),
            Ok(true) => bail!(
                "containerd exited:\n{}",
                crate::process::tail(&self.containerd_log(), 30)
            ),
            Err(e) => bail!("{e}:\n{}", crate::process::tail(&self.containerd_log(), 30)),
        }
    }
}

impl Drop for NodeRuntime {
    /// Stops every pod of the node through the CRI (runc removes their containers, the
    /// CNI plugins their network), then containerd and the node's namespaces, and removes
    /// the node's directory (kept when a test fails and `TESSERA_KEEP_LOGS` is set).
    fn drop(&mut self) {
        if self.containerd.is_some() {
            match self.crictl(&["rmp", "--all", "--force"]) {
                Ok(out) if !out.status.success() => eprintln!(
                    "crictl rmp on {}: {}",
                    self.name,
                    String::from_utf8_lossy(&out.stderr)
                ),
                _ => {}
            }
        }
        if let Some(c) = self.containerd.take() {
            terminate(c, Duration::from_secs(10));
        }
        kill_node_processes(&self.dir, self.netns_inode);
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        if let Some(r) = self.relay.take() {
            r.abort();
        }
        self.routes.remove(Cidr::new(self.node_ip, 32));
        self.routes.remove(self.pod_cidr);
        if std::thread::panicking() && std::env::var_os("TESSERA_KEEP_LOGS").is_some() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A path of the node as this process sees it, for the node directory `dir`.
fn host_path(dir: &Path, node_path: &str) -> PathBuf {
    let rel = |p: &str| p.trim_start_matches('/').to_string();
    if let Some(rest) = node_path.strip_prefix(DRIVER_ROOT) {
        return dir.join("driver").join(rel(rest));
    }
    if let Some(rest) = node_path
        .strip_prefix("/var/run/")
        .or_else(|| node_path.strip_prefix("/run/"))
    {
        return dir.join("run").join(rel(rest));
    }
    if let Some(rest) = node_path.strip_prefix("/var/lib/") {
        return dir.join("var-lib").join(rel(rest));
    }
    PathBuf::from(node_path)
}

/// The node directory's layout, and the simulated driver when the node has GPUs.
fn prepare_dir(dir: &Path, inventory: Option<&str>) -> anyhow::Result<()> {
    for d in [
        "run/nvidia/driver",
        "run/cdi",
        "var-lib/kubelet",
        "etc/cni/net.d",
        "logs",
    ] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    if let Some(inventory) = inventory {
        SimRoot::new(dir.join("driver")).install(inventory, &simdriver_built()?)?;
    }
    Ok(())
}

/// The lowest node number whose address no running node of this control plane has.
fn free_index(routes: &Routes) -> anyhow::Result<u8> {
    let used = routes.cidrs();
    (1..=250u8)
        .find(|n| !used.contains(&Cidr::new(Ipv4Addr::new(10, 201, 0, *n), 32)))
        .context("250 containerd nodes are running already")
}

/// `nsenter` into the node's mount and network namespaces.
fn enter_command(holder: u32) -> Vec<String> {
    ["nsenter", "-t", &holder.to_string(), "-m", "-n", "--"]
        .map(String::from)
        .to_vec()
}

/// The process that makes the node's namespaces and holds them: `unshare` runs the
/// script, which mounts the node's directories, sets the addresses, says `ready` and
/// then waits for this process to end (`tail --pid`), so a test process that dies takes
/// its node's holder with it.
fn spawn_holder(dir: &Path, node_ip: Ipv4Addr, has_driver: bool) -> anyhow::Result<Child> {
    let driver = if has_driver {
        format!(
            "mount --bind \"$0/driver\" {DRIVER_ROOT}\n{}",
            KERNEL_MOUNTS
                .iter()
                .map(|d| format!("mount --bind {DRIVER_ROOT}/{d} {DRIVER_ROOT}/{d}\n"))
                .collect::<String>()
        )
    } else {
        String::new()
    };
    let script = format!(
        "set -e\n\
         mount --make-rshared /\n\
         mount --bind \"$0/run\" /run\n\
         mount --bind \"$0/var-lib\" /var/lib\n\
         {driver}\
         ip link set lo up\n\
         ip addr add {KUBERNETES_SERVICE_IP}/32 dev lo\n\
         ip addr add \"$1/32\" dev lo\n\
         echo ready\n\
         exec tail --pid=$PPID -f /dev/null >/dev/null\n"
    );
    let mut holder = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "slave",
            "--net",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .arg(dir)
        .arg(node_ip.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the node's namespaces (unshare)")?;
    let mut line = String::new();
    if let Some(out) = holder.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    if line.trim() != "ready" {
        let _ = holder.kill();
        let out = holder.wait_with_output()?;
        bail!(
            "setting up the node's namespaces failed (root needed): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(holder)
}

/// containerd's configuration (version 3, containerd 2.x): everything under the node's
/// own paths, CDI from the directory the plugin writes, runc from the module proxy, the
/// local pause image, and the CNI bridge.
pub fn containerd_config(
    tools: &RuntimeTools,
    images: &NodeImages,
    cni_conf_dir: &Path,
    base_spec: Option<&Path>,
) -> String {
    let base = base_spec.map_or(String::new(), |p| {
        format!("        base_runtime_spec = '{}'\n", p.display())
    });
    format!(
        r#"version = 3
root = '/var/lib/containerd'
state = '/run/containerd'

[grpc]
  address = '{CONTAINERD_SOCKET}'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{pause}'

  [plugins.'io.containerd.cri.v1.runtime']
    # CDI is always on in containerd 2.x; the plugin writes its specs here.
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
    # Pod network namespaces under the state dir, not the host's /var/run/netns.
    netns_mounts_under_state_dir = true
    # The kubelet asks for negative OOM scores (-998 for the sandbox), which need
    # CAP_SYS_RESOURCE; a test machine may not grant it. Clamp to containerd's own.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
{base}        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{runc}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{cni_bin}']
      conf_dir = '{cni_conf}'

  [plugins.'io.containerd.nri.v1.nri']
    disable = true

  [plugins.'io.containerd.internal.v1.opt']
    path = '/var/lib/containerd-opt'
"#,
        pause = images.pause,
        runc = tools.runc.display(),
        cni_bin = tools.cni_bin.display(),
        cni_conf = cni_conf_dir.display(),
    )
}

/// The CNI network of a node: a bridge with the pods' gateway, addresses from
/// `pod_cidr`, and hostPort mappings.
pub fn cni_config(pod_cidr: Cidr) -> serde_json::Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "tessera-test-bed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr.to_string()}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
}

fn write_containerd_config(
    dir: &Path,
    tools: &RuntimeTools,
    images: &NodeImages,
    pod_cidr: Cidr,
    has_driver: bool,
) -> anyhow::Result<()> {
    let cni_conf_dir = dir.join("etc/cni/net.d");
    std::fs::write(
        cni_conf_dir.join("10-tessera.conflist"),
        serde_json::to_vec_pretty(&cni_config(pod_cidr))?,
    )?;
    let base_spec = if has_driver {
        let path = dir.join("base-spec.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&base_spec(tools)?)?)?;
        Some(path)
    } else {
        None
    };
    std::fs::write(
        dir.join("containerd.toml"),
        containerd_config(tools, images, &cni_conf_dir, base_spec.as_deref()),
    )?;
    Ok(())
}

/// containerd's default container spec (`ctr oci spec`) with the simulated kernel's
/// state mounted read-only where the simulated CUDA library looks for it: what a real
/// node's containers share without a mount, since it is the one kernel.
fn base_spec(tools: &RuntimeTools) -> anyhow::Result<serde_json::Value> {
    let out = Command::new(tools.ctr())
        .args(["oci", "spec"])
        .output()
        .context("running ctr oci spec")?;
    if !out.status.success() {
        bail!("ctr oci spec: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut spec: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let kernel = format!("/{}", tessera_simdriver::root::KERNEL_DIR);
    spec["mounts"]
        .as_array_mut()
        .context("ctr's spec has no mounts")?
        .push(json!({
            "destination": kernel,
            "source": format!("{DRIVER_ROOT}{kernel}"),
            "type": "bind",
            "options": ["rbind", "ro"]
        }));
    Ok(spec)
}

fn spawn_containerd(dir: &Path, tools: &RuntimeTools, enter: &[String]) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("logs/containerd.log"))?;
    // containerd finds its shim on PATH.
    let path = format!(
        "{}:{}",
        tools.containerd_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(&enter[0])
        .args(&enter[1..])
        .arg(tools.containerd())
        .arg("--config")
        .arg(dir.join("containerd.toml"))
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting containerd in the node")
}

/// The admin kubeconfig with the API server at the `kubernetes` Service's address, where
/// the node reaches it.
fn write_kubeconfig(cp: &ControlPlane, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(cp.kubeconfig_path())?;
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    kc["clusters"][0]["cluster"]["server"] = format!("https://{KUBERNETES_SERVICE_IP}:443").into();
    std::fs::write(path, serde_yaml::to_string(&kc)?)?;
    Ok(())
}

fn terminate(mut child: Child, grace: Duration) {
    crate::process::stop_group(child.id(), grace);
    let _ = child.wait();
}

/// Kills what a node leaves behind when containerd is gone: its shims and anything else
/// in its network namespace, and the processes of containers runc has not deleted
/// (found by their cgroups, named by the container ids in containerd's state), whose
/// cgroups are then removed.
fn kill_node_processes(dir: &Path, netns_inode: u64) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let in_node =
            std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.ino() == netns_inode);
        if in_node {
            kill(pid);
        }
    }
    let tasks = dir.join("run/containerd/io.containerd.runtime.v2.task/k8s.io");
    let ids: Vec<String> = std::fs::read_dir(&tasks)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let controllers: Vec<PathBuf> = controllers.flatten().map(|e| e.path()).collect();
    for id in &ids {
        for c in &controllers {
            let cg = c.join("k8s.io").join(id);
            if let Ok(procs) = std::fs::read_to_string(cg.join("cgroup.procs")) {
                procs
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .for_each(kill);
            }
        }
        for c in &controllers {
            let _ = std::fs::remove_dir(c.join("k8s.io").join(id));
        }
    }
}

fn kill(pid: u32) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Cleans up after nodes whose test process died without running destructors.
fn sweep_orphans() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let Ok(text) = std::fs::read(e.path().join("node.json")) else {
            continue;
        };
        let Ok(state) = serde_json::from_slice::<State>(&text) else {
            continue;
        };
        if crate::process::alive(state.owner_pid) {
            continue;
        }
        kill_node_processes(&e.path(), state.netns_inode);
        let _ = std::fs::remove_dir_all(e.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_paths_map_into_the_node_directory() {
        let d = Path::new("/tmp/n");
        assert_eq!(host_path(d, "/var/run/cdi"), Path::new("/tmp/n/run/cdi"));
        assert_eq!(
            host_path(d, "/run/tessera/gpu.tessera.dev"),
            Path::new("/tmp/n/run/tessera/gpu.tessera.dev")
        );
        assert_eq!(
            host_path(d, "/run/nvidia/driver/usr/bin/nvidia-smi"),
            Path::new("/tmp/n/driver/usr/bin/nvidia-smi")
        );
        assert_eq!(
            host_path(d, "/var/lib/kubelet/plugins_registry"),
            Path::new("/tmp/n/var-lib/kubelet/plugins_registry")
        );
        assert_eq!(host_path(d, "/etc/hosts"), Path::new("/etc/hosts"));
    }

    #[test]
    fn each_node_gets_its_own_pod_range_on_the_bridge() {
        let c = cni_config(Cidr::new(Ipv4Addr::new(10, 244, 7, 0), 24));
        assert_eq!(c["plugins"][0]["type"], "bridge");
        assert_eq!(
            c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.7.0/24"
        );
        assert_eq!(c["plugins"][0]["ipMasq"], false);
    }
}
