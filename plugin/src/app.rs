//! Wiring the plugin together: what `tessera-plugin` runs until it is told to stop.
//!
//! The kubelet's calls are served on the caller's runtime; everything else (watches,
//! slices, status writes) runs on a runtime of its own with its own API client, so a burst
//! of bookkeeping never delays a prepare. (A kube client's connection tasks live on the
//! runtime that made it, hence one client per runtime.)

use std::{collections::BTreeMap, future::Future, net::SocketAddr, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::ResourceClaim,
};
use kube::{
    Api,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tessera_gpu::backend::{
    BackendError, GpuBackend,
    nvml::{NvmlBackend, root::DriverRoot},
    sim::SimBackend,
};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    cdi::CdiWriter,
    checkpoint::{self, CheckpointStore},
    config::{Args, BackendKind},
    driver::{ClaimError, Driver, DriverConfig, DriverHandle, KubeClaims, PendingDriver},
    driver_files::{self, DriverFiles},
    fence::AppliedOffers,
    handover::{HandoverListener, NodeDir, NodeLock, Request},
    health_store::HealthStore,
    kubelet,
    metrics::Metrics,
    node::{NodeLoop, NodeLoopConfig},
    offer_store::OfferStore,
    ratelimit::RateLimiter,
    state::NodeGpus,
};

/// How much lower the background threads' CPU priority is than the kubelet-facing ones'.
const BACKGROUND_NICENESS: i32 = 10;

/// Why the plugin could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The background runtime could not be made.
    #[error("starting the background runtime")]
    Runtime(#[source] std::io::Error),
    /// The API client could not be made.
    #[error(transparent)]
    Client(#[from] tessera_kit::client::Error),
    /// `--backend sim` without its inventory.
    #[error("--sim-inventory is required with --backend sim")]
    NoSimInventory,
    /// The hardware backend could not start.
    #[error("starting the {backend} GPU backend")]
    Backend {
        /// Which.
        backend: &'static str,
        /// Why.
        #[source]
        source: BackendError,
    },
    /// The node's GPUs could not be listed.
    #[error("listing the node's GPUs")]
    Gpus(#[source] BackendError),
    /// The Node object could not be read.
    #[error("reading Node {node} (is --node-name right?)")]
    Node {
        /// `--node-name`.
        node: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The checkpoint could not be loaded.
    #[error("loading the checkpoint")]
    Checkpoint(#[source] checkpoint::Error),
    /// The CDI hook could not be installed on the host.
    #[error("installing the CDI hook {} as {}", .from.display(), .to.display())]
    Hook {
        /// `--cdi-hook`.
        from: std::path::PathBuf,
        /// Where it goes.
        to: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Start-up recovery failed.
    #[error("reconciling the checkpoint with the hardware")]
    Recovery(#[source] ClaimError),
    /// The metrics address could not be bound.
    #[error("binding the metrics address {addr}")]
    Metrics {
        /// `--metrics-address`.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kubelet-facing sockets failed.
    #[error(transparent)]
    Kubelet(#[from] kubelet::ServeError),
    /// Taking the node, or handing it over, failed.
    #[error("taking the node over")]
    Handover(#[source] crate::handover::Error),
    /// A task of the plugin's own panicked.
    #[error("the {what} task failed")]
    Task {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// Runs the plugin until `shutdown` resolves, then removes the kubelet sockets.
///
/// Start-up registers with the kubelet before this instance owns the node, so a new
/// plugin pod next to a running one takes over without a gap (see [`crate::handover`]).
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    info!(version = env!("CARGO_PKG_VERSION"), node = %args.node_name, backend = ?args.backend, "starting tessera-plugin");
    let background = background_runtime()?;
    let client = {
        let kubeconfig = args.kubeconfig.clone();
        background
            .spawn(async move { tessera_kit::client::client(kubeconfig).await })
            .await
            .map_err(|source| Error::Task {
                what: "API client",
                source,
            })??
    };
    let backend = backend(&args)?;
    let node: Node = Api::all(client.clone())
        .get(&args.node_name)
        .await
        .map_err(|source| Error::Node {
            node: args.node_name.clone(),
            source,
        })?;
    let node_uid = node.metadata.uid.unwrap_or_default();

    let metrics = Arc::new(Metrics::new());
    let (ready_tx, ready_rx) = watch::channel(Err("starting".to_string()));
    let addr = tessera_kit::http::serve(args.metrics_address, metrics.clone(), ready_rx)
        .await
        .map_err(|source| Error::Metrics {
            addr: args.metrics_address,
            source,
        })?;
    info!(%addr, "serving /metrics, /healthz, /readyz");

    // Prepare reads claims from this watch cache instead of making an API round trip;
    // the node loop hears of its changes (a claim that held a GPU's change back ending).
    let (claim_cache, claim_writer) = reflector::store();
    let claims_api: Api<ResourceClaim> = Api::all(client.clone());
    let claim_events = Arc::new(tokio::sync::Notify::new());
    let notify = claim_events.clone();
    background.spawn(
        reflector(
            claim_writer,
            watcher(claims_api, watcher::Config::default()),
        )
        .default_backoff()
        .for_each(move |_| {
            notify.notify_one();
            std::future::ready(())
        }),
    );
    // Pods nominated to this node: a fence stands while one is being bound (see
    // `fence`). Few at any time, so the watch is cheap.
    let (nominated_cache, nominated_writer) = reflector::store();
    let pods_api: Api<Pod> = Api::all(client.clone());
    let notify = claim_events.clone();
    background.spawn(
        reflector(
            nominated_writer,
            watcher(
                pods_api,
                watcher::Config::default()
                    .fields(&format!("status.nominatedNodeName={}", args.node_name)),
            ),
        )
        .default_backoff()
        .for_each(move |_| {
            notify.notify_one();
            std::future::ready(())
        }),
    );

    let (driver_tx, driver_rx) = watch::channel(None);
    let kcfg = args.kubelet.clone().into_config(args.driver_name.clone());
    let node_dir = NodeDir::new(kcfg.plugin_data_dir());
    let instance = kcfg
        .instance
        .clone()
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let owner = Owner {
        args: &args,
        client,
        backend,
        background: &background,
        metrics,
        node_uid,
        claim_cache,
        nominated_cache,
        claim_events,
        ready_tx,
        driver_tx,
        driver_rx,
        kcfg,
        node_dir,
        instance,
    };

    let mut shutdown = std::pin::pin!(shutdown);
    let (server, health_tx) = owner.start_kubelet().await?;
    let taken = tokio::select! {
        () = &mut shutdown => None,
        lock = owner.take_node(server.registration_state()) => Some(lock?),
    };
    let Some(mut lock) = taken else {
        info!("shutting down before this instance owned the node: removing the kubelet sockets");
        return server
            .serve_until(std::future::ready(()))
            .await
            .map_err(Error::from);
    };
    let mut kubelet = Some((server, health_tx));
    loop {
        let (server, health_tx) = match kubelet.take() {
            Some(k) => k,
            None => owner.start_kubelet().await?,
        };
        match owner
            .serve(lock, server, health_tx, shutdown.as_mut())
            .await?
        {
            Served::Shutdown => break,
            Served::HandedOver => {
                info!(
                    "handed the node over; serving nothing unless the new instance lets go of the node without handing it over"
                );
                tokio::select! {
                    () = &mut shutdown => break,
                    taken = owner.node_dir.lock() => {
                        lock = taken.map_err(Error::Handover)?;
                        info!("the instance that took the node over let go of it: serving the node again");
                    }
                }
            }
        }
    }
    drop(background);
    Ok(())
}

/// How one spell of owning the node ended.
enum Served {
    /// `shutdown` came.
    Shutdown,
    /// Another instance took the node over.
    HandedOver,
}

/// What serving the node needs, kept across spells of owning it.
struct Owner<'a> {
    args: &'a Args,
    client: kube::Client,
    backend: Arc<dyn GpuBackend>,
    background: &'a Background,
    metrics: Arc<Metrics>,
    node_uid: String,
    claim_cache: reflector::Store<ResourceClaim>,
    nominated_cache: reflector::Store<Pod>,
    claim_events: Arc<tokio::sync::Notify>,
    ready_tx: watch::Sender<Result<(), String>>,
    /// The driver the kubelet's calls go to, once this instance owns the node.
    driver_tx: watch::Sender<Option<DriverHandle>>,
    driver_rx: watch::Receiver<Option<DriverHandle>>,
    kcfg: kubelet::KubeletServerConfig,
    node_dir: NodeDir,
    instance: String,
}

impl Owner<'_> {
    /// Binds the kubelet sockets (calls wait until this instance owns the node) and
    /// counts the kubelet's registrations.
    async fn start_kubelet(
        &self,
    ) -> Result<
        (
            kubelet::KubeletServer,
            watch::Sender<Vec<kubelet::DeviceHealthEntry>>,
        ),
        Error,
    > {
        let (health_tx, health_rx) = watch::channel(Vec::new());
        let pending = Arc::new(PendingDriver::new(
            self.driver_rx.clone(),
            self.metrics.calls_waiting_for_node.clone(),
        ));
        let server = kubelet::start(self.kcfg.clone(), pending, health_rx).await?;
        info!(dra = %server.dra_socket().display(), registration = %server.registration_socket().display(), "kubelet sockets listening");
        let mut accepted = server.registration_state();
        let registrations = self.metrics.kubelet_registrations.clone();
        self.background.spawn(async move {
            // Every verdict is a send, also "registered" again after a kubelet restart.
            while accepted.changed().await.is_ok() {
                if accepted.borrow_and_update().is_registered() {
                    registrations.inc();
                }
            }
        });
        Ok((server, health_tx))
    }

    /// Serves the node while holding `lock`, until `shutdown` or a handover request.
    async fn serve(
        &self,
        lock: NodeLock,
        server: kubelet::KubeletServer,
        health_tx: watch::Sender<Vec<kubelet::DeviceHealthEntry>>,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Served, Error> {
        let args = self.args;
        info!(instance = %self.instance, "this instance owns the node");
        let gpus = {
            let b = self.backend.clone();
            tokio::task::spawn_blocking(move || NodeGpus::read(b.as_ref()))
                .await
                .map_err(|source| Error::Task {
                    what: "GPU listing",
                    source,
                })?
                .map_err(Error::Gpus)?
        };
        info!(
            backend = self.backend.kind(),
            driver = gpus
                .gpus
                .first()
                .and_then(|g| g.driver_version.as_deref())
                .unwrap_or("unknown"),
            gpus = gpus.gpus.len(),
            mig_capable = gpus.layouts.len(),
            "found GPUs"
        );
        let boot_id = checkpoint::read_boot_id(&args.boot_id_file);
        let store = CheckpointStore::new(&args.checkpoint_dir, boot_id.clone());
        let offer_store = OfferStore::new(args.state_dir.join("offers.json"));
        // Only now: the instance that handed the node over no longer writes records.
        let moved = store.adopt(&args.state_dir).map_err(Error::Checkpoint)?;
        if moved > 0 {
            info!(
                moved,
                from = %args.state_dir.display(),
                to = %args.checkpoint_dir.display(),
                "moved the checkpoint records an earlier version kept in the state directory"
            );
        }
        // A change under way before a restart is fenced again, and prepare checks
        // allocations against the same offers (see `fence`).
        let applied = AppliedOffers::new(offer_store.load(&gpus.gpus).unwrap_or_else(|e| {
            warn!(
                error = &e as &dyn std::error::Error,
                "cannot read the offers recorded before a restart; a change under way applies at once"
            );
            BTreeMap::new()
        }));
        let hook = args.state_dir.join("bin").join(driver_files::HOOK_NAME);
        let installed =
            driver_files::install_hook(&args.cdi_hook, &hook).map_err(|source| Error::Hook {
                from: args.cdi_hook.clone(),
                to: hook.clone(),
                source,
            })?;
        info!(hook = %hook.display(), installed, "CDI hook in place");
        let files = Arc::new(DriverFiles::new(
            driver_files::Layout {
                driver_root: args.nvidia_driver_root.clone(),
                host_driver_root: args
                    .host_driver_root
                    .clone()
                    .unwrap_or_else(|| args.nvidia_driver_root.clone()),
                proc_devices: args.proc_devices.clone(),
                hook,
                version: gpus
                    .gpus
                    .first()
                    .and_then(|g| g.driver_version.clone())
                    .unwrap_or_default(),
                kernel_release: driver_files::kernel_release(),
            },
            Arc::new(driver_files::RealFs),
        ));
        let found = files.refresh();
        info!(
            libraries = found.libraries.len(),
            binaries = found.binaries.len(),
            firmware = found.firmware.len(),
            sockets = found.sockets.len(),
            "found the driver's files for containers"
        );
        let driver = Driver::new(DriverConfig {
            node: args.node_name.clone(),
            driver_name: args.driver_name.clone(),
            backend: self.backend.clone(),
            gpus,
            store,
            claims: Arc::new(KubeClaims::new(
                self.client.clone(),
                Some(self.claim_cache.clone()),
            )),
            cdi: CdiWriter::new(&args.cdi_dir, &args.driver_name, files),
            mps_root: args.state_dir.join("mps"),
            caps_root: args.nvidia_caps_root.clone(),
            applied: applied.clone(),
            metrics: self.metrics.clone(),
            background: self.background.handle.clone(),
            status_rate: RateLimiter::new(args.claim_status_qps, args.claim_status_burst),
        })
        .map_err(Error::Checkpoint)?;
        let report = driver.recover().await.map_err(Error::Recovery)?;
        info!(?report, "start-up recovery done");
        self.driver_tx
            .send_replace(Some(DriverHandle(driver.clone())));
        self.metrics.owns_node.set(1);
        let handover = self.node_dir.listen(&lock).map_err(Error::Handover)?;

        let node_loop = NodeLoop::new(NodeLoopConfig {
            client: self.client.clone(),
            state: driver.state(),
            keeper: driver.keeper(),
            claims: self.claim_cache.clone(),
            claim_events: self.claim_events.clone(),
            nominated: self.nominated_cache.clone(),
            settle: std::time::Duration::from_millis(args.handover_settle_ms),
            offer_store,
            applied,
            metrics: self.metrics.clone(),
            node_uid: self.node_uid.clone(),
            default_strategy: args.default_strategy,
            health_store: HealthStore::new(args.state_dir.join("gpu-health.json"), boot_id),
            health_tx,
            ready_tx: self.ready_tx.clone(),
        });
        let registration = server.registration_state();
        let health_events = self.backend.health_events();
        let (stop_tx, stop_rx) = watch::channel(false);
        let wait_stop = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let loop_task = self.background.spawn(node_loop.run(
            self.client.clone(),
            registration,
            health_events,
            wait_stop(stop_rx.clone()),
        ));
        let serve_task = tokio::spawn(server.serve_until(wait_stop(stop_rx)));

        let request = tokio::select! {
            () = &mut shutdown => None,
            request = next_request(&handover) => Some(request),
        };
        let handed_over = |to: &str| Err(format!("handed the node over to plugin instance {to}"));
        match &request {
            None => info!("shutting down: removing the kubelet sockets"),
            Some(r) => {
                info!(to = %r.from, "handing the node over: stopping the node loop and the kubelet sockets");
                let _ = self.ready_tx.send(handed_over(&r.from));
            }
        }
        let _ = stop_tx.send(true);
        let served = serve_task.await.map_err(|source| Error::Task {
            what: "kubelet server",
            source,
        })?;
        let looped = loop_task.await.map_err(|source| Error::Task {
            what: "node loop",
            source,
        });
        served?;
        looped?;
        let Some(request) = request else {
            return Ok(Served::Shutdown);
        };
        // The node loop may have said "ready" once more while it stopped.
        let _ = self.ready_tx.send(handed_over(&request.from));
        self.metrics.ready.set(0);
        self.metrics.owns_node.set(0);
        self.driver_tx.send_replace(None);
        drop(handover);
        drop(lock);
        let from = request.from.clone();
        if !request.released().await {
            tracing::warn!(to = %from, "the new instance did not say it took the node");
        }
        Ok(Served::HandedOver)
    }

    /// Takes the node for this instance: at once when no other instance holds it;
    /// otherwise once the kubelet has accepted this instance's registration (so that no
    /// call finds the node without a registered plugin), by asking the holder to hand
    /// over.
    async fn take_node(
        &self,
        mut registration: watch::Receiver<kubelet::RegistrationState>,
    ) -> Result<NodeLock, Error> {
        if let Some(lock) = self.node_dir.try_lock().map_err(Error::Handover)? {
            return Ok(lock);
        }
        let _ = self.ready_tx.send(Err(
            "another plugin instance serves the node; taking it over".to_string(),
        ));
        info!(
            "another plugin instance serves the node: waiting for the kubelet to register this one, then taking the node over"
        );
        // An instance the kubelet refuses never takes the node from one it serves.
        let _ = registration.wait_for(|r| r.is_registered()).await;
        info!("the kubelet registered this instance: asking the running one to hand over");
        self.node_dir
            .take(&self.instance)
            .await
            .map_err(Error::Handover)
    }
}

/// The next handover request; an accept error (out of descriptors) is logged and
/// retried rather than ending the plugin, which serves on regardless.
async fn next_request(handover: &HandoverListener) -> Request {
    loop {
        match handover.next().await {
            Ok(r) => return r,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "handover socket failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

/// The background runtime, shut down without waiting when dropped. Dropping a runtime
/// waits for its tasks, which panics inside the async [`run`]: an early `?` return (no
/// API server, no driver) would end start-up with that panic instead of its error.
struct Background {
    handle: tokio::runtime::Handle,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::ops::Deref for Background {
    type Target = tokio::runtime::Handle;

    fn deref(&self) -> &Self::Target {
        &self.handle
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn background_runtime() -> Result<Background, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("tessera-background")
        // On Linux the niceness is per thread: these threads, and only these, give way
        // when a kubelet call wants the CPU.
        .on_thread_start(|| {
            if let Err(e) = rustix::process::nice(BACKGROUND_NICENESS) {
                tracing::debug!(error = %e, "could not lower the background thread's priority");
            }
        })
        .enable_all()
        .build()
        .map(|rt| Background {
            handle: rt.handle().clone(),
            runtime: Some(rt),
        })
        .map_err(Error::Runtime)
}

fn backend(args: &Args) -> Result<Arc<dyn GpuBackend>, Error> {
    Ok(match args.backend {
        BackendKind::Sim => {
            let inventory = args.sim_inventory.as_deref().ok_or(Error::NoSimInventory)?;
            let state = args
                .sim_state
                .clone()
                .unwrap_or_else(|| args.state_dir.join("sim-hardware.json"));
            // The simulator publishes its MIG capability files where the plugin reads the
            // driver's, so the CDI path is the production one.
            Arc::new(
                SimBackend::open_with_caps(inventory, Some(&state), Some(&args.nvidia_caps_root))
                    .map_err(|source| Error::Backend {
                    backend: "simulated",
                    source,
                })?,
            )
        }
        BackendKind::Nvml => Arc::new(
            NvmlBackend::with_driver_root(DriverRoot::new(&args.nvidia_driver_root)).map_err(
                |source| Error::Backend {
                    backend: "NVML",
                    source,
                },
            )?,
        ),
    })
}
