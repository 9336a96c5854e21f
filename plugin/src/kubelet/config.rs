//! Where the kubelet-facing sockets live and what the registration announces.

use std::{path::PathBuf, time::Duration};

use super::sockets;

/// The kubelet's plugin watcher directory (`KubeletRegistryDir` in the Go library).
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Parent of each driver's plugin directory (`KubeletPluginsDir`).
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// How often we look for our registration socket. A kubelet restart that wipes the
/// registry directory is noticed within this time; a stat per second costs nothing.
pub const DEFAULT_REREGISTER_POLL: Duration = Duration::from_secs(1);

/// Configuration of [`super::start`] / [`super::serve`].
#[derive(Clone, Debug)]
pub struct KubeletServerConfig {
    /// DRA driver name, e.g. `gpu.tessera.dev`; names both sockets.
    pub driver_name: String,
    /// Directory the kubelet watches for registration sockets.
    pub registry_dir: PathBuf,
    /// Directory holding `<driver>/dra.sock`. Must be the same path on the host and in
    /// the container: the kubelet dials the announced path.
    pub plugins_dir: PathBuf,
    /// Serve and advertise the health stream (v1alpha1 and v1).
    pub serve_health: bool,
    /// Poll interval of the registration-socket watch (see [`DEFAULT_REREGISTER_POLL`]).
    pub reregister_poll: Duration,
    /// This instance's name (its pod UID) when sockets are named per instance, so that
    /// a new plugin pod registers next to the old one during a rolling update.
    pub instance: Option<String>,
}

impl KubeletServerConfig {
    /// Kubelet default directories, health served.
    pub fn new(driver_name: impl Into<String>) -> Self {
        Self {
            driver_name: driver_name.into(),
            registry_dir: PathBuf::from(DEFAULT_REGISTRY_DIR),
            plugins_dir: PathBuf::from(DEFAULT_PLUGINS_DIR),
            serve_health: true,
            reregister_poll: DEFAULT_REREGISTER_POLL,
            instance: None,
        }
    }

    /// `<registry_dir>/<driver>-reg.sock`, or this instance's (see
    /// [`sockets::instance_registration_socket_path`]).
    pub fn registration_socket(&self) -> PathBuf {
        match &self.instance {
            Some(i) => {
                sockets::instance_registration_socket_path(&self.registry_dir, &self.driver_name, i)
            }
            None => sockets::registration_socket_path(&self.registry_dir, &self.driver_name),
        }
    }

    /// `<plugins_dir>/<driver>/dra.sock` (or `dra-<instance>.sock`), the endpoint
    /// announced in `GetInfo`.
    pub fn dra_socket(&self) -> PathBuf {
        match &self.instance {
            Some(i) => sockets::instance_dra_socket_path(&self.plugins_dir, &self.driver_name, i),
            None => sockets::dra_socket_path(&self.plugins_dir, &self.driver_name),
        }
    }

    /// `<plugins_dir>/<driver>`, the plugin's data directory (checkpoint, locks).
    pub fn plugin_data_dir(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver_name)
    }
}

/// The kubelet directory flags, the one definition of each (`#[command(flatten)]`ed into
/// the plugin's arguments).
#[derive(Clone, Debug, clap::Args)]
pub struct KubeletArgs {
    /// The kubelet's plugin registration directory (watched by the kubelet).
    #[arg(long, env = "TESSERA_REGISTRY_DIR", default_value = DEFAULT_REGISTRY_DIR)]
    pub registry_dir: PathBuf,
    /// The kubelet's plugins directory; the DRA socket is `<dir>/<driver>/dra.sock`.
    #[arg(long, env = "TESSERA_PLUGINS_DIR", default_value = DEFAULT_PLUGINS_DIR)]
    pub plugins_dir: PathBuf,
    /// This plugin pod's UID (from the downward API). With it the sockets are named per
    /// pod (`<driver>-<uid>-reg.sock`, `dra-<uid>.sock`) and a new plugin pod takes the
    /// node over from the running one without a gap, so the DaemonSet can roll with
    /// `maxSurge: 1`. Without it, a second instance on the node replaces the first's
    /// sockets.
    #[arg(long, env = "POD_UID", value_parser = instance_name)]
    pub pod_uid: Option<String>,
}

/// A pod UID as a socket-name part: non-empty, no path separator, no NUL.
fn instance_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.contains(['/', '\0']) || s.starts_with('.') {
        return Err(format!(
            "{s:?} cannot name a socket: give the pod's UID (fieldRef metadata.uid)"
        ));
    }
    Ok(s.to_string())
}

impl KubeletArgs {
    /// The server configuration for `driver_name` with these directories.
    pub fn into_config(self, driver_name: impl Into<String>) -> KubeletServerConfig {
        let Self {
            registry_dir,
            plugins_dir,
            pod_uid,
        } = self;
        KubeletServerConfig {
            registry_dir,
            plugins_dir,
            instance: pod_uid,
            ..KubeletServerConfig::new(driver_name)
        }
    }
}
