//! The kubelet stand-in: what a kubelet does for DRA on one simulated node, over the real
//! plugin sockets (no shortcut around gRPC).
//!
//! - Registration: finds the plugin's `*-reg.sock` in the node's registry directory (dot
//!   files ignored, as the kubelet's plugin watcher does), calls `GetInfo`, checks it is a
//!   DRA plugin, and answers `NotifyRegistrationStatus`. A plugin that restarts (new
//!   socket) is registered again.
//! - Pods bound to the node: once every claim of a pod is allocated and reserved for it,
//!   `NodePrepareResources` with the kubelet's 45 s timeout, retried with backoff on
//!   failure; the CDI ids are recorded per container (mirroring the kubelet's filtering by
//!   request name) and the pod is set Running and Ready.
//! - Deletion: `NodeUnprepareResources` for claims no other pod on the node uses, then the
//!   pod is removed (grace period 0), as the kubelet does after its containers stopped.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;
use tessera_plugin::kubelet::{
    ClaimRef, PreparedDevice,
    client::{DraClient, KUBELET_CALL_TIMEOUT, RegistrationClient},
    proto::registration::PluginInfo,
};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// What the stand-in did for one pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodRecord {
    /// Claims prepared for the pod (UID → namespace/name).
    pub claims: BTreeMap<String, ClaimRef>,
    /// CDI ids per container name.
    pub cdi_devices: BTreeMap<String, Vec<String>>,
    /// Last prepare error, while the pod waits.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct State {
    plugin: Option<PluginInfo>,
    registrations: u32,
    pods: BTreeMap<String, PodRecord>,
    devices: BTreeMap<String, Vec<PreparedDevice>>,
    prepare_calls: u32,
}

/// A running stand-in for one node.
pub struct KubeletStandIn {
    node: String,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for KubeletStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KubeletStandIn {
    /// Starts the stand-in for `node`, whose plugin registers in `registry_dir`.
    pub fn start(client: Client, node: &str, registry_dir: &Path) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let task = tokio::spawn(run(
            client,
            node.to_string(),
            registry_dir.to_path_buf(),
            state.clone(),
        ));
        Self {
            node: node.to_string(),
            state,
            task,
        }
    }

    /// The node this stand-in serves.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn with<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        match self.state.lock() {
            Ok(s) => f(&s),
            Err(p) => f(&p.into_inner()),
        }
    }

    /// The registered plugin, once it is.
    pub fn plugin(&self) -> Option<PluginInfo> {
        self.with(|s| s.plugin.clone())
    }

    /// How often a plugin was registered (grows when the plugin restarts).
    pub fn registrations(&self) -> u32 {
        self.with(|s| s.registrations)
    }

    /// What was done for the pod with this UID.
    pub fn pod(&self, uid: &str) -> Option<PodRecord> {
        self.with(|s| s.pods.get(uid).cloned())
    }

    /// The devices the plugin returned for a claim UID.
    pub fn claim_devices(&self, claim_uid: &str) -> Option<Vec<PreparedDevice>> {
        self.with(|s| s.devices.get(claim_uid).cloned())
    }

    /// Number of `NodePrepareResources` calls made.
    pub fn prepare_calls(&self) -> u32 {
        self.with(|s| s.prepare_calls)
    }

    /// Waits until a plugin is registered at least `n` times.
    pub async fn wait_registered(&self, n: u32, timeout: Duration) -> Result<PluginInfo, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(p) = self.plugin().filter(|_| self.registrations() >= n) {
                return Ok(p);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "no plugin registered on node {} within {timeout:?}",
                    self.node
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    match state.lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    }
}

/// The registration socket in the registry dir, if any.
fn find_registration_socket(dir: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !name.starts_with('.') && name.ends_with("-reg.sock")
        })
        .min()
}

async fn register(dir: &Path) -> Option<PluginInfo> {
    let sock = find_registration_socket(dir)?;
    let reg = RegistrationClient::connect(&sock, Duration::from_secs(5))
        .await
        .ok()?;
    let info = reg.get_info().await.ok()?;
    if info.r#type != "DRAPlugin" {
        let _ = reg
            .notify(
                false,
                format!("plugin type {} is not DRAPlugin", info.r#type),
            )
            .await;
        return None;
    }
    reg.notify(true, "").await.ok()?;
    info!(plugin = %info.name, endpoint = %info.endpoint, "kubelet stand-in registered plugin");
    Some(info)
}

async fn run(client: Client, node: String, registry_dir: PathBuf, state: Arc<Mutex<State>>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let stream = reflector(writer, watcher(pods.clone(), cfg))
        .default_backoff()
        .touched_objects();
    tokio::spawn(async move {
        use futures::StreamExt;
        stream.for_each(|_| async {}).await;
    });
    let mut dra: Option<(PluginInfo, DraClient)> = None;
    let mut backoff: BTreeMap<String, (tokio::time::Instant, Duration)> = BTreeMap::new();
    // A restarted plugin binds a new socket; inode numbers are reused, so the change time
    // tells a new socket from the old one (the kubelet gets an inotify event instead).
    let mut registered_socket_inode: Option<(u64, i64, i64)> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        // (Re-)register when the registration socket appears or is replaced.
        let inode = find_registration_socket(&registry_dir).and_then(|p| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(p)
                .ok()
                .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
        });
        if inode.is_some()
            && inode != registered_socket_inode
            && let Some(info) = register(&registry_dir).await
            && let Ok(c) = DraClient::from_info(&info, KUBELET_CALL_TIMEOUT).await
        {
            registered_socket_inode = inode;
            let mut s = lock(&state);
            s.plugin = Some(info.clone());
            s.registrations += 1;
            dra = Some((info, c));
        }
        let Some((_, client_dra)) = &dra else {
            continue;
        };
        let live: Vec<Arc<Pod>> = store.state();
        let live_uids: BTreeSet<String> = live.iter().filter_map(|p| p.uid()).collect();

        // Pods gone from the API (force-deleted): unprepare what only they used.
        let gone: Vec<String> = lock(&state)
            .pods
            .keys()
            .filter(|u| !live_uids.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            unprepare_pod(client_dra, &state, &uid).await;
        }

        for pod in live {
            let Some(uid) = pod.uid() else { continue };
            if pod.metadata.deletion_timestamp.is_some() {
                if unprepare_pod(client_dra, &state, &uid).await {
                    let api: Api<Pod> =
                        Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
                    let dp = DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    };
                    if let Err(e) = api.delete(&pod.name_any(), &dp).await {
                        debug!(pod = %pod.name_any(), error = %e, "finishing pod deletion");
                    }
                }
                continue;
            }
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running {
                continue;
            }
            if let Some((at, _)) = backoff.get(&uid)
                && tokio::time::Instant::now() < *at
            {
                continue;
            }
            match start_pod(&client, client_dra, &state, &pod).await {
                Ok(true) => {
                    backoff.remove(&uid);
                }
                Ok(false) => {}
                Err(e) => {
                    let delay = backoff
                        .get(&uid)
                        .map_or(Duration::from_millis(500), |(_, d)| {
                            (*d * 2).min(Duration::from_secs(10))
                        });
                    warn!(pod = %pod.name_any(), error = %e, retry_in = ?delay, "prepare failed; the kubelet retries");
                    lock(&state).pods.entry(uid.clone()).or_default().last_error = Some(e);
                    backoff.insert(uid, (tokio::time::Instant::now() + delay, delay));
                }
            }
        }
    }
}

/// The ResourceClaim names of a pod, once all are known.
fn claim_names(pod: &Pod) -> Option<BTreeMap<String, String>> {
    let spec = pod.spec.as_ref()?;
    let mut out = BTreeMap::new();
    for rc in spec.resource_claims.as_deref().unwrap_or_default() {
        let name = match &rc.resource_claim_name {
            Some(n) => n.clone(),
            None => pod
                .status
                .as_ref()?
                .resource_claim_statuses
                .as_deref()?
                .iter()
                .find(|s| s.name == rc.name)?
                .resource_claim_name
                .clone()?,
        };
        out.insert(rc.name.clone(), name);
    }
    Some(out)
}

/// Prepares a pod's claims and starts it. `Ok(false)`: not ready to start yet.
async fn start_pod(
    client: &Client,
    dra: &DraClient,
    state: &Mutex<State>,
    pod: &Pod,
) -> Result<bool, String> {
    let Some(names) = claim_names(pod) else {
        return Ok(false);
    };
    let ns = pod.namespace().unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    let claims_api: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let mut refs = BTreeMap::new();
    let mut by_pod_name = BTreeMap::new();
    for (pod_claim, claim_name) in &names {
        let Ok(claim) = claims_api.get(claim_name).await else {
            return Ok(false);
        };
        let st = claim.status.as_ref();
        let allocated = st.and_then(|s| s.allocation.as_ref()).is_some();
        let reserved = st
            .and_then(|s| s.reserved_for.as_ref())
            .is_some_and(|r| r.iter().any(|c| c.uid == uid));
        if !allocated || !reserved {
            return Ok(false);
        }
        let r = ClaimRef {
            namespace: ns.clone(),
            uid: claim.uid().unwrap_or_default(),
            name: claim_name.clone(),
        };
        by_pod_name.insert(pod_claim.clone(), r.uid.clone());
        refs.insert(r.uid.clone(), r);
    }
    lock(state).prepare_calls += 1;
    let results = dra
        .prepare(refs.values().cloned().collect())
        .await
        .map_err(|e| e.to_string())?;
    let mut devices = BTreeMap::new();
    let mut errors = Vec::new();
    for (claim_uid, r) in &refs {
        match results.get(claim_uid) {
            Some(Ok(d)) => {
                devices.insert(claim_uid.clone(), d.clone());
            }
            Some(Err(e)) => errors.push(format!("claim {}: {e}", r.name)),
            None => errors.push(format!("claim {}: no result", r.name)),
        }
    }
    {
        let mut s = lock(state);
        for (k, v) in &devices {
            s.devices.insert(k.clone(), v.clone());
        }
        let rec = s.pods.entry(uid.clone()).or_default();
        rec.claims = refs.clone();
    }
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    // The kubelet's per-container filtering: a container gets the devices of the claims it
    // names, restricted to one request when it names one.
    let mut cdi: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let spec = pod.spec.as_ref();
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        let ids = cdi.entry(c.name.clone()).or_default();
        for rc in c
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_deref())
            .unwrap_or_default()
        {
            let Some(claim_uid) = by_pod_name.get(&rc.name) else {
                continue;
            };
            for d in devices
                .get(claim_uid)
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                let wanted = match &rc.request {
                    Some(req) => d.request_names.is_empty() || d.request_names.contains(req),
                    None => true,
                };
                if wanted {
                    ids.extend(d.cdi_device_ids.iter().cloned());
                }
            }
        }
    }
    {
        let mut s = lock(state);
        let rec = s.pods.entry(uid.clone()).or_default();
        rec.cdi_devices = cdi.clone();
        rec.last_error = None;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = pod.name_any();
    let cdi_json = serde_json::to_string(&cdi).unwrap_or_default();
    pods.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"e2e.tessera.dev/cdi-devices": cdi_json}}}),
        ),
    )
    .await
    .map_err(|e| e.to_string())?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let containers: Vec<_> = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| json!({"name": c.name, "image": c.image, "imageID": "", "ready": true, "restartCount": 0, "started": true, "state": {"running": {"startedAt": now}}}))
        .collect();
    let status = json!({"status": {
        "phase": "Running",
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
        "containerStatuses": containers,
        "startTime": now,
    }});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map_err(|e| e.to_string())?;
    info!(pod = %name, "kubelet stand-in started pod");
    Ok(true)
}

/// Unprepares the claims of a pod that no other pod uses. Returns whether that worked.
async fn unprepare_pod(dra: &DraClient, state: &Mutex<State>, pod_uid: &str) -> bool {
    let (mine, others): (Vec<ClaimRef>, BTreeSet<String>) = {
        let s = lock(state);
        let Some(rec) = s.pods.get(pod_uid) else {
            return true;
        };
        let others = s
            .pods
            .iter()
            .filter(|(u, _)| *u != pod_uid)
            .flat_map(|(_, r)| r.claims.keys().cloned())
            .collect();
        (rec.claims.values().cloned().collect(), others)
    };
    let to_release: Vec<ClaimRef> = mine
        .into_iter()
        .filter(|c| !others.contains(&c.uid))
        .collect();
    if !to_release.is_empty() {
        match dra.unprepare(to_release.clone()).await {
            Ok(results) => {
                if let Some((uid, Err(e))) = results.iter().find(|(_, r)| r.is_err()) {
                    warn!(claim = %uid, error = %e, "unprepare failed; retrying");
                    return false;
                }
            }
            Err(e) => {
                warn!(error = %e, "unprepare call failed; retrying");
                return false;
            }
        }
    }
    let mut s = lock(state);
    s.pods.remove(pod_uid);
    for c in to_release {
        s.devices.remove(&c.uid);
    }
    true
}
