//! `create-symlinks`: links inside the container's root, made through directory handles
//! opened inside that root, so no link of the image can send them elsewhere.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Component, Path, PathBuf},
};

use rustix::{
    fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags},
    io::Errno,
};

/// One `<target>::<link>` of the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// What the link points at (kept as given: relative to the link's directory, usually).
    pub target: String,
    /// The link's absolute path in the container.
    pub link: String,
}

/// Why a link could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The argument is not `<target>::<link>` with an absolute link path.
    #[error("{0:?} is not <target>::</absolute/link>")]
    Syntax(String),
    /// A system call failed.
    #[error("{what} {} in the container", .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where, inside the container.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Link {
    /// Parses `<target>::<link>`.
    pub fn parse(arg: &str) -> Result<Self, LinkError> {
        match arg.split_once("::") {
            Some((target, link))
                if !target.is_empty() && link.starts_with('/') && link.len() > 1 =>
            {
                Ok(Link {
                    target: target.into(),
                    link: link.into(),
                })
            }
            _ => Err(LinkError::Syntax(arg.into())),
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(Errno) -> LinkError {
    let path = path.to_path_buf();
    move |e| LinkError::Io {
        what,
        path,
        source: e.into(),
    }
}

/// The container's root directory, opened.
pub(crate) fn open_root(root: &Path) -> Result<OwnedFd, LinkError> {
    rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("opening the root", Path::new("/")))
}

/// The directory `dir` (absolute, in the container) opened inside `root`, made with mode
/// 0755 where it is missing.
pub(crate) fn dir_in_root(root: &impl AsFd, dir: &Path) -> Result<OwnedFd, LinkError> {
    let mut sofar = PathBuf::from(".");
    for c in dir.components() {
        match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(name) => {
                let next = sofar.join(name);
                let open = || {
                    rustix::fs::openat2(
                        root,
                        &next,
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                        Mode::empty(),
                        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
                    )
                };
                if let Err(Errno::NOENT) = open() {
                    let parent = rustix::fs::openat2(
                        root,
                        &sofar,
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                        Mode::empty(),
                        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
                    )
                    .map_err(io("opening", &sofar))?;
                    match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io("creating", &next)(e)),
                    }
                }
                open().map_err(io("opening", &next))?;
                sofar = next;
            }
            Component::ParentDir | Component::Prefix(_) => {
                return Err(LinkError::Syntax(dir.display().to_string()));
            }
        }
    }
    rustix::fs::openat2(
        root,
        &sofar,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(io("opening", dir))
}

/// Makes every link under `root`. A link already there with the same target stays; a
/// link with another target is replaced; a file or directory of the image at that path is
/// left alone (the image's own choice wins over a convenience link).
pub fn create(root: &Path, links: &[Link]) -> Result<(), LinkError> {
    let root_fd = open_root(root)?;
    for l in links {
        let path = Path::new(&l.link);
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(LinkError::Syntax(l.link.clone()));
        };
        let dir_fd = dir_in_root(&root_fd, dir)?;
        match rustix::fs::symlinkat(l.target.as_str(), &dir_fd, name) {
            Ok(()) => continue,
            Err(Errno::EXIST) => {}
            Err(e) => return Err(io("linking", path)(e)),
        }
        let st = rustix::fs::statat(&dir_fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(io("inspecting", path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
            continue;
        }
        let current = rustix::fs::readlinkat(&dir_fd, name, Vec::new())
            .map_err(io("reading the link", path))?;
        if current.as_bytes() == l.target.as_bytes() {
            continue;
        }
        rustix::fs::unlinkat(&dir_fd, name, AtFlags::empty())
            .map_err(io("replacing the link", path))?;
        rustix::fs::symlinkat(l.target.as_str(), &dir_fd, name).map_err(io("linking", path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(t: &str, l: &str) -> Link {
        Link {
            target: t.into(),
            link: l.into(),
        }
    }

    #[test]
    fn links_are_made_replaced_kept_and_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        let lib = root.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libfoo.so"), b"the image's own").unwrap();
        std::os::unix::fs::symlink("libcuda.so.old", lib.join("libcuda.so.1")).unwrap();
        // An image link pointing outside: following it must stay inside the root.
        std::os::unix::fs::symlink("/../../..", root.join("escape")).unwrap();
        create(
            &root,
            &[
                link(
                    "libcuda.so.580.95.05",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                ),
                link("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so"),
                link("libfoo.so.1", "/usr/lib/x86_64-linux-gnu/libfoo.so"),
                link("x", "/usr/lib64/new-dir/libbar.so"),
                link("y", "/escape/tmp/outside"),
            ],
        )
        .unwrap();
        let read = |p: &str| std::fs::read_link(root.join(p)).unwrap();
        assert_eq!(
            read("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            Path::new("libcuda.so.580.95.05")
        );
        assert_eq!(
            read("usr/lib/x86_64-linux-gnu/libcuda.so"),
            Path::new("libcuda.so.1")
        );
        assert_eq!(
            std::fs::read(lib.join("libfoo.so")).unwrap(),
            b"the image's own"
        );
        assert_eq!(read("usr/lib64/new-dir/libbar.so"), Path::new("x"));
        // `/escape` resolves to the root itself inside the container.
        assert_eq!(read("tmp/outside"), Path::new("y"));
        assert!(!dir.path().join("tmp/outside").exists());
        // Again: nothing changes, nothing fails.
        create(
            &root,
            &[link("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so")],
        )
        .unwrap();
    }

    #[test]
    fn a_link_must_be_absolute() {
        assert!(Link::parse("a::b").is_err());
        assert!(Link::parse("::/b").is_err());
        assert!(Link::parse("a::/").is_err());
        assert_eq!(Link::parse("a::/b").unwrap(), link("a", "/b"));
    }
}
