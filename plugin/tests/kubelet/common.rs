//! Fixtures: a scriptable fake driver and a running server in a temp dir.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tempfile::TempDir;
use tessera_plugin::kubelet::{
    ClaimRef, DeviceHealthEntry, DraDriver, KubeletServer, KubeletServerConfig, PrepareResults,
    PreparedDevice, UnprepareResults, client::RegistrationClient, start,
};
use tokio::sync::watch;

/// Upper bound for anything a test waits for; generous for a loaded 2-core CI machine.
pub const WAIT: Duration = Duration::from_secs(10);

/// Deliberately not the real driver name, so a hard-coded name would be caught.
pub const DRIVER: &str = "fake.tessera.test";

/// A driver whose answers are scripted per claim UID and which records every call.
#[derive(Default)]
pub struct FakeDriver {
    /// UIDs to fail with the given message.
    pub fail: HashMap<String, String>,
    /// UIDs to leave out of the result map.
    pub forget: HashSet<String>,
    /// UIDs for which to return a device without a pool name.
    pub broken_device: HashSet<String>,
    /// Claims of each prepare call, in order.
    pub prepared: Mutex<Vec<Vec<ClaimRef>>>,
    /// Claims of each unprepare call, in order.
    pub unprepared: Mutex<Vec<Vec<ClaimRef>>>,
}

/// The device the fake driver prepares for `uid`.
pub fn device_for(uid: &str) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpu".to_owned()],
        pool_name: "node-a".to_owned(),
        device_name: format!("gpu-{uid}"),
        cdi_device_ids: vec![format!("k8s.gpu.tessera.dev/claim={uid}")],
        share_id: Some(format!("share-{uid}")),
    }
}

impl DraDriver for FakeDriver {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.prepared.lock().unwrap().push(claims.clone());
        claims
            .into_iter()
            .filter(|c| !self.forget.contains(&c.uid))
            .map(|c| {
                let result = match self.fail.get(&c.uid) {
                    Some(error) => Err(error.clone()),
                    None if self.broken_device.contains(&c.uid) => Ok(vec![PreparedDevice {
                        pool_name: String::new(),
                        ..device_for(&c.uid)
                    }]),
                    None => Ok(vec![device_for(&c.uid)]),
                };
                (c.uid, result)
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        self.unprepared.lock().unwrap().push(claims.clone());
        claims
            .into_iter()
            .filter(|c| !self.forget.contains(&c.uid))
            .map(|c| (c.uid, Ok(())))
            .collect()
    }
}

/// A claim reference.
pub fn claim(namespace: &str, uid: &str, name: &str) -> ClaimRef {
    ClaimRef {
        namespace: namespace.to_owned(),
        uid: uid.to_owned(),
        name: name.to_owned(),
    }
}

/// Configuration rooted in `dir`, with a fast re-registration poll for tests.
pub fn config(dir: &TempDir) -> KubeletServerConfig {
    KubeletServerConfig {
        registry_dir: dir.path().join("plugins_registry"),
        plugins_dir: dir.path().join("plugins"),
        reregister_poll: Duration::from_millis(20),
        ..KubeletServerConfig::new(DRIVER)
    }
}

/// A started server and everything a test needs to poke at it.
pub struct Running {
    pub dir: TempDir,
    pub server: KubeletServer,
    pub driver: Arc<FakeDriver>,
    pub health: watch::Sender<Vec<DeviceHealthEntry>>,
}

impl Running {
    /// Starts both servers for `driver` in a fresh temp dir.
    pub async fn start(driver: FakeDriver) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let driver = Arc::new(driver);
        let (health, health_rx) = watch::channel(Vec::new());
        let server = start(config(&dir), Arc::clone(&driver), health_rx)
            .await
            .unwrap();
        Self {
            dir,
            server,
            driver,
            health,
        }
    }

    /// A registration client, as the kubelet's plugin watcher would open.
    pub async fn registration_client(&self) -> RegistrationClient {
        RegistrationClient::connect(self.server.registration_socket(), WAIT)
            .await
            .unwrap()
    }

    /// Shuts the servers down and waits for them, within [`WAIT`].
    pub async fn shutdown(self) -> TempDir {
        tokio::time::timeout(WAIT, self.server.serve_until(async {}))
            .await
            .expect("shutdown finishes in time")
            .unwrap();
        self.dir
    }
}
