//! A real control plane on loopback: etcd, kube-apiserver, kube-scheduler and
//! kube-controller-manager, configured as `reference/test-bed.md` §5 describes.
//!
//! - Authentication: a static admin token (group `system:masters`) for the harness,
//!   kubectl, the scheduler and the controller-manager; real ServiceAccount tokens
//!   (TokenRequest) for components under test, so RBAC is exercised for real.
//! - Admission: `ServiceAccount` is off (no token controller, no default-SA wait) and
//!   `TaintNodesByCondition` is off, because our Nodes have no kubelet to clear the
//!   not-ready taint.
//! - kube-controller-manager runs only the controllers the tests need; in particular no
//!   node-lifecycle controller, which would taint and evict pods on kubelet-less Nodes.
//! - With [`ControlPlaneOptions::node_network`], for nodes that run real containers
//!   ([`crate::containerd_node`]): pods get ServiceAccount tokens (admission plugin and
//!   the `kube-root-ca.crt` publisher on) and reach the API server at the `kubernetes`
//!   Service's address, and the API server reaches kubelets and pods through an egress
//!   proxy ([`crate::egress`]). The API server always shows kubelets a client
//!   certificate of its own CA ([`ControlPlane::kubelet_client_ca`]).

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde::{Deserialize, Serialize};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, net::TcpStream};

use crate::{
    BinDir, certs,
    egress::EgressProxy,
    process::{self, Component},
};

const ADMIN_USER: &str = "tessera-admin";

/// Starting or using the control plane failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No component of that name runs.
    #[error("no component {0} runs in this control plane")]
    NoComponent(&'static str),
    /// A file operation failed.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Key material could not be generated.
    #[error(transparent)]
    Certs(#[from] certs::Error),
    /// A component could not be started.
    #[error(transparent)]
    Spawn(#[from] process::Error),
    /// A component did not become ready in time.
    #[error("{component} did not become ready within {seconds}s; last lines of {log}:\n{tail}")]
    NotReady {
        /// Component.
        component: &'static str,
        /// Timeout.
        seconds: u64,
        /// Its log file.
        log: PathBuf,
        /// Last lines of that log.
        tail: String,
    },
    /// A component exited during start-up.
    #[error("{component} exited during start-up ({status}); last lines of {log}:\n{tail}")]
    Exited {
        /// Component.
        component: &'static str,
        /// Exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// Last lines of that log.
        tail: String,
    },
    /// The kubeconfig could not be used.
    #[error("cannot build a client from {path}")]
    Kubeconfig {
        /// Kubeconfig path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A Kubernetes client error.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// State of a detached control plane could not be read.
    #[error("no control plane state in {0}: start one with `cargo xtask controlplane up`")]
    NoState(PathBuf),
    /// State file is not valid JSON.
    #[error("cannot parse {path}")]
    State {
        /// State file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to start a control plane.
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// The binaries.
    pub bins: BinDir,
    /// A fixed directory (detached control planes); `None`: a fresh temp dir removed on drop.
    pub dir: Option<PathBuf>,
    /// Feature gates set on top of the version's own (e.g. `DRAConsumableCapacity=false`
    /// to see how the plugin copes with a cluster that lacks a feature).
    pub extra_feature_gates: Vec<String>,
    /// CPU niceness of every component (`nice -n`); `None`: the caller's. The benchmark
    /// sets it so that on a small machine the control plane yields the CPU to the process
    /// measured, as it would from its own machines in a real cluster.
    pub nice: Option<i32>,
    /// kube-controller-manager controllers to run besides the test bed's own, e.g.
    /// `deployment-controller` for a test that installs workloads as a user would.
    pub extra_controllers: Vec<String>,
    /// Serve nodes that run real containers: ServiceAccount tokens in pods, the
    /// `kube-root-ca.crt` ConfigMap in every namespace, and the egress proxy through which
    /// the API server reaches kubelets and pods.
    pub node_network: bool,
}

impl ControlPlaneOptions {
    /// Options for `bins` in a fresh temp dir.
    pub fn new(bins: BinDir) -> Self {
        Self {
            bins,
            dir: None,
            extra_feature_gates: Vec::new(),
            nice: None,
            extra_controllers: Vec::new(),
            node_network: false,
        }
    }
}

/// What a detached control plane leaves behind so `env` and `down` can find it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct State {
    /// Process (group) ids of the components.
    pub pids: Vec<u32>,
    /// The process that owns the control plane (0 when detached).
    pub owner_pid: u32,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// Directory with kubectl.
    pub bin_dir: PathBuf,
    /// API server URL.
    pub server: String,
}

/// A running control plane. Dropping it stops every component (also during a panic) and
/// removes its directory unless it was detached.
pub struct ControlPlane {
    dir: PathBuf,
    temp: Option<tempfile::TempDir>,
    components: Vec<Component>,
    /// How to start each component again: its flags and how to tell it is ready.
    restarts: std::collections::HashMap<&'static str, (Vec<String>, Ready)>,
    kubeconfig: PathBuf,
    server: String,
    bins: BinDir,
    detached: bool,
    extra_gates: Vec<String>,
    nice: Option<i32>,
    extra_controllers: Vec<String>,
    egress: Option<EgressProxy>,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager and waits
    /// until each is ready.
    pub async fn start(opts: ControlPlaneOptions) -> Result<Self> {
        sweep_orphans();
        let (dir, temp) = match opts.dir {
            Some(d) => {
                let _ = std::fs::remove_dir_all(&d);
                create_dir(&d)?;
                (d, None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("tessera-cp-")
                    .tempdir()
                    .map_err(|source| Error::Io {
                        action: "creating a temp dir",
                        path: std::env::temp_dir(),
                        source,
                    })?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let extra_gates = opts.extra_feature_gates;
        let egress = if opts.node_network {
            let socket = dir.join("egress.sock");
            Some(EgressProxy::start(&socket).map_err(|source| Error::Io {
                action: "serving the egress proxy on",
                path: socket,
                source,
            })?)
        } else {
            None
        };
        let mut cp = Self {
            egress,
            extra_gates,
            nice: opts.nice,
            extra_controllers: opts.extra_controllers,
            kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            temp,
            components: Vec::new(),
            restarts: std::collections::HashMap::new(),
            server: String::new(),
            bins: opts.bins,
            detached: false,
        };
        // Free ports are found by binding port 0 and letting go; a test starting in
        // parallel can take one in between. A component that then fails to bind is not a
        // failure of the control plane: start again on fresh ports.
        let mut attempt = 1;
        loop {
            match cp.boot().await {
                Ok(()) => return Ok(cp),
                Err(Error::Exited { ref tail, .. })
                    if attempt < 3 && tail.contains("address already in use") =>
                {
                    attempt += 1;
                    cp.stop();
                    let _ = std::fs::remove_dir_all(cp.dir.join("etcd"));
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn boot(&mut self) -> Result<()> {
        let dir = self.dir.clone();
        let logs = dir.join("logs");
        create_dir(&logs)?;
        let m = certs::generate()?;
        let token = format!("{:032x}", rand::random::<u128>());
        write(&dir.join("serving.crt"), &m.serving_cert_pem)?;
        write(&dir.join("serving.key"), &m.serving_key_pem)?;
        write(&dir.join("sa.key"), &m.sa_key_pem)?;
        write(&dir.join("sa.pub"), &m.sa_pub_pem)?;
        write(&dir.join("kubelet-client-ca.crt"), &m.kubelet_client_ca_pem)?;
        write(&dir.join("kubelet-client.crt"), &m.kubelet_client_cert_pem)?;
        write(&dir.join("kubelet-client.key"), &m.kubelet_client_key_pem)?;
        write(
            &dir.join("tokens.csv"),
            &format!("{token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n"),
        )?;
        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let api_port = free_port()?;
        let sched_port = free_port()?;
        let kcm_port = free_port()?;
        self.server = format!("https://127.0.0.1:{api_port}");
        write(
            &self.kubeconfig,
            &kubeconfig_yaml(&self.server, &m.serving_cert_pem, &token),
        )?;
        write_state(&dir, &self.state())?;

        let v = self.bins.version;
        let gates = v
            .feature_gates()
            .into_iter()
            .map(str::to_string)
            .chain(self.extra_gates.iter().cloned())
            .collect::<Vec<_>>()
            .join(",");
        let path = |p: &str| dir.join(p).display().to_string();

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        self.spawn(
            "etcd",
            vec![
                format!("--data-dir={}", path("etcd")),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                // Test data is thrown away: skipping fsync makes etcd several times faster.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
            &logs,
        )?;
        self.ready_is("etcd", Ready::Etcd(etcd_port));
        self.wait_http(
            "etcd",
            etcd_port,
            "/health",
            "true",
            Duration::from_secs(30),
        )
        .await?;

        let mut api_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--tls-cert-file={}", path("serving.crt")),
            format!("--tls-private-key-file={}", path("serving.key")),
            format!("--cert-dir={}", path("apiserver-certs")),
            format!("--token-auth-file={}", path("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-issuer=https://127.0.0.1:{api_port}"),
            format!("--service-account-key-file={}", path("sa.pub")),
            format!("--service-account-signing-key-file={}", path("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            format!(
                "--kubelet-client-certificate={}",
                path("kubelet-client.crt")
            ),
            format!("--kubelet-client-key={}", path("kubelet-client.key")),
            // The `kubernetes` Service endpoints would point at loopback, which the
            // endpoints API refuses; nothing here uses in-cluster discovery.
            "--endpoint-reconciler-type=none".into(),
            // Profiling (`/debug/pprof`) only when asked: it is how the README's figures of
            // the API server's own cost were taken.
            format!(
                "--profiling={}",
                std::env::var_os("TESSERA_PROFILE_APISERVER").is_some()
            ),
        ];
        match &self.egress {
            Some(egress) => {
                write(&dir.join("egress.yaml"), &egress.selector_config())?;
                api_args.extend([
                    // Pods get their ServiceAccount's token; Nodes are still admitted
                    // without the not-ready taint, which only the node-lifecycle
                    // controller (left out) would take off again.
                    "--disable-admission-plugins=TaintNodesByCondition".into(),
                    format!("--egress-selector-config-file={}", path("egress.yaml")),
                    // A node's only address the egress proxy routes is its InternalIP.
                    "--kubelet-preferred-address-types=InternalIP".into(),
                ]);
            }
            None => api_args
                .push("--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".into()),
        }
        if !gates.is_empty() {
            api_args.push(format!("--feature-gates={gates}"));
        }
        let runtime = v.runtime_config();
        if !runtime.is_empty() {
            api_args.push(format!("--runtime-config={}", runtime.join(",")));
        }
        self.spawn("kube-apiserver", api_args, &logs)?;
        self.ready_is("kube-apiserver", Ready::ApiServer);
        self.wait_apiserver(Duration::from_secs(90)).await?;

        let kubeconfig = self.kubeconfig.display().to_string();
        let delegated = |port: u16| {
            let mut a = vec![
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                // Our clients use tokens, not client certificates or a front proxy, so there
                // is no extension-apiserver-authentication ConfigMap to look up.
                "--authentication-skip-lookup=true".into(),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
            ];
            if !gates.is_empty() {
                a.push(format!("--feature-gates={gates}"));
            }
            a
        };
        self.spawn("kube-scheduler", delegated(sched_port), &logs)?;
        let mut kcm = delegated(kcm_port);
        let controllers: Vec<&str> = [
            "resourceclaim-controller",
            "garbage-collector-controller",
            "namespace-controller",
            "serviceaccount-controller",
        ]
        .into_iter()
        .chain(self.extra_controllers.iter().map(String::as_str))
        .chain(
            self.egress
                .is_some()
                .then_some("root-ca-certificate-publisher-controller"),
        )
        .collect();
        kcm.push(format!("--controllers={}", controllers.join(",")));
        if self.egress.is_some() {
            // What pods' ServiceAccount volumes carry as ca.crt: the serving
            // certificate is its own CA.
            kcm.push(format!("--root-ca-file={}", path("serving.crt")));
        }
        self.spawn("kube-controller-manager", kcm, &logs)?;
        self.ready_is("kube-scheduler", Ready::Https(sched_port));
        self.ready_is("kube-controller-manager", Ready::Https(kcm_port));
        self.wait_https("kube-scheduler", sched_port, Duration::from_secs(60))
            .await?;
        self.wait_https("kube-controller-manager", kcm_port, Duration::from_secs(60))
            .await?;
        write_state(&dir, &self.state())?;
        Ok(())
    }

    fn spawn(&mut self, name: &'static str, args: Vec<String>, logs: &Path) -> Result<()> {
        let c = process::spawn(name, &self.bins.path(name), &args, logs, self.nice)?;
        self.components.push(c);
        self.restarts.insert(name, (args, Ready::ApiServer));
        write_state(&self.dir, &self.state())?;
        Ok(())
    }

    fn ready_is(&mut self, name: &'static str, ready: Ready) {
        if let Some(r) = self.restarts.get_mut(name) {
            r.1 = ready;
        }
    }

    /// Kills one component (SIGKILL to its process group, as a crash would), leaves it
    /// down for `down_for` (the outage being simulated), starts it again with the same
    /// flags and data, and returns once it answers again. Its earlier log is kept as
    /// `<name>.<n>.log`.
    pub async fn restart_component(
        &mut self,
        name: &'static str,
        down_for: Duration,
    ) -> Result<()> {
        let i = self
            .components
            .iter()
            .position(|c| c.name == name)
            .ok_or(Error::NoComponent(name))?;
        let (args, ready) = self
            .restarts
            .get(name)
            .cloned()
            .ok_or(Error::NoComponent(name))?;
        let mut old = self.components.remove(i);
        process::stop_group(old.child.id(), Duration::ZERO);
        let _ = old.child.wait();
        let logs = old.log.parent().map(Path::to_path_buf).unwrap_or_default();
        let kept = (1..)
            .map(|n| logs.join(format!("{name}.{n}.log")))
            .find(|p| !p.exists())
            .unwrap_or_else(|| logs.join(format!("{name}.old.log")));
        let _ = std::fs::rename(&old.log, kept);
        tokio::time::sleep(down_for).await;
        let c = process::spawn(name, &self.bins.path(name), &args, &logs, self.nice)?;
        // Stopping goes in reverse start order (etcd last): keep the position.
        self.components.insert(i, c);
        write_state(&self.dir, &self.state())?;
        let timeout = Duration::from_secs(90);
        match ready {
            Ready::Etcd(port) => self.wait_http(name, port, "/health", "true", timeout).await,
            Ready::ApiServer => self.wait_apiserver(timeout).await,
            Ready::Https(port) => self.wait_https(name, port, timeout).await,
        }
    }

    fn check_alive(&mut self, name: &'static str) -> Result<()> {
        if let Some(c) = self.components.iter_mut().find(|c| c.name == name)
            && let Ok(Some(status)) = c.child.try_wait()
        {
            return Err(Error::Exited {
                component: name,
                status: status.to_string(),
                log: c.log.clone(),
                tail: process::tail(&c.log, 30),
            });
        }
        Ok(())
    }

    fn not_ready(&self, name: &'static str, timeout: Duration) -> Error {
        let log = self
            .components
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.log.clone())
            .unwrap_or_default();
        Error::NotReady {
            component: name,
            seconds: timeout.as_secs(),
            tail: process::tail(&log, 30),
            log,
        }
    }

    async fn wait_http(
        &mut self,
        name: &'static str,
        port: u16,
        path: &str,
        expect: &str,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            self.check_alive(name)?;
            if let Ok(body) = http_get(port, path).await
                && body.contains(expect)
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(self.not_ready(name, timeout))
    }

    async fn wait_apiserver(&mut self, timeout: Duration) -> Result<()> {
        let client = self.admin_client().await?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            self.check_alive("kube-apiserver")?;
            let req = http::Request::get("/readyz").body(Vec::new());
            if let Ok(req) = req
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                // Namespaces appear shortly after readyz on a fresh etcd.
                let ns: Api<Namespace> = Api::all(client.clone());
                if ns.get_opt("default").await.ok().flatten().is_some() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(self.not_ready("kube-apiserver", timeout))
    }

    /// Waits until a component answers on its secure port. Any HTTP answer counts: the
    /// point is that it has started serving, and its `/healthz` is open to anonymous users.
    async fn wait_https(&mut self, name: &'static str, port: u16, timeout: Duration) -> Result<()> {
        let mut config = Config::new(
            format!("https://127.0.0.1:{port}")
                .parse()
                .map_err(|_| self.not_ready(name, timeout))?,
        );
        // Self-signed serving certificate generated by the component itself.
        config.accept_invalid_certs = true;
        let client = Client::try_from(config)?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            self.check_alive(name)?;
            if let Ok(req) = http::Request::get("/healthz").body(Vec::new())
                && let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(self.not_ready(name, timeout))
    }

    fn state(&self) -> State {
        State {
            pids: self.components.iter().map(|c| c.child.id()).collect(),
            owner_pid: if self.detached { 0 } else { std::process::id() },
            kubeconfig: self.kubeconfig.clone(),
            bin_dir: self.bins.dir.clone(),
            server: self.server.clone(),
        }
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The directory holding logs, keys and the kubeconfig.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binaries in use.
    pub fn bins(&self) -> &BinDir {
        &self.bins
    }

    /// The CA a kubelet trusts the API server's client certificate by (its
    /// `clientCAFile`).
    pub fn kubelet_client_ca(&self) -> PathBuf {
        self.dir.join("kubelet-client-ca.crt")
    }

    /// The routes of the egress proxy to the nodes' networks (with
    /// [`ControlPlaneOptions::node_network`]).
    pub fn node_routes(&self) -> Option<&crate::egress::Routes> {
        self.egress.as_ref().map(EgressProxy::routes)
    }

    /// The API server's port on loopback.
    pub fn api_port(&self) -> Option<u16> {
        self.server.rsplit(':').next()?.parse().ok()
    }

    /// A client with cluster-admin rights.
    pub async fn admin_client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// The admin client's configuration (to derive clients with other credentials).
    pub async fn admin_config(&self) -> Result<Config> {
        config_from_kubeconfig(&self.kubeconfig).await
    }

    /// The last lines of every component's log, for failure reports.
    pub fn logs_tail(&self, lines: usize) -> String {
        self.components
            .iter()
            .map(|c| {
                format!(
                    "==== {} ({})\n{}\n",
                    c.name,
                    c.log.display(),
                    process::tail(&c.log, lines)
                )
            })
            .collect()
    }

    /// Leaves the control plane running after this value is dropped (`controlplane up
    /// --detach`); stop it with [`stop_detached`].
    pub fn detach(mut self) -> Result<State> {
        self.detached = true;
        let state = self.state();
        write_state(&self.dir, &state)?;
        self.components.clear();
        if let Some(t) = self.temp.take() {
            let _ = t.keep();
        }
        Ok(state)
    }

    /// Stops every component, newest first. A throw-away (test) control plane is killed
    /// at once; one in a fixed directory gets time to shut down cleanly.
    pub fn stop(&mut self) {
        let grace = if self.temp.is_some() {
            Duration::ZERO
        } else {
            Duration::from_secs(5)
        };
        for c in self.components.iter_mut().rev() {
            process::stop_group(c.child.id(), grace);
            let _ = c.child.wait();
        }
        self.components.clear();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failing test: show what the control plane said, and keep its directory
            // when asked to, so the whole logs can be read.
            eprintln!("control plane logs (last lines):\n{}", self.logs_tail(25));
            if std::env::var_os("TESSERA_KEEP_LOGS").is_some()
                && let Some(t) = self.temp.take()
            {
                eprintln!("kept {}", t.keep().display());
            }
        }
        self.stop();
    }
}

/// Reads the state a detached control plane left in `dir`.
pub fn read_state(dir: &Path) -> Result<State> {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(|_| Error::NoState(dir.to_path_buf()))?;
    serde_json::from_str(&text).map_err(|source| Error::State { path, source })
}

/// Stops a detached control plane and removes its directory. Returns how many processes
/// were still running.
pub fn stop_detached(dir: &Path) -> Result<usize> {
    let state = read_state(dir)?;
    let mut running = 0;
    for pid in state.pids.iter().rev() {
        if process::alive(*pid) {
            running += 1;
            process::stop_group(*pid, Duration::from_secs(5));
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(running)
}

/// Kills control planes whose owning test process died without running destructors
/// (SIGKILL, abort), so no etcd or API server outlives its test run.
fn sweep_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("tessera-cp-") {
            continue;
        }
        let Ok(state) = read_state(&e.path()) else {
            continue;
        };
        if state.owner_pid != 0 && !process::alive(state.owner_pid) {
            for pid in state.pids {
                process::stop_group(pid, Duration::from_secs(2));
            }
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    Ok(Client::try_from(config_from_kubeconfig(path).await?)?)
}

/// A client configuration from a kubeconfig file.
pub async fn config_from_kubeconfig(path: &Path) -> Result<Config> {
    let kc = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(config)
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: tessera\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {ADMIN_USER}\n  user:\n    token: {token}\ncontexts:\n- name: tessera\n  context:\n    cluster: tessera\n    user: {ADMIN_USER}\ncurrent-context: tessera\n",
        ca = encode(ca_pem.as_bytes())
    )
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
        action: "binding a free port on",
        path: "127.0.0.1".into(),
        source,
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|source| Error::Io {
            action: "reading the port of",
            path: "127.0.0.1".into(),
            source,
        })
}

/// A plain-HTTP GET on loopback (etcd's `/health`), returning the body.
async fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
    Ok(buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
}

fn write_state(dir: &Path, state: &State) -> Result<()> {
    let text = serde_json::to_string_pretty(state).map_err(|source| Error::State {
        path: dir.join("state.json"),
        source,
    })?;
    write(&dir.join("state.json"), &text)
}

fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| Error::Io {
        action: "creating",
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        action: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// How a restarted component is known to be ready.
#[derive(Clone, Copy, Debug)]
enum Ready {
    /// etcd's `/health` on this port.
    Etcd(u16),
    /// The API server's `/readyz`.
    ApiServer,
    /// A delegated component's secure port answering.
    Https(u16),
}
