//! The small HTTP endpoint of a Tessera binary: `/metrics` (OpenMetrics or Prometheus
//! text, as the scraper asks: [`crate::exposition`]), `/healthz` (the process runs) and
//! `/readyz` (what "ready" means is the binary's: it sends the verdict on a watch
//! channel). Every answer says its `Content-Type`: Prometheus 3 refuses a scrape without.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::Incoming,
    header::{ACCEPT, CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::watch};
use tracing::{debug, warn};

use crate::exposition::Format;

/// `Content-Type` of the health answers and errors.
const PLAIN: &str = "text/plain; charset=utf-8";

/// Whether the process is ready, and why not.
pub type Readiness = watch::Receiver<Result<(), String>>;

/// Renders the metrics.
pub trait Render: Send + Sync + 'static {
    /// The OpenMetrics text exposition (what `prometheus-client` encodes).
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
                    warn!(error = %crate::error_chain(&e), "metrics endpoint: accept failed");
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
                    debug!(error = %crate::error_chain(&e), "metrics endpoint: connection ended");
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
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    Ok(answer(req.uri().path(), accept, &*metrics, &ready))
}

/// The answer to a GET of `path`.
fn answer<M: Render>(
    path: &str,
    accept: Option<&str>,
    metrics: &M,
    ready: &Readiness,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => {
            let format = Format::negotiate(accept);
            (
                StatusCode::OK,
                format.content_type(),
                format.render(&metrics.render()),
            )
        }
        "/healthz" => (StatusCode::OK, PLAIN, "ok".to_string()),
        "/readyz" => match &*ready.borrow() {
            Ok(()) => (StatusCode::OK, PLAIN, "ok".to_string()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, PLAIN, why.clone()),
        },
        _ => (
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /metrics, /healthz or /readyz".to_string(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl Render for Fixed {
        fn render(&self) -> String {
            "# HELP t_runs Runs.\n# TYPE t_runs counter\nt_runs_total 1\n# EOF\n".into()
        }
    }

    fn get(path: &str, accept: Option<&str>, ready: Result<(), String>) -> (u16, String, String) {
        let (_tx, rx) = watch::channel(ready);
        let resp = answer(path, accept, &Fixed, &rx);
        let content_type = resp.headers()[CONTENT_TYPE].to_str().unwrap().to_string();
        let status = resp.status().as_u16();
        let body = body_text(resp);
        (status, content_type, body)
    }

    fn body_text(resp: Response<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let bytes = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(resp.into_body().collect())
            .unwrap()
            .to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn metrics_say_the_format_prometheus_asked_for() {
        let (status, ct, body) = get(
            "/metrics",
            Some("application/openmetrics-text;version=1.0.0;q=0.6,*/*;q=0.2"),
            Ok(()),
        );
        assert_eq!(status, 200);
        assert_eq!(
            ct,
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    #[test]
    fn metrics_without_accept_are_prometheus_text_0_0_4() {
        let (status, ct, body) = get("/metrics", None, Ok(()));
        assert_eq!(status, 200);
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
        assert_eq!(
            body,
            "# HELP t_runs_total Runs.\n# TYPE t_runs_total counter\nt_runs_total 1\n"
        );
    }

    #[test]
    fn health_readiness_and_errors_are_plain_text() {
        for (path, ready, status) in [
            ("/healthz", Ok(()), 200),
            ("/readyz", Ok(()), 200),
            ("/readyz", Err("not registered".to_string()), 503),
            ("/nope", Ok(()), 404),
        ] {
            let (got, ct, body) = get(path, None, ready.clone());
            assert_eq!(got, status, "{path}");
            assert_eq!(ct, "text/plain; charset=utf-8", "{path}");
            if let Err(why) = ready {
                assert_eq!(body, why);
            }
        }
    }

    #[tokio::test]
    async fn the_served_endpoint_sends_the_headers() {
        let (_tx, rx) = watch::channel(Ok(()));
        let addr = serve("127.0.0.1:0".parse().unwrap(), Arc::new(Fixed), rx)
            .await
            .unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nAccept: application/openmetrics-text\r\n\r\n")
            .await
            .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let head = raw.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(
            head.contains(
                "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"
            ),
            "{raw}"
        );
    }
}
