//! A simulated GPU node for end-to-end tests: the real kubelet code
//! ([`HollowKubelet`]), which registers the Node, and a real `tessera-plugin` process with
//! its production NVML backend on the simulated NVIDIA driver ([`SimRoot`]: the node's
//! `libnvidia-ml.so.1`, `nvidia-smi` and `nvidia-cuda-mps-control`) in that kubelet's
//! plugin directories, running under the `tessera-plugin` ServiceAccount (so its RBAC is
//! exercised). The kubelet registers the plugin through its own client and drives every
//! prepare and unprepare.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, bail};

use tessera_plugin::kubelet::{client::RegistrationClient, proto::registration::PluginInfo};
use tessera_simdriver::SimRoot;

use crate::{ControlPlane, cluster, kubelet::HollowKubelet, repo_root, wait::eventually};

/// How long the kubelet gets to register a (re)started plugin.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);

/// The `tessera-plugin` binary: `$TESSERA_PLUGIN_BIN`, else next to the test executable's
/// target directory (`cargo xtask test` builds it first).
pub fn plugin_binary() -> anyhow::Result<PathBuf> {
    crate::process::workspace_binary("tessera-plugin", "TESSERA_PLUGIN_BIN")
}

/// The CDI hook binary the plugin installs: `$TESSERA_CDI_HOOK_BIN`, else next to the test
/// executable's target directory (`cargo xtask test` builds it first).
pub fn cdi_hook_binary() -> anyhow::Result<PathBuf> {
    crate::process::workspace_binary("tessera-cdi-hook", "TESSERA_CDI_HOOK_BIN")
}

/// Where cargo put the simulated driver (`cargo build -p tessera-simdriver --lib --bins`;
/// `cargo xtask test` does): next to `nvidia-smi`, or `$TESSERA_SIMDRIVER_DIR`.
pub fn simdriver_built() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("TESSERA_SIMDRIVER_DIR") {
        return Ok(dir.into());
    }
    let smi = crate::process::workspace_binary("nvidia-smi", "TESSERA_SIMDRIVER_SMI")?;
    Ok(smi
        .parent()
        .context("nvidia-smi has no directory")?
        .to_path_buf())
}

/// The `--default-strategy` the test bed's plugins run with: the plugin-level tests
/// exercise MIG partitions without running the operator, so their GPUs offer every
/// profile without a policy. An install defaults to `exclusive`
/// ([`SimNode::start_as_installed`] runs the plugin with its own default).
pub const TEST_BED_DEFAULT_STRATEGY: &str = "dynamic-mig";

/// One simulated node.
pub struct SimNode {
    /// Node name.
    pub name: String,
    root: PathBuf,
    kubeconfig: PathBuf,
    metrics_port: u16,
    /// The plugin pod's UID, as the DaemonSet passes it: its sockets are named by it, and
    /// a restart (same pod) keeps it.
    pod_uid: String,
    /// The small tmpfs the plugin's checkpoint directory is mounted on, if it has one (see
    /// [`SimNode::start_with_small_checkpoint_dir`]).
    checkpoint_volume: Option<CheckpointVolume>,
    /// `--default-strategy` given to the plugin; `None`: the plugin's own default.
    default_strategy: Option<&'static str>,
    process: Option<Child>,
    /// The kubelet of this node.
    pub kubelet: HollowKubelet,
    // The directories go last (fields drop in declaration order): the kubelet writes under
    // the node's directory until it is stopped, and a removal racing it fails, leaving the
    // directory, and the MPS daemons of its simulated driver, behind.
    /// What a node keeps on tmpfs (`/var/run`): the CDI specs.
    run: tempfile::TempDir,
    _dir: tempfile::TempDir,
}

/// A second plugin instance started next to a node's running one (a rolling update).
pub struct Successor {
    process: Child,
    pod_uid: String,
    port: u16,
    started: std::time::Instant,
}

impl Successor {
    /// The value of one sample of this instance's `/metrics` (see [`SimNode::metric`]).
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (code, body) = crate::process::http_get(self.port, "/metrics").await.ok()?;
        if code != 200 {
            return None;
        }
        crate::process::sample(&body, sample)
    }
}

/// A small tmpfs for a plugin's checkpoint directory, in a mount namespace that outlives
/// the plugin: a holder process keeps the namespace and every plugin instance of the node
/// enters it, so the records survive restarts and upgrades as a node's `/run` does, while
/// a test can fill the volume or remount it read-only without touching anything outside
/// it.
struct CheckpointVolume {
    holder: Child,
}

impl CheckpointVolume {
    fn mount(at: &std::path::Path, bytes: u64) -> anyhow::Result<Self> {
        use std::io::BufRead;
        // unshare execs sh, so the holder's parent is this process: the holder ends
        // (`tail --pid`) when it does, and the namespace with the last process in it.
        // tail writes to /dev/null: it ends once its stdout is a pipe nobody reads.
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o size={bytes} tessera-checkpoint \"$0\" && echo mounted && exec tail --pid=$PPID -f /dev/null >/dev/null"
            ))
            .arg(at)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the checkpoint volume's holder (unshare)")?;
        let mut line = String::new();
        if let Some(out) = holder.stdout.take() {
            std::io::BufReader::new(out).read_line(&mut line)?;
        }
        if line.trim() != "mounted" {
            let _ = holder.kill();
            let _ = holder.wait();
            bail!("mounting a tmpfs on {} failed (root needed)", at.display());
        }
        Ok(Self { holder })
    }

    fn pid(&self) -> String {
        self.holder.id().to_string()
    }

    /// `path` as seen from inside the volume's namespace, for readers outside it.
    fn view(&self, path: &std::path::Path) -> PathBuf {
        let inside = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.pid())).join(inside)
    }

    /// Runs `script` (sh) in the volume's namespace with `$0` = `at`; whether it succeeded.
    fn run(&self, at: &std::path::Path, script: &str) -> anyhow::Result<bool> {
        let status = Command::new("nsenter")
            .args(["-t", &self.pid(), "-m", "--", "sh", "-c", script])
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .context("running nsenter")?;
        Ok(status.success())
    }
}

impl Drop for CheckpointVolume {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
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
    /// Starts the node's kubelet (which registers the Node), installs RBAC (idempotent),
    /// starts the plugin and waits until the kubelet has registered it.
    /// `inventory` is the simulated hardware (YAML), e.g. `gpus: [{model: h100-80gb}]`.
    pub async fn start(cp: &ControlPlane, name: &str, inventory: &str) -> anyhow::Result<Self> {
        Self::start_inner(cp, name, inventory, None, Some(TEST_BED_DEFAULT_STRATEGY)).await
    }

    /// [`SimNode::start`] with the plugin's flags as an install sets them: its own
    /// `--default-strategy`.
    pub async fn start_as_installed(
        cp: &ControlPlane,
        name: &str,
        inventory: &str,
    ) -> anyhow::Result<Self> {
        Self::start_inner(cp, name, inventory, None, None).await
    }

    /// [`SimNode::start`], then labels the Node `tessera.dev/pool=<pool>`, the label the
    /// sample policies select.
    pub async fn start_in_pool(
        cp: &ControlPlane,
        name: &str,
        pool: &str,
        inventory: &str,
    ) -> anyhow::Result<Self> {
        let node = Self::start(cp, name, inventory).await?;
        node.join_pool(cp, pool).await?;
        Ok(node)
    }

    /// [`SimNode::start_in_pool`] with the checkpoint directory of
    /// [`SimNode::start_with_small_checkpoint_dir`].
    pub async fn start_in_pool_with_small_checkpoint_dir(
        cp: &ControlPlane,
        name: &str,
        pool: &str,
        inventory: &str,
        bytes: u64,
    ) -> anyhow::Result<Self> {
        let node = Self::start_with_small_checkpoint_dir(cp, name, inventory, bytes).await?;
        node.join_pool(cp, pool).await?;
        Ok(node)
    }

    async fn join_pool(&self, cp: &ControlPlane, pool: &str) -> anyhow::Result<()> {
        let name = &self.name;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(cp.admin_client().await?);
        nodes
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({
                    "metadata": {"labels": {"tessera.dev/pool": pool}}
                })),
            )
            .await
            .with_context(|| format!("labelling node {name}"))?;
        Ok(())
    }

    /// [`SimNode::start`] with the plugin's checkpoint directory a tmpfs of `bytes` in a mount
    /// namespace the node's plugin instances share (it outlives restarts): a test can fill
    /// it ([`SimNode::fill_checkpoint_dir`]) or make it read-only
    /// ([`SimNode::checkpoint_dir_read_only`]), and nothing outside that namespace is
    /// touched. [`SimNode::checkpoint_dir`] then names the directory as seen from outside.
    pub async fn start_with_small_checkpoint_dir(
        cp: &ControlPlane,
        name: &str,
        inventory: &str,
        bytes: u64,
    ) -> anyhow::Result<Self> {
        Self::start_inner(
            cp,
            name,
            inventory,
            Some(bytes),
            Some(TEST_BED_DEFAULT_STRATEGY),
        )
        .await
    }

    async fn start_inner(
        cp: &ControlPlane,
        name: &str,
        inventory: &str,
        checkpoint_tmpfs: Option<u64>,
        default_strategy: Option<&'static str>,
    ) -> anyhow::Result<Self> {
        let admin = cp.admin_client().await?;
        let dir = tempfile::Builder::new().prefix("tessera-node-").tempdir()?;
        let run = tempfile::Builder::new()
            .prefix("tessera-node-run-")
            .tempdir_in(volatile_root())?;
        let root = dir.path().to_path_buf();
        // The kubelet first: at start-up it deletes every ResourceSlice of its node, and the
        // plugin must find its directories.
        let kubelet = HollowKubelet::start(
            cp,
            name,
            &root.join("kubelet"),
            &[("tessera.dev/gpu", "true")],
        )
        .await?;
        cluster::apply_dir(&admin, &repo_root().join("config/rbac"), false).await?;
        std::fs::create_dir_all(root.join("state"))?;
        let checkpoint_dir = run.path().join("checkpoint");
        std::fs::create_dir_all(&checkpoint_dir)?;
        let checkpoint_volume = checkpoint_tmpfs
            .map(|bytes| CheckpointVolume::mount(&checkpoint_dir, bytes))
            .transpose()?;
        std::fs::create_dir_all(run.path().join("cdi"))?;
        std::fs::write(root.join("boot_id"), uuid::Uuid::new_v4().to_string())?;
        SimRoot::new(root.join("driver")).install(inventory, &simdriver_built()?)?;
        let kubeconfig = root.join("plugin.kubeconfig");
        cluster::node_bound_kubeconfig(cp, "tessera-system", "tessera-plugin", name, &kubeconfig)
            .await?;
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
            pod_uid: uuid::Uuid::new_v4().to_string(),
            checkpoint_volume,
            default_strategy,
            process: None,
            kubelet,
        };
        node.spawn()?;
        node.wait_registered(1).await?;
        Ok(node)
    }

    /// How often the kubelet accepted the running plugin's registration, from the plugin's
    /// `tessera_plugin_kubelet_registrations_total`; `None` while the plugin does not
    /// answer.
    pub async fn registrations(&self) -> Option<u64> {
        self.metric("tessera_plugin_kubelet_registrations_total")
            .await
            .map(|v| v as u64)
    }

    /// The value of one sample of the plugin's `/metrics`, named with its labels as the
    /// exposition shows it (`tessera_plugin_prepare_duration_seconds_count{result="ok"}`);
    /// `None` while the plugin does not answer or has no such sample.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (code, body) = self.http_get("/metrics").await.ok()?;
        if code != 200 {
            return None;
        }
        crate::process::sample(&body, sample)
    }

    /// Waits until the kubelet has registered the running plugin at least `n` times.
    pub async fn wait_registered(&self, n: u64) -> anyhow::Result<()> {
        let what = format!("the kubelet of {} to register the plugin (#{n})", self.name);
        eventually(&what, REGISTER_TIMEOUT, || async {
            self.registrations().await.filter(|r| *r >= n)
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}\nplugin log:\n{}\nkubelet log:\n{}",
                self.log_tail(30),
                self.kubelet.log_tail(20)
            )
        })?;
        Ok(())
    }

    /// What the plugin announces on its registration socket, asked directly: for tests
    /// that must call the DRA service themselves (malformed requests, the health stream),
    /// which the kubelet cannot be made to do.
    pub async fn plugin_info(&self) -> anyhow::Result<PluginInfo> {
        let socket = tessera_plugin::kubelet::sockets::instance_registration_socket_path(
            &self.registry_dir(),
            tessera_api::constants::DRIVER_NAME,
            &self.pod_uid,
        );
        let client = RegistrationClient::connect(&socket, Duration::from_secs(10)).await?;
        Ok(client.get_info().await?)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let child = self.spawn_instance(&self.pod_uid, self.metrics_port)?;
        self.process = Some(child);
        Ok(())
    }

    /// Starts a plugin process as the pod `pod_uid` would, serving metrics on `port`.
    fn spawn_instance(&self, pod_uid: &str, port: u16) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let driver = self.driver();
        let mut command = match &self.checkpoint_volume {
            None => Command::new(plugin_binary()?),
            Some(volume) => {
                // nsenter execs the plugin, so the child's pid is the plugin's.
                let mut c = Command::new("nsenter");
                c.args(["-t", &volume.pid(), "-m", "--"])
                    .arg(plugin_binary()?);
                c
            }
        };
        if let Some(strategy) = self.default_strategy {
            command.arg("--default-strategy").arg(strategy);
        }
        let child = command
            .args(["--node-name", &self.name, "--backend", "nvml"])
            .arg("--nvidia-driver-root")
            .arg(driver.path())
            .arg("--registry-dir")
            .arg(self.kubelet.registry_dir())
            .arg("--plugins-dir")
            .arg(self.kubelet.plugins_dir())
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--checkpoint-dir")
            .arg(self.checkpoint_mount_point())
            .arg("--boot-id-file")
            .arg(self.root.join("boot_id"))
            // Where the simulated driver publishes its MIG capability files and majors.
            .arg("--nvidia-caps-root")
            .arg(driver.caps_root())
            .arg("--proc-devices")
            .arg(driver.proc_devices())
            .arg("--cdi-hook")
            .arg(cdi_hook_binary()?)
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--pod-uid")
            .arg(pod_uid)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            // Inert until a test writes the file (plugin/src/crash_points.rs).
            .env(tessera_plugin::crash_points::ENV, self.crash_points_path())
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
        Ok(child)
    }

    /// Starts a new plugin pod next to the running one, as a DaemonSet rolling with
    /// `maxSurge: 1` does; [`SimNode::finish_roll`] completes the roll.
    pub fn start_successor(&self) -> anyhow::Result<Successor> {
        let pod_uid = uuid::Uuid::new_v4().to_string();
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let started = std::time::Instant::now();
        let process = self.spawn_instance(&pod_uid, port)?;
        Ok(Successor {
            process,
            pod_uid,
            port,
            started,
        })
    }

    /// Waits until `next` is ready (it has taken the node over), checks that the running
    /// plugin says it handed over, then stops it with SIGTERM as the DaemonSet does and
    /// makes `next` this node's plugin. Returns how long `next` took from its start to
    /// ready.
    pub async fn finish_roll(&mut self, mut next: Successor) -> anyhow::Result<Duration> {
        let port = next.port;
        let ready = eventually(
            "the new plugin instance to take the node over and be ready",
            REGISTER_TIMEOUT,
            || async {
                let (code, _) = crate::process::http_get(port, "/readyz").await.ok()?;
                (code == 200).then_some(())
            },
        )
        .await;
        if let Err(e) = ready {
            let _ = next.process.kill();
            let _ = next.process.wait();
            bail!("{e}\nplugin log:\n{}", self.log_tail(40));
        }
        let took = next.started.elapsed();
        let (code, body) = self.http_get("/readyz").await?;
        if code == 200 || !body.contains("handed the node over") {
            let _ = next.process.kill();
            bail!("the old plugin instance does not say it handed over ({code}: {body})");
        }
        self.terminate().await?;
        self.process = Some(next.process);
        self.pod_uid = next.pod_uid;
        self.metrics_port = port;
        Ok(took)
    }

    /// [`SimNode::start_successor`], then [`SimNode::finish_roll`].
    pub async fn roll_plugin(&mut self) -> anyhow::Result<Duration> {
        let next = self.start_successor()?;
        self.finish_roll(next).await
    }

    /// Runs `script` (sh) in the checkpoint volume's mount namespace, where the checkpoint directory
    /// is `$0`; the node must have been started by
    /// [`SimNode::start_with_small_checkpoint_dir`]. Returns whether the script succeeded.
    fn in_plugin_mounts(&self, script: &str) -> anyhow::Result<bool> {
        let volume = self
            .checkpoint_volume
            .as_ref()
            .context("the plugin has no checkpoint directory of its own")?;
        volume.run(&self.checkpoint_mount_point(), script)
    }

    /// Makes the plugin's checkpoint directory read-only (`true`) or writable again, as a
    /// failing disk remounted read-only would.
    pub fn checkpoint_dir_read_only(&self, read_only: bool) -> anyhow::Result<()> {
        let mode = if read_only { "ro" } else { "rw" };
        let done = self.in_plugin_mounts(&format!("mount -o remount,{mode} \"$0\""))?;
        anyhow::ensure!(done, "remounting the checkpoint directory {mode} failed");
        Ok(())
    }

    /// Fills the plugin's checkpoint directory to the last byte (`true`), or frees it again.
    pub fn fill_checkpoint_dir(&self, full: bool) -> anyhow::Result<()> {
        if full {
            // cat fails once the tmpfs is full: that is the point.
            self.in_plugin_mounts("cat /dev/zero > \"$0/filler\"")?;
            let left = self.in_plugin_mounts("head -c 1 /dev/zero > \"$0/one-more\"")?;
            anyhow::ensure!(!left, "the checkpoint directory still takes writes");
        } else {
            let freed = self.in_plugin_mounts("rm -f \"$0/filler\" \"$0/one-more\"")?;
            anyhow::ensure!(freed, "freeing the checkpoint directory failed");
        }
        Ok(())
    }

    /// Stops (`SIGSTOP`) or resumes (`SIGCONT`) the running plugin process, to hold it at
    /// a point a test wants to be in.
    pub fn pause_plugin(&self, paused: bool) -> anyhow::Result<()> {
        let child = self.process.as_ref().context("no plugin is running")?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
        let signal = if paused {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        nix::sys::signal::kill(pid, signal)?;
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
        self.kubelet.registry_dir()
    }

    /// Starts the plugin again (after [`SimNode::kill`] or a fault-injected abort) and
    /// waits until the kubelet registered it once more.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_registered(1).await
    }

    /// Kills the node's kubelet and starts it again while the plugin keeps running;
    /// returns once the restarted kubelet has registered the plugin again.
    pub async fn restart_kubelet(&mut self, cp: &ControlPlane) -> anyhow::Result<()> {
        let before = self.registrations().await.unwrap_or(0);
        self.kubelet.restart(cp).await?;
        self.wait_registered(before + 1).await
    }

    /// Simulates a reboot of the node: the kubelet and the plugin die, and what a reboot
    /// wipes is gone when they start again: MIG instances (the MIG mode stays, as on an
    /// A100), MPS daemons and compute modes, the CDI specs (tmpfs), the runtime's
    /// containers; the boot ID is new. The kubelet's root directory is on disk and
    /// survives. The plugin's checkpoint survives too, as it does where `--checkpoint-dir`
    /// is on disk rather than the tmpfs the chart uses: the harder case, in which the boot
    /// ID alone tells the plugin its records are void. The kubelet comes up first, as
    /// systemd starts it before the plugin's pod.
    pub async fn reboot(&mut self, cp: &ControlPlane) -> anyhow::Result<()> {
        self.kill();
        self.kubelet.kill();
        let mut state = tessera_gpu::backend::sim::state::load_state(&self.sim_state())?
            .context("the simulated hardware has no state file yet")?;
        for g in &mut state.gpus {
            g.instances.clear();
            // Its MPS daemon sees itself forgotten and exits, as a reboot ends it.
            g.mps = None;
            g.compute_mode = tessera_gpu::backend::ComputeMode::Default;
            g.mig_enabled = g.mig_pending;
        }
        tessera_gpu::backend::sim::state::save_state(&self.sim_state(), &state)?;
        for entry in std::fs::read_dir(self.cdi_dir())? {
            std::fs::remove_file(entry?.path())?;
        }
        std::fs::write(self.root.join("boot_id"), uuid::Uuid::new_v4().to_string())?;
        self.kubelet.restart(cp).await?;
        // The plugin is already dead, so this only starts it again.
        self.restart().await
    }

    /// The running plugin's peak resident memory so far (`VmHWM`), in KiB.
    pub fn plugin_peak_kib(&self) -> Option<f64> {
        crate::process::status_kib(self.process.as_ref()?.id(), "VmHWM")
    }

    /// Whether the plugin process is still running.
    pub fn plugin_running(&mut self) -> bool {
        self.process
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The loopback port of the plugin's HTTP endpoint (a scraper's target).
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// GETs a path of the plugin's HTTP endpoint (`/metrics`, `/readyz`, …): (status, body).
    pub async fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::process::http_get(self.metrics_port, path).await
    }

    /// CDI spec directory: on tmpfs where the machine has one, as `/var/run/cdi` is on
    /// a real node.
    pub fn cdi_dir(&self) -> PathBuf {
        self.run.path().join("cdi")
    }

    /// The plugin's state directory (offers, GPU faults, MPS pipes).
    pub fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }

    /// The plugin's checkpoint directory (`claims/`, `layouts/`), on tmpfs as `/run` is on
    /// a node, as this process can read and write it (through the checkpoint volume's
    /// namespace when the node has one).
    pub fn checkpoint_dir(&self) -> PathBuf {
        match &self.checkpoint_volume {
            Some(v) => v.view(&self.checkpoint_mount_point()),
            None => self.checkpoint_mount_point(),
        }
    }

    /// The checkpoint directory as the plugin names it.
    fn checkpoint_mount_point(&self) -> PathBuf {
        self.run.path().join("checkpoint")
    }

    /// The node's simulated NVIDIA driver.
    pub fn driver(&self) -> SimRoot {
        SimRoot::new(self.root.join("driver"))
    }

    /// The simulated hardware's state file.
    pub fn sim_state(&self) -> PathBuf {
        self.driver().state()
    }

    /// The simulated hardware's inventory (YAML).
    pub fn inventory_path(&self) -> PathBuf {
        self.driver().inventory()
    }

    /// The simulator's fault-injection file.
    pub fn faults_path(&self) -> PathBuf {
        self.driver().faults()
    }

    /// The plugin's crash-point control file (`tessera_plugin::crash_points`).
    pub fn crash_points_path(&self) -> PathBuf {
        self.root.join("crash-points.json")
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
