//! `tessera-plugin`: wiring only; the logic lives in the library.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::{core::v1::Node, resource::v1::ResourceClaim};
use kube::{
    Api, Client, Config,
    config::KubeConfigOptions,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tessera_gpu::backend::{GpuBackend, nvml::NvmlBackend, sim::SimBackend};
use tessera_plugin::{
    cdi::CdiWriter,
    checkpoint::{self, CheckpointStore},
    config::{Args, BackendKind, LogFormat},
    driver::{Driver, DriverConfig, DriverHandle, NodeGpus},
    health_store::HealthStore,
    http, kubelet,
    metrics::Metrics,
    node::NodeLoop,
    ratelimit::RateLimiter,
};
use tokio::sync::watch;
use tracing::info;

/// How much lower the background threads' CPU priority is than the kubelet-facing ones'.
const BACKGROUND_NICENESS: i32 = 10;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(args.log_format);
    info!(version = env!("CARGO_PKG_VERSION"), node = %args.node_name, backend = ?args.backend, "starting tessera-plugin");

    // The kubelet's calls are served on this runtime; everything else (watches, slices,
    // status writes) runs on a runtime of its own with its own API client, so a burst of
    // bookkeeping never delays a prepare. (A kube client's connection tasks live on the
    // runtime that made it, hence one client per runtime.)
    let background = tokio::runtime::Builder::new_multi_thread()
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
        .context("starting the background runtime")?;
    let client = {
        let args = args.clone();
        background
            .spawn(async move { client(&args).await })
            .await??
    };
    let backend: Arc<dyn GpuBackend> = match args.backend {
        BackendKind::Sim => {
            let inventory = args.sim_inventory.as_deref().context("--sim-inventory is required with --backend sim")?;
            let state = args.sim_state.clone().unwrap_or_else(|| args.state_dir.join("sim-hardware.json"));
            // The simulator publishes its MIG capability files where the plugin reads the
            // driver's, so the CDI path is the production one.
            Arc::new(
                SimBackend::open_with_caps(inventory, Some(&state), Some(&args.nvidia_caps_root))
                    .context("starting the simulated GPU backend")?,
            )
        }
        BackendKind::Nvml => Arc::new(NvmlBackend::new().context(
            "loading NVML (libnvidia-ml.so.1): is the NVIDIA driver installed and mounted into this container?",
        )?),
    };
    let hw = {
        let b = backend.clone();
        tokio::task::spawn_blocking(move || NodeGpus::read(b.as_ref())).await??
    };
    info!(
        gpus = hw.gpus.len(),
        mig_capable = hw.layouts.len(),
        "found GPUs"
    );

    let node: Node = Api::all(client.clone())
        .get(&args.node_name)
        .await
        .with_context(|| format!("reading Node {} (is --node-name right?)", args.node_name))?;
    let node_uid = node.metadata.uid.unwrap_or_default();

    let metrics = Arc::new(Metrics::new());
    // Prepare reads claims from this watch cache instead of making an API round trip.
    let (claim_cache, claim_writer) = reflector::store();
    let claims_api: Api<ResourceClaim> = Api::all(client.clone());
    background.spawn(
        reflector(
            claim_writer,
            watcher(claims_api, watcher::Config::default()),
        )
        .default_backoff()
        .for_each(|_| std::future::ready(())),
    );
    let driver = Driver::new(DriverConfig {
        client: client.clone(),
        node: args.node_name.clone(),
        driver_name: args.driver_name.clone(),
        backend: backend.clone(),
        hw,
        store: CheckpointStore::new(
            args.state_dir.join("claims"),
            checkpoint::read_boot_id(&args.boot_id_file),
        ),
        cdi: CdiWriter::new(&args.cdi_dir, &args.driver_name),
        mps_root: args.state_dir.join("mps"),
        caps_root: args.nvidia_caps_root.clone(),
        metrics: metrics.clone(),
        claim_cache: Some(claim_cache),
        background: background.handle().clone(),
        status_rate: RateLimiter::new(args.claim_status_qps, args.claim_status_burst),
    })?;
    let report = driver
        .recover()
        .await
        .context("reconciling the checkpoint with the hardware")?;
    info!(?report, "start-up recovery done");

    let (ready_tx, ready_rx) = watch::channel(Err("starting".to_string()));
    let addr = http::serve(args.metrics_address, metrics.clone(), ready_rx)
        .await
        .with_context(|| format!("binding the metrics address {}", args.metrics_address))?;
    info!(%addr, "serving /metrics, /healthz, /readyz");

    let (health_tx, health_rx) = watch::channel(Vec::new());
    let kcfg = args.kubelet.clone().into_config(args.driver_name.clone());
    let server = kubelet::start(kcfg, Arc::new(DriverHandle(driver.clone())), health_rx).await?;
    info!(dra = %server.dra_socket().display(), registration = %server.registration_socket().display(), "kubelet sockets listening");

    let node_loop = NodeLoop::new(
        client.clone(),
        driver.clone(),
        &node_uid,
        args.default_strategy,
        HealthStore::new(
            args.state_dir.join("gpu-health.json"),
            checkpoint::read_boot_id(&args.boot_id_file),
        ),
        health_tx,
        ready_tx,
    );
    let registration = server.registration_state();
    let mut accepted = server.registration_state();
    let registrations = metrics.kubelet_registrations.clone();
    background.spawn(async move {
        // Every verdict is a send, also "registered" again after a kubelet restart.
        while accepted.changed().await.is_ok() {
            if accepted.borrow_and_update().is_registered() {
                registrations.inc();
            }
        }
    });
    let health_events = backend.health_events();
    let (stop_tx, stop_rx) = watch::channel(false);
    let wait_stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let loop_task = background.spawn(node_loop.run(
        client,
        registration,
        health_events,
        wait_stop(stop_rx.clone()),
    ));
    let serve_task = tokio::spawn(server.serve_until(wait_stop(stop_rx)));

    shutdown_signal().await;
    info!("shutting down: removing the kubelet sockets");
    let _ = stop_tx.send(true);
    serve_task.await??;
    loop_task.await?;
    background.shutdown_background();
    Ok(())
}

async fn client(args: &Args) -> anyhow::Result<Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => Config::incluster().context("no --kubeconfig and not running in a pod")?,
    };
    Ok(Client::try_from(config)?)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tessera_plugin=debug"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
