//! Sockets in another network namespace, opened from this process: a socket belongs to
//! the namespace of the thread that created it, for its whole life, so a short-lived
//! thread that has entered a node's namespace (`setns`) opens it and hands it back, and
//! the rest of this process (tokio included) uses it as any other. That is how the test
//! bed connects a containerd node's network (its own namespace, like a machine of its
//! own) to the control plane on this machine's loopback without touching the host's
//! network: no interface, route, address or firewall rule is added outside the node.
//!
//! - [`NetNs::connect`]: a connection made from inside the namespace (the API server's
//!   egress proxy reaching a kubelet or a pod, [`crate::egress`]).
//! - [`NetNs::bind`]: a listener inside the namespace.
//! - [`forward`]: every connection a listener accepts, relayed to a target (the node's
//!   `kubernetes` Service address relayed to the API server).
//!
//! The relays (and the API server's egress proxy) run on a runtime of their own
//! ([`plumbing`]), like the separate processes they stand for: a test that blocks its own
//! runtime (waiting on `kubectl`, say, which waits on the API server, which waits on the
//! egress proxy) would otherwise stall the very connections it waits for.

use std::{
    fs::File,
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
    time::Duration,
};

use nix::sched::{CloneFlags, setns};
use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// How long a connection inside a node may take to open: everything there is local.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The runtime the test bed's network plumbing runs on, apart from any test's.
pub fn plumbing() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tessera-test-bed-net")
            .enable_all()
            .build()
            // Without it no node can reach the API server; nothing to fall back to.
            .unwrap_or_else(|e| panic!("cannot start the test bed's network runtime: {e}"))
    })
}

/// A network namespace, held open by a file descriptor (so it stays the same namespace
/// even if the process it was taken from exits).
#[derive(Clone, Debug)]
pub struct NetNs {
    file: Arc<File>,
    path: PathBuf,
}

impl NetNs {
    /// The network namespace of process `pid`.
    pub fn of_process(pid: u32) -> io::Result<Self> {
        let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
        let file = File::open(&path)?;
        Ok(Self {
            file: Arc::new(file),
            path,
        })
    }

    /// Where it was opened (`/proc/<pid>/ns/net`), for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a thread of its own inside the namespace.
    async fn inside<T, F>(&self, f: F) -> io::Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> io::Result<T> + Send + 'static,
    {
        let file = Arc::clone(&self.file);
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let result = setns(&*file, CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)
                .and_then(|()| f());
            let _ = tx.send(result);
        });
        rx.await
            .map_err(|_| io::Error::other("the namespace's thread ended without an answer"))?
    }

    /// A TCP connection to `addr`, made from inside the namespace.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let stream = self
            .inside(move || {
                let s = std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .await?;
        TcpStream::from_std(stream)
    }

    /// A TCP listener on `addr` inside the namespace, for [`forward`].
    pub async fn bind(&self, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
        self.inside(move || {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .await
    }
}

/// Where [`forward`] relays a connection to.
#[derive(Clone, Debug)]
pub enum Target {
    /// An address as this process reaches it.
    Here(SocketAddr),
    /// An address inside a namespace.
    Inside(NetNs, SocketAddr),
}

impl Target {
    /// Opens a connection to the target.
    pub async fn connect(&self) -> io::Result<TcpStream> {
        match self {
            Target::Here(addr) => TcpStream::connect(addr).await,
            Target::Inside(ns, addr) => ns.connect(*addr).await,
        }
    }
}

/// Relays every connection `listener` accepts to `target`, on the [`plumbing`] runtime,
/// until the returned task is aborted. A connection the target refuses is closed at once,
/// as the target would.
pub fn forward(listener: std::net::TcpListener, target: Target) -> JoinHandle<()> {
    plumbing().spawn(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, ?target, "cannot relay");
                return;
            }
        };
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            let target = target.clone();
            tokio::spawn(async move {
                match target.connect().await {
                    Ok(mut outbound) => {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, ?target, "forwarded connection refused");
                    }
                }
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A namespace of its own (`unshare --net`, root needed): a listener bound inside is
    /// not reachable from here, and a connection made inside reaches it.
    #[tokio::test]
    async fn sockets_opened_inside_live_in_the_namespace() {
        use std::io::BufRead;
        let mut holder = std::process::Command::new("unshare")
            .args([
                "--net",
                "--",
                "sh",
                "-c",
                "ip link set lo up && echo up && exec sleep 60",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A bind succeeds while lo is still down (127.0.0.1 is on it either way), a
        // connect does not: wait for the holder to say lo is up.
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "up");
        let ns = NetNs::of_process(holder.id()).unwrap();
        let addr: SocketAddr = "127.0.0.1:47123".parse().unwrap();
        let listener = ns.bind(addr).await.unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"inside").await.unwrap();
        });
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the namespace's listener answered from the host's loopback"
        );
        let mut s = ns.connect(addr).await.unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "inside");
        server.await.unwrap();
        let _ = holder.kill();
        let _ = holder.wait();
    }
}
