//! Wiring the operator together: what `tessera-operator` runs until it is told to stop.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::{Notify, watch};
use tracing::info;

use crate::{
    config::Args,
    leadership::{self, Leadership},
    metrics::Metrics,
    runtime::{self, Caches, Operator},
};

/// Why the operator could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API client could not be made.
    #[error(transparent)]
    Client(#[from] tessera_kit::client::Error),
    /// The metrics address could not be bound.
    #[error("binding the metrics address {addr}")]
    Metrics {
        /// `--metrics-address`.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The Lease could not be set up.
    #[error("setting up leader election on Lease {namespace}/{name}")]
    Lease {
        /// `--leader-election-namespace`.
        namespace: String,
        /// `--leader-election-lease`.
        name: String,
        /// Why.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The reconcile loop stopped.
    #[error(transparent)]
    Loop(#[from] runtime::Error),
}

/// Runs the operator until `shutdown` resolves.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    info!(
        version = env!("CARGO_PKG_VERSION"),
        leader_elect = args.leader_elect,
        "starting tessera-operator"
    );
    let client = tessera_kit::client::client(args.kubeconfig.clone()).await?;
    let metrics = Arc::new(Metrics::new());
    let (ready_tx, ready_rx) = watch::channel(Err("watch caches not filled yet".to_string()));
    let addr = tessera_kit::http::serve(args.metrics_address, metrics.clone(), ready_rx)
        .await
        .map_err(|source| Error::Metrics {
            addr: args.metrics_address,
            source,
        })?;
    info!(%addr, "serving /metrics, /healthz, /readyz");

    // Every replica keeps its caches warm, so a new leader starts from a full view.
    let changed = Arc::new(Notify::new());
    let caches = Caches::start(&client, changed.clone());
    let identity = args
        .leader_election_identity
        .clone()
        .unwrap_or_else(default_identity);
    // Held while the loop runs; the Lease watch stops when they are dropped.
    let (leadership, _lease_tasks) = if args.leader_elect {
        let lease_error = |source| Error::Lease {
            namespace: args.leader_election_namespace.clone(),
            name: args.leader_election_lease.clone(),
            source,
        };
        let duration = args.leader_election_lease_seconds.max(2);
        let manager = LeaseManagerBuilder::new(client.clone(), &args.leader_election_lease)
            .with_namespace(&args.leader_election_namespace)
            .with_identity(&identity)
            .with_duration(duration)
            // Renewed with a third of the lease left, so one slow renewal does not lose it.
            .with_grace(duration / 3)
            .with_field_manager(tessera_api::constants::OPERATOR_FIELD_MANAGER)
            .build()
            .await
            .map_err(lease_error)?;
        info!(%identity, lease = %args.leader_election_lease, namespace = %args.leader_election_namespace, "leader election on");
        let (rx, task) = manager.watch().await;
        let (lease, lease_watch) = leadership::watch_lease(
            &client,
            &args.leader_election_namespace,
            &args.leader_election_lease,
            changed.clone(),
        );
        let leadership = Leadership::elected(
            rx,
            lease,
            &args.leader_election_namespace,
            &args.leader_election_lease,
            &identity,
            // Renewed with a third of the lease left; writes stop with a sixth left
            // unrenewed, before any other replica may take the Lease.
            Duration::from_secs(duration) / 6,
        );
        (leadership, Some((task, lease_watch)))
    } else {
        (Leadership::always(), None)
    };
    Operator::new(client, caches, metrics, &identity)
        .with_demand_dwell(std::time::Duration::from_secs(args.demand_dwell_seconds))
        .with_batch_window(std::time::Duration::from_secs(
            args.adaptive_batch_window_seconds,
        ))
        .with_leadership(leadership)
        .run(changed, ready_tx, shutdown)
        .await?;
    info!("stopped");
    Ok(())
}

/// `<hostname>-<pid>`: unique among replicas on one machine and across machines.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "tessera-operator".to_string());
    format!("{host}-{}", std::process::id())
}
