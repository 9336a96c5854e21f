//! The small HTTP endpoint of a Tessera binary: `/metrics` (Prometheus text), `/healthz`
//! (the process runs) and `/readyz` (what "ready" means is the binary's: it sends the
//! verdict on a watch channel).

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode, body::Incoming, server::conn::http1, service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::watch};
use tracing::{debug, warn};

/// Whether the process is ready, and why not.
pub type Readiness = watch::Receiver<Result<(), String>>;

/// Renders the metrics in the Prometheus text format.
pub trait Render: Send + Sync + 'static {
    /// The text exposition.
    fn render(&self) -> String;
}

/// Binds `addr` and serves until the process ends. Returns the bound address (port 0
/// picks a free one).
pub async fn serve<M: Render>(
    addr: SocketAddr,
    metrics: Arc<M>,
    ready: Readiness,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "metrics endpoint: accept failed");
                    continue;
                }
            };
            let metrics = metrics.clone();
            let ready = ready.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, metrics.clone(), ready.clone()));
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await
                {
                    debug!(error = %e, "metrics endpoint: connection ended");
                }
            });
        }
    });
    Ok(local)
}

async fn handle<M: Render>(
    req: Request<Incoming>,
    metrics: Arc<M>,
    ready: Readiness,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match req.uri().path() {
        "/metrics" => (StatusCode::OK, metrics.render()),
        "/healthz" => (StatusCode::OK, "ok".to_string()),
        "/readyz" => match &*ready.borrow() {
            Ok(()) => (StatusCode::OK, "ok".to_string()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.clone()),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz".to_string(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    Ok(resp)
}
