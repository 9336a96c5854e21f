//! The API server's way to the test bed's containerd nodes: an HTTP `CONNECT` proxy on a
//! unix socket, named in the API server's egress selector (`--egress-selector-config-file`,
//! the mechanism clusters whose control plane cannot route to its nodes use with the
//! Konnectivity proxy). Everything the API server opens towards the cluster (a kubelet
//! for `kubectl logs` and `exec`, a pod through the API server's proxy) asks this proxy
//! for a TCP connection; it opens it inside the node whose addresses contain the target
//! ([`Routes`], [`crate::netns`]), or from this process for any other address.
//!
//! So each node keeps its network to itself (its own namespace), and the host's network
//! is never changed.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UnixListener, UnixStream},
    task::JoinHandle,
};

use crate::netns::NetNs;

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 8 * 1024;

/// An IPv4 network, `addr/len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// The network's first address.
    pub addr: Ipv4Addr,
    /// Prefix length.
    pub len: u8,
}

impl Cidr {
    /// `addr/len`.
    pub fn new(addr: Ipv4Addr, len: u8) -> Self {
        Self { addr, len }
    }

    /// Whether `ip` is in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let IpAddr::V4(ip) = ip else { return false };
        let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Which node's namespace each address range is in.
#[derive(Clone, Debug, Default)]
pub struct Routes {
    inner: Arc<Mutex<Vec<(Cidr, NetNs)>>>,
}

impl Routes {
    /// Sends connections to addresses in `cidr` into `ns`.
    pub fn add(&self, cidr: Cidr, ns: NetNs) {
        if let Ok(mut r) = self.inner.lock() {
            r.retain(|(c, _)| *c != cidr);
            r.push((cidr, ns));
        }
    }

    /// Forgets `cidr`.
    pub fn remove(&self, cidr: Cidr) {
        if let Ok(mut r) = self.inner.lock() {
            r.retain(|(c, _)| *c != cidr);
        }
    }

    /// The namespace `ip` is in; `None`: this process's own.
    pub fn lookup(&self, ip: IpAddr) -> Option<NetNs> {
        self.inner
            .lock()
            .ok()?
            .iter()
            .find(|(c, _)| c.contains(ip))
            .map(|(_, ns)| ns.clone())
    }

    /// The ranges in use.
    pub fn cidrs(&self) -> Vec<Cidr> {
        self.inner
            .lock()
            .map(|r| r.iter().map(|(c, _)| *c).collect())
            .unwrap_or_default()
    }

    async fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        match self.lookup(addr.ip()) {
            Some(ns) => ns.connect(addr).await,
            None => TcpStream::connect(addr).await,
        }
    }
}

/// The running proxy; dropping it stops it.
pub struct EgressProxy {
    socket: PathBuf,
    routes: Routes,
    task: JoinHandle<()>,
}

impl EgressProxy {
    /// Serves the proxy on the unix socket `socket` (replaced if it exists), on the test
    /// bed's network runtime ([`crate::netns::plumbing`]).
    pub fn start(socket: &Path) -> io::Result<Self> {
        let _ = std::fs::remove_file(socket);
        let listener = std::os::unix::net::UnixListener::bind(socket)?;
        listener.set_nonblocking(true)?;
        let routes = Routes::default();
        let serving = routes.clone();
        let task = crate::netns::plumbing().spawn(async move {
            let listener = match UnixListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "cannot serve the egress proxy");
                    return;
                }
            };
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let routes = serving.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(conn, &routes).await {
                        tracing::debug!(error = %e, "egress connection failed");
                    }
                });
            }
        });
        Ok(Self {
            socket: socket.to_path_buf(),
            routes,
            task,
        })
    }

    /// The proxy's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The routes to the nodes.
    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    /// The API server's `EgressSelectorConfiguration`: cluster traffic through this proxy.
    pub fn selector_config(&self) -> String {
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        udsName: {}\n",
            self.socket.display()
        )
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The target of a `CONNECT host:port HTTP/1.1` request head; `None` for anything else.
pub fn connect_target(head: &str) -> Option<SocketAddr> {
    let line = head.lines().next()?;
    let mut parts = line.split_whitespace();
    if parts.next()? != "CONNECT" {
        return None;
    }
    let target = parts.next()?;
    parts.next()?.starts_with("HTTP/1.").then_some(())?;
    target.parse().ok()
}

async fn serve(mut conn: UnixStream, routes: &Routes) -> io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let end = loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if head.len() > MAX_HEAD {
            conn.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n")
                .await?;
            return Ok(());
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let Some(target) = connect_target(&text) else {
        conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await?;
        return Ok(());
    };
    let mut upstream = match routes.connect(target).await {
        Ok(s) => s,
        Err(e) => {
            let body = format!("cannot reach {target}: {e}");
            conn.write_all(
                format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await?;
            return Ok(());
        }
    };
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    // Bytes the client sent after the head belong to the tunnel.
    upstream.write_all(&head[end..]).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_holds_exactly_its_addresses() {
        let c = Cidr::new(Ipv4Addr::new(10, 244, 3, 0), 24);
        assert!(c.contains("10.244.3.17".parse().unwrap()));
        assert!(!c.contains("10.244.4.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let host = Cidr::new(Ipv4Addr::new(10, 201, 0, 3), 32);
        assert!(host.contains("10.201.0.3".parse().unwrap()));
        assert!(!host.contains("10.201.0.4".parse().unwrap()));
        assert!(Cidr::new(Ipv4Addr::UNSPECIFIED, 0).contains("1.2.3.4".parse().unwrap()));
    }

    #[test]
    fn only_a_connect_to_an_address_is_a_target() {
        assert_eq!(
            connect_target("CONNECT 10.201.0.2:10250 HTTP/1.1\r\nHost: 10.201.0.2:10250\r\n\r\n"),
            Some("10.201.0.2:10250".parse().unwrap())
        );
        assert_eq!(connect_target("GET / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(
            connect_target("CONNECT node-a:10250 HTTP/1.1\r\n\r\n"),
            None
        );
        assert_eq!(connect_target("CONNECT 10.0.0.1:443\r\n\r\n"), None);
    }

    #[tokio::test]
    async fn a_tunnel_carries_bytes_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let proxy = EgressProxy::start(&dir.path().join("egress.sock")).unwrap();
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
        });
        let mut c = UnixStream::connect(proxy.socket()).await.unwrap();
        c.write_all(format!("CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n\r\nhello").as_bytes())
            .await
            .unwrap();
        let mut got = vec![0u8; 39 + 5];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            "HTTP/1.1 200 Connection established\r\n\r\nhello"
        );
    }
}
