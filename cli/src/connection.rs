//! The connection flags every cluster command takes, as kubectl and its plugins take them
//! (`--kubeconfig`, `--context`, `--cluster`, `--user`, `--request-timeout`), and the
//! client they make. The kubeconfig is kube's own reading of it: `KUBECONFIG` may list
//! several files, merged as kubectl merges them, else `~/.kube/config`, else the
//! in-cluster service account.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Connection flags.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConnectionArgs {
    /// Path to the kubeconfig file to use (default: the files `KUBECONFIG` lists, merged,
    /// else ~/.kube/config, else the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The kubeconfig cluster to use.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// How long to wait for each request before giving up, e.g. 30s, 1m or 5 (seconds);
    /// 0 waits as long as it takes.
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = request_timeout)]
    pub request_timeout: Duration,
}

/// `--request-timeout` as kubectl reads it: a bare number is seconds, `0` is no limit.
fn request_timeout(s: &str) -> Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => tessera_api::duration::parse(s).ok_or_else(|| {
            format!("{s:?} is not a duration: write it like 30s, 1m, 1h or 5 (seconds)")
        }),
    }
}

impl ConnectionArgs {
    fn options(&self) -> KubeConfigOptions {
        KubeConfigOptions {
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
        }
    }

    /// Whether no context, cluster or user was named (then a pod may use its service
    /// account).
    fn names_nothing(&self) -> bool {
        self.context.is_none() && self.cluster.is_none() && self.user.is_none()
    }

    /// The client configuration the flags describe.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let options = self.options();
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .with_context(|| format!("using {}", path.display()))?
            }
            None => match kube::Config::from_kubeconfig(&options).await {
                Ok(config) => config,
                // No kubeconfig at all: inside a pod, as kubectl does.
                Err(e) if Kubeconfig::read().is_err() && self.names_nothing() => {
                    kube::Config::incluster().map_err(|incluster| {
                        anyhow::anyhow!(
                            "no kubeconfig ({e}) and not in a cluster ({incluster}): set KUBECONFIG or --kubeconfig"
                        )
                    })?
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(
                        "reading the kubeconfig (KUBECONFIG's files merged, else ~/.kube/config)",
                    ));
                }
            },
        };
        if !self.request_timeout.is_zero() {
            let limit = self.request_timeout;
            config.connect_timeout = Some(limit);
            config.read_timeout = Some(limit);
            config.write_timeout = Some(limit);
        }
        Ok(config)
    }

    /// A client and the namespace of the chosen context (`default` when it names none).
    pub async fn client(&self) -> anyhow::Result<(kube::Client, String)> {
        let config = self.config().await?;
        let namespace = config.default_namespace.clone();
        Ok((kube::Client::try_from(config)?, namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CONTEXTS: &str = r"
apiVersion: v1
kind: Config
current-context: first
clusters:
- name: c1
  cluster: {server: 'https://127.0.0.1:6443'}
- name: c2
  cluster: {server: 'https://127.0.0.2:7443'}
users:
- name: u
  user: {token: t}
contexts:
- name: first
  context: {cluster: c1, user: u}
- name: second
  context: {cluster: c2, user: u, namespace: team-b}
";

    fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn context_picks_the_cluster_and_its_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "config", TWO_CONTEXTS);
        let args = |context: Option<&str>| ConnectionArgs {
            kubeconfig: Some(path.clone()),
            context: context.map(str::to_string),
            ..ConnectionArgs::default()
        };
        let rt = runtime();
        let first = rt.block_on(args(None).config()).unwrap();
        assert_eq!(first.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(first.default_namespace, "default");
        let second = rt.block_on(args(Some("second")).config()).unwrap();
        assert_eq!(second.cluster_url.to_string(), "https://127.0.0.2:7443/");
        assert_eq!(second.default_namespace, "team-b");
        let err = rt.block_on(args(Some("third")).config()).unwrap_err();
        assert!(format!("{err:#}").contains("third"), "{err:#}");
    }

    #[test]
    fn request_timeouts_read_as_kubectl_reads_them() {
        assert_eq!(request_timeout("0"), Ok(Duration::ZERO));
        assert_eq!(request_timeout("5"), Ok(Duration::from_secs(5)));
        assert_eq!(request_timeout("1m"), Ok(Duration::from_secs(60)));
        assert!(request_timeout("soon").unwrap_err().contains("30s"));
    }
}
