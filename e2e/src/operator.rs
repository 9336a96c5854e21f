//! A `tessera-operator` process on the test bed, under its own ServiceAccount and RBAC
//! (`config/rbac/operator.yaml`), so a missing or extra verb shows.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::{ControlPlane, cluster, repo_root, wait::eventually};

/// How long the operator may take to fill its caches.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The operator binary: `TESSERA_OPERATOR_BIN`, else next to the test binary.
pub fn operator_binary() -> anyhow::Result<PathBuf> {
    crate::process::workspace_binary("tessera-operator", "TESSERA_OPERATOR_BIN")
}

/// One operator replica.
pub struct OperatorProcess {
    dir: tempfile::TempDir,
    metrics_port: u16,
    leader_elect: bool,
    args: Vec<String>,
    process: Option<Child>,
    /// Its identity in the Lease.
    pub identity: String,
}

impl OperatorProcess {
    /// Installs the RBAC (idempotent) and starts a replica as ServiceAccount
    /// `tessera-system/tessera-operator`; waits until its caches are filled.
    pub async fn start(
        cp: &ControlPlane,
        identity: &str,
        leader_elect: bool,
    ) -> anyhow::Result<Self> {
        // Short, so a test sees waiting claims batched, and quickly.
        Self::start_with(
            cp,
            identity,
            leader_elect,
            &["--adaptive-batch-window-seconds", "1"],
        )
        .await
    }

    /// [`Self::start`] with `args` after the test bed's own.
    pub async fn start_with(
        cp: &ControlPlane,
        identity: &str,
        leader_elect: bool,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let admin = cp.admin_client().await?;
        cluster::apply_dir(&admin, &repo_root().join("config/rbac"), false).await?;
        let dir = tempfile::Builder::new()
            .prefix("tessera-operator-")
            .tempdir()?;
        cluster::service_account_kubeconfig(
            cp,
            "tessera-system",
            "tessera-operator",
            &dir.path().join("kubeconfig"),
        )
        .await?;
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut op = Self {
            dir,
            metrics_port,
            leader_elect,
            args: args.iter().map(ToString::to_string).collect(),
            process: None,
            identity: identity.to_string(),
        };
        op.spawn()?;
        op.wait_ready().await?;
        Ok(op)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("operator.log")
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new(operator_binary()?);
        cmd.arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .args(["--leader-election-identity", &self.identity])
            .args(["--leader-election-namespace", "tessera-system"])
            // Short, so a test sees a failover quickly.
            .args(["--leader-election-lease-seconds", "6"])
            .args(&self.args)
            .env("RUST_LOG", "info,tessera_operator=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if self.leader_elect {
            cmd.arg("--leader-elect");
        }
        self.process = Some(cmd.spawn()?);
        Ok(())
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        eventually("the operator to fill its caches", READY_TIMEOUT, || async {
            self.http_get("/readyz")
                .await
                .ok()
                .filter(|(c, _)| *c == 200)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\noperator log:\n{}", self.log_tail(30)))?;
        Ok(())
    }

    /// Kills the process (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.process.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills and starts it again; waits until its caches are filled.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready().await
    }

    /// The value of one sample of `/metrics` (`name{labels}` as exposed); `None` when the
    /// operator does not answer or has no such sample.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (code, body) = self.http_get("/metrics").await.ok()?;
        if code != 200 {
            return None;
        }
        crate::process::sample(&body, sample)
    }

    /// API writes of `object` (`gpunode_spec`, `policy_status`) this process made.
    pub async fn writes(&self, object: &str) -> u64 {
        self.metric(&format!(
            "tessera_operator_writes_total{{object=\"{object}\"}}"
        ))
        .await
        .map_or(0, |v| v as u64)
    }

    /// Whether this replica says it leads (`tessera_operator_leader`).
    pub async fn leading(&self) -> bool {
        self.metric("tessera_operator_leader").await == Some(1.0)
    }

    /// Its resident memory (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> Option<f64> {
        crate::process::status_kib(self.process.as_ref()?.id(), "VmRSS")
    }

    /// Its peak resident memory so far (`VmHWM`), in KiB.
    pub fn peak_kib(&self) -> Option<f64> {
        crate::process::status_kib(self.process.as_ref()?.id(), "VmHWM")
    }

    /// The loopback port of its HTTP endpoint (a scraper's target).
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// GETs a path of its HTTP endpoint: (status, body).
    pub async fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::process::http_get(self.metrics_port, path).await
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        crate::process::tail(&self.log_path(), n)
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== tessera-operator {} (last lines)\n{}",
                self.identity,
                self.log_tail(40)
            );
        }
        self.kill();
    }
}
