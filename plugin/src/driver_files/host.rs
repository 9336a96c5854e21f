//! What discovery reads of the node's file system, behind a trait: the plugin reads the
//! real one; tests describe a node in memory, device nodes included, without root.

use std::{
    ffi::OsString,
    io,
    path::{Path, PathBuf},
};

/// What a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// A character device.
    CharDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// A Unix socket.
    Socket,
    /// Anything else (block device, FIFO).
    Other,
}

/// A path's metadata, links not followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// What it is.
    pub kind: Kind,
    /// Permission bits (`0o666`).
    pub mode: u32,
    /// Owning group.
    pub gid: u32,
}

/// Read access to the node's files.
pub trait HostFs: Send + Sync + std::fmt::Debug {
    /// `lstat`.
    fn meta(&self, path: &Path) -> io::Result<Meta>;
    /// The names in a directory.
    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>>;
    /// A link's target.
    fn read_link(&self, path: &Path) -> io::Result<PathBuf>;
    /// A text file.
    fn read_to_string(&self, path: &Path) -> io::Result<String>;
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

impl HostFs for RealFs {
    fn meta(&self, path: &Path) -> io::Result<Meta> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = std::fs::symlink_metadata(path)?;
        let t = m.file_type();
        let kind = if t.is_symlink() {
            Kind::Symlink
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_file() {
            Kind::File
        } else if t.is_char_device() {
            Kind::CharDevice {
                major: rustix::fs::major(m.rdev()),
                minor: rustix::fs::minor(m.rdev()),
            }
        } else if t.is_socket() {
            Kind::Socket
        } else {
            Kind::Other
        };
        Ok(Meta {
            kind,
            mode: m.mode() & 0o7777,
            gid: m.gid(),
        })
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(path)
    }

    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
}

/// A node described in memory, for tests.
#[cfg(test)]
pub mod mem {
    use std::{collections::BTreeMap, sync::Mutex};

    use super::*;

    /// One entry.
    #[derive(Clone, Debug)]
    enum Entry {
        File(String, u32),
        Dir,
        Link(PathBuf),
        Char(u32, u32, u32, u32),
        Socket,
    }

    /// Paths and what they are; parents are made implicitly.
    #[derive(Debug, Default)]
    pub struct MemFs(Mutex<BTreeMap<PathBuf, Entry>>);

    impl MemFs {
        fn put(&self, path: &Path, e: Entry) {
            let mut m = self.0.lock().unwrap();
            for a in path.ancestors().skip(1) {
                m.entry(a.to_path_buf()).or_insert(Entry::Dir);
            }
            m.insert(path.to_path_buf(), e);
        }

        /// A regular file (mode 0755).
        pub fn file(&self, path: impl AsRef<Path>) -> &Self {
            self.put(path.as_ref(), Entry::File(String::new(), 0o755));
            self
        }

        /// A regular file with text.
        pub fn text(&self, path: impl AsRef<Path>, text: &str) -> &Self {
            self.put(path.as_ref(), Entry::File(text.into(), 0o644));
            self
        }

        /// A directory.
        pub fn dir(&self, path: impl AsRef<Path>) -> &Self {
            self.put(path.as_ref(), Entry::Dir);
            self
        }

        /// A symbolic link.
        pub fn link(&self, path: impl AsRef<Path>, target: &str) -> &Self {
            self.put(path.as_ref(), Entry::Link(target.into()));
            self
        }

        /// A character device (mode, group).
        pub fn char(
            &self,
            path: impl AsRef<Path>,
            major: u32,
            minor: u32,
            mode: u32,
            gid: u32,
        ) -> &Self {
            self.put(path.as_ref(), Entry::Char(major, minor, mode, gid));
            self
        }

        /// A Unix socket.
        pub fn socket(&self, path: impl AsRef<Path>) -> &Self {
            self.put(path.as_ref(), Entry::Socket);
            self
        }

        /// Removes a path (and what is under it).
        pub fn remove(&self, path: impl AsRef<Path>) -> &Self {
            self.0
                .lock()
                .unwrap()
                .retain(|p, _| !p.starts_with(path.as_ref()));
            self
        }
    }

    fn missing() -> io::Error {
        io::Error::from(io::ErrorKind::NotFound)
    }

    impl HostFs for MemFs {
        fn meta(&self, path: &Path) -> io::Result<Meta> {
            let m = self.0.lock().unwrap();
            let (kind, mode, gid) = match m.get(path).ok_or_else(missing)? {
                Entry::File(_, mode) => (Kind::File, *mode, 0),
                Entry::Dir => (Kind::Dir, 0o755, 0),
                Entry::Link(_) => (Kind::Symlink, 0o777, 0),
                Entry::Char(major, minor, mode, gid) => (
                    Kind::CharDevice {
                        major: *major,
                        minor: *minor,
                    },
                    *mode,
                    *gid,
                ),
                Entry::Socket => (Kind::Socket, 0o666, 0),
            };
            Ok(Meta { kind, mode, gid })
        }

        fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
            let m = self.0.lock().unwrap();
            match m.get(dir) {
                Some(Entry::Dir) => {}
                _ => return Err(missing()),
            }
            Ok(m.keys()
                .filter(|p| p.parent() == Some(dir))
                .filter_map(|p| p.file_name().map(ToOwned::to_owned))
                .collect())
        }

        fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
            match self.0.lock().unwrap().get(path) {
                Some(Entry::Link(t)) => Ok(t.clone()),
                _ => Err(missing()),
            }
        }

        fn read_to_string(&self, path: &Path) -> io::Result<String> {
            match self.0.lock().unwrap().get(path) {
                Some(Entry::File(t, _)) => Ok(t.clone()),
                _ => Err(missing()),
            }
        }
    }
}
