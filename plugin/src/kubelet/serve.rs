//! Runs the two kubelet-facing gRPC servers on their sockets.
//!
//! Order as in the Go library's `Start` (dra.md §2.2): the DRA socket (DRA node service
//! and health stream) listens first, then the registration socket, so the kubelet never
//! learns of an endpoint that is not listening. On shutdown both sockets are removed.
//!
//! **Re-registration.** Some kubelet setups wipe `plugins_registry/` when they restart,
//! deleting our registration socket; a plugin that does not notice is never registered
//! again (kubernetes/kubernetes#64638). We stat the socket path every
//! `reregister_poll`; once it is gone the registration server stops, binds a new socket at
//! the same path (re-creating the directory) and resets the registration state to
//! [`RegistrationState::Pending`] until the kubelet's next `NotifyRegistrationStatus`.
//! The DRA socket is left alone: the kubelet dials it afresh after `GetInfo`. If the
//! socket cannot be re-created, [`KubeletServer::serve_until`] returns the error so the
//! plugin exits and its DaemonSet restarts it, rather than running unregistered.

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use futures::TryStreamExt;
use tokio::{net::UnixListener, sync::watch, task::JoinSet};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use super::{
    authority::AuthorityFix,
    config::KubeletServerConfig,
    dra::DraNodeServer,
    driver::DraDriver,
    health::{DeviceHealthEntry, HealthServer},
    registration::{RegistrationServer, RegistrationState},
    sockets::{self, SocketError, SocketIdentity},
};

/// Errors of the kubelet-facing servers.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A socket could not be set up.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// A gRPC server failed.
    #[error("the {server} gRPC server failed")]
    Serve {
        /// "DRA" or "registration".
        server: &'static str,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// A gRPC server ended although no shutdown was requested.
    #[error("the {server} gRPC server stopped unexpectedly")]
    Stopped {
        /// "DRA" or "registration".
        server: &'static str,
    },
    /// A server task panicked.
    #[error("a kubelet-facing gRPC server task panicked")]
    Task {
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// Both servers, listening. Drive them with [`KubeletServer::serve_until`]; dropping the
/// value aborts the servers and leaves the socket files (the next start removes them).
pub struct KubeletServer {
    /// Each task yields its server's name with its outcome.
    tasks: JoinSet<(&'static str, Result<(), ServeError>)>,
    stop: watch::Sender<bool>,
    registration: watch::Receiver<RegistrationState>,
    dra_socket: PathBuf,
    registration_socket: PathBuf,
    /// The socket files we bound (the registration one changes when it is re-created),
    /// so that stopping removes ours only.
    dra_identity: Option<SocketIdentity>,
    registration_identity: Arc<std::sync::Mutex<Option<SocketIdentity>>>,
}

/// Binds both sockets and starts serving; returns once both are listening, so callers
/// (and tests) can connect right away.
pub async fn start<D: DraDriver>(
    cfg: KubeletServerConfig,
    driver: Arc<D>,
    health: watch::Receiver<Vec<DeviceHealthEntry>>,
) -> Result<KubeletServer, ServeError> {
    let dra_socket = cfg.dra_socket();
    let registration_socket = cfg.registration_socket();
    // Check both paths before binding anything, so a bad registry dir leaves no DRA socket.
    sockets::check_path(&dra_socket)?;
    sockets::check_path(&registration_socket)?;

    let (stop, _) = watch::channel(false);
    let mut tasks = JoinSet::new();

    let dra_listener = sockets::bind(&dra_socket)?;
    let dra_identity = SocketIdentity::of(&dra_socket);
    let dra = DraNodeServer::new(driver);
    let health = cfg
        .serve_health
        .then(|| HealthServer::new(health, stop.subscribe()));
    let router = Server::builder()
        .add_service(dra.v1())
        .add_service(dra.v1beta1())
        .add_optional_service(health.as_ref().map(HealthServer::v1alpha1))
        .add_optional_service(health.as_ref().map(HealthServer::v1));
    let stopped = stopped(stop.subscribe());
    tasks.spawn(async move {
        let result = router
            .serve_with_incoming_shutdown(UnixListenerStream::new(dra_listener), stopped)
            .await
            .map_err(|source| ServeError::Serve {
                server: "DRA",
                source,
            });
        ("DRA", result)
    });
    tracing::info!(path = %dra_socket.display(), "DRA service listening");

    let registrar = RegistrationServer::new(&cfg.driver_name, dra_socket.clone(), cfg.serve_health);
    let registration = registrar.state();
    let reg_listener = match sockets::bind(&registration_socket) {
        Ok(listener) => listener,
        Err(e) => {
            // Dropping `tasks` aborts the DRA server; its socket must not outlive it.
            drop(tasks);
            sockets::remove_own(&dra_socket, dra_identity);
            return Err(e.into());
        }
    };
    let registration_identity = Arc::new(std::sync::Mutex::new(SocketIdentity::of(
        &registration_socket,
    )));
    let reg_task = run_registration(
        registration_socket.clone(),
        registrar,
        reg_listener,
        stop.subscribe(),
        cfg.reregister_poll,
        registration_identity.clone(),
    );
    tasks.spawn(async move { ("registration", reg_task.await) });
    tracing::info!(path = %registration_socket.display(), "registration service listening");

    Ok(KubeletServer {
        tasks,
        stop,
        registration,
        dra_socket,
        registration_socket,
        dra_identity,
        registration_identity,
    })
}

/// [`start`], then [`KubeletServer::serve_until`] `shutdown`.
pub async fn serve<D: DraDriver>(
    cfg: KubeletServerConfig,
    driver: Arc<D>,
    health: watch::Receiver<Vec<DeviceHealthEntry>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    start(cfg, driver, health)
        .await?
        .serve_until(shutdown)
        .await
}

impl KubeletServer {
    /// Follows the kubelet's registration verdicts, for the plugin's readiness.
    pub fn registration_state(&self) -> watch::Receiver<RegistrationState> {
        self.registration.clone()
    }

    /// Path of the DRA socket (also the endpoint announced to the kubelet).
    pub fn dra_socket(&self) -> &std::path::Path {
        &self.dra_socket
    }

    /// Path of the registration socket.
    pub fn registration_socket(&self) -> &std::path::Path {
        &self.registration_socket
    }

    /// Serves until `shutdown` completes or a server fails, then stops both servers
    /// (ending open health streams), waits for them and removes both sockets.
    pub async fn serve_until(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let mut result = tokio::select! {
            () = shutdown => Ok(()),
            Some(joined) = self.tasks.join_next() => match flatten(joined) {
                // Servers only end on request; nobody has asked yet.
                Ok(server) => Err(ServeError::Stopped { server }),
                Err(e) => Err(e),
            },
        };
        self.stop.send_replace(true);
        while let Some(joined) = self.tasks.join_next().await {
            // Keep the first error; later ones are usually consequences of it.
            if let (Ok(()), Err(e)) = (&result, flatten(joined)) {
                result = Err(e);
            }
        }
        let registration_identity = *self
            .registration_identity
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        sockets::remove_own(&self.registration_socket, registration_identity);
        sockets::remove_own(&self.dra_socket, self.dra_identity);
        tracing::info!("kubelet-facing servers stopped, sockets removed");
        result
    }
}

/// A finished server task as the name of the server that ended cleanly, or its error.
fn flatten(
    joined: Result<(&'static str, Result<(), ServeError>), tokio::task::JoinError>,
) -> Result<&'static str, ServeError> {
    // A JoinError only arises from a panic (we never abort while joining); which
    // server panicked is in the panic message.
    let (server, result) = joined.map_err(|source| ServeError::Task { source })?;
    result.map(|()| server)
}

/// Completes when `stop` turns true or its sender is dropped.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Completes once nothing exists at `path` any more.
async fn removed(path: PathBuf, poll: Duration) {
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if sockets::is_gone(&path) {
            return;
        }
    }
}

/// Serves registration on `listener`, re-binding whenever the socket file disappears.
async fn run_registration(
    path: PathBuf,
    registrar: RegistrationServer,
    mut listener: UnixListener,
    stop: watch::Receiver<bool>,
    poll: Duration,
    identity: Arc<std::sync::Mutex<Option<SocketIdentity>>>,
) -> Result<(), ServeError> {
    loop {
        let done = {
            let stop = stop.clone();
            let path = path.clone();
            async move {
                tokio::select! {
                    () = stopped(stop) => {}
                    () = removed(path, poll) => {}
                }
            }
        };
        // The kubelet's registration client sends an `:authority` h2 refuses; see
        // `authority.rs` for why each connection goes through the rewriter.
        let incoming = UnixListenerStream::new(listener).map_ok(AuthorityFix::new);
        Server::builder()
            .add_service(registrar.service())
            .serve_with_incoming_shutdown(incoming, done)
            .await
            .map_err(|source| ServeError::Serve {
                server: "registration",
                source,
            })?;
        if *stop.borrow() || stop.has_changed().is_err() {
            return Ok(());
        }
        tracing::warn!(
            path = %path.display(),
            "registration socket disappeared (kubelet restart?); re-creating it"
        );
        listener = sockets::bind(&path)?;
        *identity.lock().unwrap_or_else(|p| p.into_inner()) = SocketIdentity::of(&path);
        registrar.reset();
    }
}
