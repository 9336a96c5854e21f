//! A simulated GPU node for end-to-end tests: a Node object, a real `tessera-plugin`
//! process with the simulated backend and its own kubelet directories, running under the
//! `tessera-plugin` ServiceAccount (so its RBAC is exercised), and the kubelet stand-in.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, bail};

use crate::{ControlPlane, cluster, kubelet::KubeletStandIn, repo_root};

/// The `tessera-plugin` binary: `$TESSERA_PLUGIN_BIN`, else next to the test executable's
/// target directory (`cargo xtask test` builds it first).
pub fn plugin_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("TESSERA_PLUGIN_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    // Tests run from target/<profile>/deps/, xtask from target/<profile>/.
    let dirs = [exe.parent(), exe.parent().and_then(Path::parent)];
    let candidates: Vec<PathBuf> = dirs
        .iter()
        .flatten()
        .map(|d| d.join("tessera-plugin"))
        .collect();
    match candidates.iter().find(|c| c.is_file()) {
        Some(c) => Ok(c.clone()),
        None => bail!(
            "tessera-plugin is not built (looked at {}): run `cargo build -p tessera-plugin` (cargo xtask test does) or set TESSERA_PLUGIN_BIN",
            candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// One simulated node.
pub struct SimNode {
    /// Node name.
    pub name: String,
    _dir: tempfile::TempDir,
    /// What a node keeps on tmpfs (`/var/run`): the CDI specs.
    run: tempfile::TempDir,
    root: PathBuf,
    kubeconfig: PathBuf,
    metrics_port: u16,
    process: Option<Child>,
    /// The kubelet stand-in of this node.
    pub kubelet: KubeletStandIn,
}

/// Where volatile node directories go: `/dev/shm` (tmpfs) when the machine has it, so the
/// CDI specs live in memory as under `/var/run` on a real node.
fn volatile_root() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

impl SimNode {
    /// Creates the Node, installs RBAC (idempotent) and starts the plugin and the stand-in.
    /// `inventory` is the simulated hardware (YAML), e.g. `gpus: [{model: h100-80gb}]`.
    pub async fn start(cp: &ControlPlane, name: &str, inventory: &str) -> anyhow::Result<Self> {
        let admin = cp.admin_client().await?;
        cluster::create_node(&admin, name, &[("tessera.dev/gpu", "true")]).await?;
        cluster::apply_dir(&admin, &repo_root().join("config/rbac"), false).await?;
        let dir = tempfile::Builder::new().prefix("tessera-node-").tempdir()?;
        let run = tempfile::Builder::new()
            .prefix("tessera-node-run-")
            .tempdir_in(volatile_root())?;
        let root = dir.path().to_path_buf();
        for sub in ["registry", "plugins", "state"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        std::fs::create_dir_all(run.path().join("cdi"))?;
        std::fs::write(root.join("boot_id"), uuid::Uuid::new_v4().to_string())?;
        std::fs::write(root.join("inventory.yaml"), inventory)?;
        let kubeconfig = root.join("plugin.kubeconfig");
        cluster::node_bound_kubeconfig(cp, "tessera-system", "tessera-plugin", name, &kubeconfig)
            .await?;
        let kubelet = KubeletStandIn::start(admin, name, &root.join("registry"));
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut node = Self {
            name: name.to_string(),
            _dir: dir,
            run,
            root,
            kubeconfig,
            metrics_port,
            process: None,
            kubelet,
        };
        node.spawn()?;
        node.kubelet
            .wait_registered(1, Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\nplugin log:\n{}", node.log_tail(40)))?;
        Ok(node)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let child = Command::new(plugin_binary()?)
            .args(["--node-name", &self.name, "--backend", "sim"])
            .arg("--sim-inventory")
            .arg(self.root.join("inventory.yaml"))
            .arg("--registry-dir")
            .arg(self.root.join("registry"))
            .arg("--plugins-dir")
            .arg(self.root.join("plugins"))
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--boot-id-file")
            .arg(self.root.join("boot_id"))
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            // Tests log the plugin's debug lines; the bench measures the production level.
            .env(
                "RUST_LOG",
                std::env::var("TESSERA_PLUGIN_LOG")
                    .unwrap_or_else(|_| "info,tessera_plugin=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting tessera-plugin")?;
        self.process = Some(child);
        Ok(())
    }

    /// Kills the plugin with SIGKILL (no cleanup runs), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.process.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the plugin with SIGTERM, as the kubelet does, and waits for it to exit.
    pub async fn terminate(&mut self) -> anyhow::Result<()> {
        let Some(mut c) = self.process.take() else {
            return Ok(());
        };
        let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id())?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = c.try_wait()? {
                if !status.success() {
                    bail!(
                        "tessera-plugin exited with {status} on SIGTERM:\n{}",
                        self.log_tail(20)
                    );
                }
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                let _ = c.kill();
                bail!("tessera-plugin did not exit within 30 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The kubelet registry directory of this node.
    pub fn registry_dir(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// Starts the plugin again (after [`SimNode::kill`] or a fault-injected abort) and
    /// waits until the kubelet stand-in registered it once more.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let before = self.kubelet.registrations();
        self.spawn()?;
        self.kubelet
            .wait_registered(before + 1, Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\nplugin log:\n{}", self.log_tail(40)))?;
        Ok(())
    }

    /// Simulates a reboot of the node: the plugin dies, and what a reboot wipes is gone
    /// when it starts again: MIG instances (the MIG mode stays, as on an A100), MPS
    /// daemons and compute modes, the CDI specs (tmpfs); the boot ID is new. The
    /// checkpoint on disk survives, as it would.
    pub async fn reboot(&mut self) -> anyhow::Result<()> {
        self.kill();
        let mut state = tessera_gpu::backend::sim::state::load_state(&self.sim_state())?
            .context("the simulated hardware has no state file yet")?;
        for g in &mut state.gpus {
            g.instances.clear();
            g.mps = None;
            g.compute_mode = tessera_gpu::backend::ComputeMode::Default;
            g.mig_enabled = g.mig_pending;
        }
        tessera_gpu::backend::sim::state::save_state(&self.sim_state(), &state)?;
        for entry in std::fs::read_dir(self.cdi_dir())? {
            std::fs::remove_file(entry?.path())?;
        }
        std::fs::write(self.root.join("boot_id"), uuid::Uuid::new_v4().to_string())?;
        // The plugin is already dead, so this only starts it again.
        self.restart().await
    }

    /// Whether the plugin process is still running.
    pub fn plugin_running(&mut self) -> bool {
        self.process
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// GETs a path of the plugin's HTTP endpoint (`/metrics`, `/readyz`, …): (status, body).
    pub async fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
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

    /// CDI spec directory: on tmpfs where the machine has one, as `/var/run/cdi` is on
    /// a real node.
    pub fn cdi_dir(&self) -> PathBuf {
        self.run.path().join("cdi")
    }

    /// Plugin state directory (checkpoint, simulated hardware).
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }

    /// The simulated hardware's state file.
    pub fn sim_state(&self) -> PathBuf {
        self.state_dir().join("sim-hardware.json")
    }

    /// The simulator's fault-injection file.
    pub fn faults_path(&self) -> PathBuf {
        self.state_dir().join("faults.json")
    }

    /// The plugin's log.
    pub fn log_path(&self) -> PathBuf {
        self.root.join("plugin.log")
    }

    /// Last lines of the plugin's log.
    pub fn log_tail(&self, n: usize) -> String {
        crate::process::tail(&self.log_path(), n)
    }
}

impl Drop for SimNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== tessera-plugin on {} (last lines)\n{}",
                self.name,
                self.log_tail(40)
            );
        }
        self.kill();
    }
}
