//! Unix socket paths and hygiene for the two kubelet-facing sockets.
//!
//! Rules from the kubelet's `pluginwatcher/README.md` and the Go library (dra.md §2.2):
//! paths fit `AF_UNIX` (108 bytes with the terminating NUL), a plugin deletes its stale
//! socket before binding and removes its socket on exit. We only ever delete sockets: a
//! regular file or directory at a socket path is somebody else's and is refused.

use std::{
    io,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
};

use tokio::net::UnixListener;

/// Size of `sockaddr_un.sun_path` on Linux (`unixPathMax` in the Go library).
pub const UNIX_PATH_MAX: usize = 108;

/// Errors preparing, binding or removing a socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The path does not fit `sockaddr_un`.
    #[error(
        "socket path {} is {len} bytes, but AF_UNIX allows at most {} ({} including the terminating NUL); choose shorter directories",
        .path.display(), UNIX_PATH_MAX - 1, UNIX_PATH_MAX
    )]
    PathTooLong {
        /// The offending path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The kubelet needs absolute endpoints, and relative sockets depend on the cwd.
    #[error("socket path {} is not absolute", .path.display())]
    NotAbsolute {
        /// The offending path.
        path: PathBuf,
    },
    /// Something other than a socket sits at the path.
    #[error(
        "refusing to replace {} with a socket: it is a {kind}, not a stale socket; remove it or choose another directory",
        .path.display()
    )]
    NotASocket {
        /// The offending path.
        path: PathBuf,
        /// What is there ("regular file", "directory", …).
        kind: &'static str,
    },
    /// Creating the socket's parent directory failed.
    #[error("failed to create directory {}", .path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Inspecting or removing an existing socket failed.
    #[error("failed to remove stale socket {}", .path.display())]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// `bind`/`listen` failed.
    #[error("failed to listen on {}", .path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// `<registry_dir>/<driver>-reg.sock`, where the kubelet's plugin watcher looks.
pub fn registration_socket_path(registry_dir: &Path, driver_name: &str) -> PathBuf {
    registry_dir.join(format!("{driver_name}-reg.sock"))
}

/// The registration socket of plugin instance `instance` (its pod UID), so that two
/// instances of one driver can be registered at once during a rolling update. The names
/// are the Go library's (`RollingUpdateRegistrarSocketFile`), in its order of preference,
/// the first whose path fits `sockaddr_un`: `<driver>-<uid>-reg.sock`,
/// `<driver>-<base64url(sha256(uid)[..8])>-reg.sock`,
/// `dra-<base64url(sha256(driver NUL uid)[..16])>-reg.sock`.
pub fn instance_registration_socket_path(
    registry_dir: &Path,
    driver_name: &str,
    instance: &str,
) -> PathBuf {
    use base64::Engine as _;
    use sha2::Digest as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let uid_hash = sha2::Sha256::digest(instance.as_bytes());
    let driver_uid_hash = sha2::Sha256::digest(format!("{driver_name}\0{instance}").as_bytes());
    let candidates = [
        format!("{driver_name}-{instance}-reg.sock"),
        format!("{driver_name}-{}-reg.sock", b64(&uid_hash[..8])),
        format!("dra-{}-reg.sock", b64(&driver_uid_hash[..16])),
    ];
    let fits = |p: &PathBuf| p.as_os_str().len() < UNIX_PATH_MAX;
    let mut paths = candidates.iter().map(|c| registry_dir.join(c));
    let last = registry_dir.join(&candidates[2]);
    paths.find(fits).unwrap_or(last)
}

/// `<plugins_dir>/<driver>/dra.sock`, announced to the kubelet as the DRA endpoint.
pub fn dra_socket_path(plugins_dir: &Path, driver_name: &str) -> PathBuf {
    plugins_dir.join(driver_name).join("dra.sock")
}

/// The DRA socket of plugin instance `instance` (its pod UID): `dra-<uid>.sock` in the
/// driver's plugin directory, the Go library's name in rolling-update mode.
pub fn instance_dra_socket_path(plugins_dir: &Path, driver_name: &str, instance: &str) -> PathBuf {
    plugins_dir
        .join(driver_name)
        .join(format!("dra-{instance}.sock"))
}

/// Checks that `path` is absolute and fits `sockaddr_un`.
pub fn check_path(path: &Path) -> Result<(), SocketError> {
    if !path.is_absolute() {
        return Err(SocketError::NotAbsolute {
            path: path.to_owned(),
        });
    }
    let len = path.as_os_str().len();
    // sun_path must also hold the terminating NUL.
    if len >= UNIX_PATH_MAX {
        return Err(SocketError::PathTooLong {
            path: path.to_owned(),
            len,
        });
    }
    Ok(())
}

/// Checks the path, creates its parent directory, removes a stale socket and listens.
///
/// Must run inside a tokio runtime.
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    check_path(path)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| SocketError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
    }
    remove_stale(path)?;
    UnixListener::bind(path).map_err(|source| SocketError::Bind {
        path: path.to_owned(),
        source,
    })
}

/// Removes a socket left behind by an earlier run; a missing path is fine.
pub fn remove_stale(path: &Path) -> Result<(), SocketError> {
    let stale = |source| SocketError::RemoveStale {
        path: path.to_owned(),
        source,
    };
    let file_type = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta.file_type(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(stale(e)),
    };
    if !file_type.is_socket() {
        let kind = if file_type.is_dir() {
            "directory"
        } else if file_type.is_symlink() {
            "symbolic link"
        } else if file_type.is_file() {
            "regular file"
        } else {
            "special file"
        };
        return Err(SocketError::NotASocket {
            path: path.to_owned(),
            kind,
        });
    }
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "removed stale socket");
            Ok(())
        }
        // Someone else removed it in between: the goal is reached.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(stale(e)),
    }
}

/// Removes our socket on shutdown; logs instead of failing, since we are exiting anyway.
pub fn remove_on_exit(path: &Path) {
    if let Err(error) = remove_stale(path) {
        tracing::warn!(
            error = %crate::error_chain(&error),
            "could not remove socket on exit"
        );
    }
}

/// Which file a socket we bound is: another process that later binds the same path (a
/// new instance started without a pod UID) makes a new inode there, which is not ours to
/// remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketIdentity {
    dev: u64,
    ino: u64,
}

impl SocketIdentity {
    /// The identity of the socket at `path` now; `None` when nothing is there.
    pub fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(path).ok().map(|m| Self {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// Removes the socket at `path` on shutdown only if it is still the one we bound
/// (`ours`); logs instead of failing, since we are stopping anyway.
pub fn remove_own(path: &Path, ours: Option<SocketIdentity>) {
    match (SocketIdentity::of(path), ours) {
        (None, _) => {}
        (Some(now), Some(ours)) if now == ours => remove_on_exit(path),
        (Some(_), _) => tracing::info!(
            path = %path.display(),
            "leaving the socket at this path: another plugin instance bound it since"
        ),
    }
}

/// True when nothing exists at `path` any more (the kubelet wiped its directory).
pub fn is_gone(path: &Path) -> bool {
    matches!(std::fs::symlink_metadata(path), Err(e) if e.kind() == io::ErrorKind::NotFound)
}
