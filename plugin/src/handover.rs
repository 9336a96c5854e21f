//! Which plugin instance serves the node, and how a new one takes over from the running
//! one without a gap (a DaemonSet rolling with `maxSurge: 1`).
//!
//! The kubelet sends each call to the most recently registered plugin instance of a
//! driver that it can connect to (kubernetes `pkg/kubelet/cm/dra/plugin`, `get`), so
//! during a rolling update two instances may be asked to prepare and unprepare on one
//! node. Tessera's driver keeps the prepared claims, the layouts it holds and the GPUs'
//! state in memory between calls, so instead of two instances serving at once, one owns
//! the node at a time:
//!
//! - Ownership is an exclusive `flock` on `<plugin dir>/plugin.lock`. The kernel drops it
//!   when its process dies, so a crash never leaves the node owned by nobody.
//! - A new instance registers its own sockets with the kubelet first (calls it receives
//!   wait until it owns the node), and once the kubelet has accepted it, it asks the owner
//!   to hand over on `<plugin dir>/handover.sock`.
//! - The owner stops its node loop and its kubelet sockets (calls in flight finish, no
//!   new one comes: the kubelet routes to the newer instance), releases the lock and says
//!   `released`. The new instance takes the lock, says `taken`, reads the checkpoint and
//!   the hardware afresh and serves the calls that were waiting.
//! - The old instance then waits for the lock: it serves the node again only if the new
//!   one lets go without handing over (its pod deleted mid-roll, a rollback), so a node
//!   is never left with nobody serving it. Waiting for `taken` first keeps it from
//!   snatching the lock back in the instant between `released` and the new owner's lock.
//!
//! The protocol is one line at a time: `handover <instance>`, `released`, `taken`. A line
//! that never comes (the other side died) is an end of stream; the kernel has released
//! the dead side's lock by then.

use std::{
    fs::{File, OpenOptions, TryLockError},
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
};

use crate::kubelet::sockets::{self, SocketError, SocketIdentity};

/// The lock file's name in the driver's plugin directory.
pub const LOCK_FILE: &str = "plugin.lock";
/// The owner's handover socket's name in the driver's plugin directory.
pub const HANDOVER_SOCKET: &str = "handover.sock";
/// How long a requester waits for the owner to read its request line: an owner that
/// accepts and says nothing is stuck, and the requester asks again.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a released owner waits to hear that the new instance took the lock: it takes
/// it at once unless a third instance got in between, after which the old owner waits
/// for the lock as it would anyway.
pub const TAKEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a requester tries again while the owner has no handover socket yet (it is
/// still starting: the lock is taken before the socket is bound).
const RETRY: Duration = Duration::from_millis(200);

/// Errors taking or handing over the node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lock file could not be opened.
    #[error("opening the node lock {}", .path.display())]
    Open {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Locking failed for another reason than another holder.
    #[error("locking {}", .path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The thread waiting for the lock ended without an answer.
    #[error("the thread waiting for the node lock ended without taking it")]
    Wait,
    /// The handover socket could not be set up.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// Accepting a handover request failed.
    #[error("accepting on the handover socket {}", .path.display())]
    Accept {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The node's plugin directory (`<plugins dir>/<driver>`), where the lock and the
/// handover socket live.
#[derive(Clone, Debug)]
pub struct NodeDir(PathBuf);

/// Held while this instance owns the node; dropping it releases the node.
#[derive(Debug)]
pub struct NodeLock {
    _file: File,
}

/// What asking the owner to hand over came to.
#[derive(Debug)]
pub enum Asked {
    /// The owner released the node; it waits on the stream to hear that we took it.
    Released(UnixStream),
    /// The owner closed the connection without a reply: it died or stopped, and the
    /// kernel released its lock.
    Gone,
    /// Nobody listens on the handover socket (the owner is still starting, or just
    /// stopped).
    NoOwner,
}

impl NodeDir {
    /// The directory `dir`, created when missing.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self(dir.into())
    }

    fn lock_path(&self) -> PathBuf {
        self.0.join(LOCK_FILE)
    }

    fn socket_path(&self) -> PathBuf {
        self.0.join(HANDOVER_SOCKET)
    }

    fn open(&self) -> Result<File, Error> {
        let path = self.lock_path();
        if let Err(source) = std::fs::create_dir_all(&self.0) {
            return Err(Error::Open { path, source });
        }
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| Error::Open { path, source })
    }

    /// Takes the node if no other instance holds it.
    pub fn try_lock(&self) -> Result<Option<NodeLock>, Error> {
        let file = self.open()?;
        match file.try_lock() {
            Ok(()) => Ok(Some(NodeLock { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(source)) => Err(Error::Lock {
                path: self.lock_path(),
                source,
            }),
        }
    }

    /// Waits until the node is free and takes it (an instance that handed the node over
    /// waits here to serve again should the new owner die).
    pub async fn lock(&self) -> Result<NodeLock, Error> {
        let file = self.open()?;
        let path = self.lock_path();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A thread of its own, not the blocking pool: the runtime waits for the pool's
        // threads when it shuts down, and this one may wait for the lock forever.
        std::thread::Builder::new()
            .name("tessera-node-lock".into())
            .spawn(move || {
                let _ = tx.send(
                    file.lock()
                        .map(|()| NodeLock { _file: file })
                        .map_err(|source| Error::Lock { path, source }),
                );
            })
            .map_err(|source| Error::Lock {
                path: self.lock_path(),
                source,
            })?;
        rx.await.map_err(|_| Error::Wait)?
    }

    /// Asks the owner to hand the node over to `instance`; returns once it did, or once
    /// there is nobody to ask.
    pub async fn ask(&self, instance: &str) -> Asked {
        let path = self.socket_path();
        let Ok(mut stream) = UnixStream::connect(&path).await else {
            return Asked::NoOwner;
        };
        if stream
            .write_all(format!("handover {instance}\n").as_bytes())
            .await
            .is_err()
        {
            return Asked::Gone;
        }
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        match reader.read_line(&mut line).await {
            Ok(_) if line.trim() == "released" => Asked::Released(reader.into_inner()),
            _ => Asked::Gone,
        }
    }

    /// Takes the node: at once when it is free, otherwise by asking its owner to hand it
    /// over (and asking again until it is ours).
    pub async fn take(&self, instance: &str) -> Result<NodeLock, Error> {
        let mut said = false;
        let mut released_by: Option<UnixStream> = None;
        loop {
            if let Some(lock) = self.try_lock()? {
                if let Some(mut old) = released_by {
                    // It waits for this before it goes back to waiting for the lock.
                    let _ = old.write_all(b"taken\n").await;
                }
                return Ok(lock);
            }
            match self.ask(instance).await {
                Asked::Released(stream) => released_by = Some(stream),
                Asked::Gone => released_by = None,
                Asked::NoOwner => {
                    if !said {
                        tracing::info!(
                            "the instance holding the node is not taking handover requests yet (starting?); asking again"
                        );
                        said = true;
                    }
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    /// Listens for handover requests; call while holding the [`NodeLock`] (a socket left
    /// by an earlier owner is removed, which only the lock holder may do).
    pub fn listen(&self, _held: &NodeLock) -> Result<HandoverListener, Error> {
        let path = self.socket_path();
        let listener = sockets::bind(&path)?;
        let identity = SocketIdentity::of(&path);
        Ok(HandoverListener {
            listener,
            path,
            identity,
        })
    }
}

/// The owner's end of the handover socket; removes the socket when dropped.
pub struct HandoverListener {
    listener: UnixListener,
    path: PathBuf,
    identity: Option<SocketIdentity>,
}

/// A handover request, answered with [`Request::released`] once the node is free.
pub struct Request {
    stream: UnixStream,
    /// The instance asking.
    pub from: String,
}

impl HandoverListener {
    /// The next well-formed request; a connection that sends nothing sensible in time is
    /// dropped (the requester asks again).
    pub async fn next(&self) -> Result<Request, Error> {
        loop {
            let (stream, _) = self
                .listener
                .accept()
                .await
                .map_err(|source| Error::Accept {
                    path: self.path.clone(),
                    source,
                })?;
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            let read = tokio::time::timeout(REQUEST_READ_TIMEOUT, reader.read_line(&mut line));
            match read.await {
                Ok(Ok(_)) => match line.trim().strip_prefix("handover ") {
                    Some(from) if !from.is_empty() => {
                        return Ok(Request {
                            stream: reader.into_inner(),
                            from: from.to_string(),
                        });
                    }
                    _ => {
                        tracing::warn!(line = line.trim(), "ignoring a malformed handover request")
                    }
                },
                Ok(Err(e)) => {
                    tracing::debug!(error = %crate::error_chain(&e), "a handover request could not be read")
                }
                Err(_) => tracing::warn!("a handover requester sent nothing; dropping it"),
            }
        }
    }

    /// Where requests come in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HandoverListener {
    fn drop(&mut self) {
        sockets::remove_own(&self.path, self.identity);
    }
}

impl Request {
    /// Tells the requester the node is free (call after dropping the [`NodeLock`]) and
    /// waits until it says it took the lock, it goes away, or [`TAKEN_TIMEOUT`] passes.
    /// Returns whether it said it took the lock.
    pub async fn released(self) -> bool {
        let mut stream = self.stream;
        if let Err(e) = stream.write_all(b"released\n").await {
            // It sees the end of the stream instead, and the lock is free either way.
            tracing::debug!(error = %crate::error_chain(&e), "could not tell the new instance the node is free");
            return false;
        }
        let mut line = String::new();
        let mut reader = BufReader::new(stream);
        let read = reader.read_line(&mut line);
        matches!(
            tokio::time::timeout(TAKEN_TIMEOUT, read).await,
            Ok(Ok(_)) if line.trim() == "taken"
        )
    }
}

#[cfg(test)]
mod tests;
