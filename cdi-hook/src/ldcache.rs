//! `update-ldcache`: the container's loader learns the mounted library directories.
//!
//! Writes `/etc/ld.so.conf.d/00-tessera-cdi.conf` (the folders) and
//! `zz-tessera-cdi-system.conf` (the image's own library directories, since the host's
//! `ldconfig` knows the host distribution's built-in directories, not the image's), makes
//! `/etc/ld.so.conf` include the directory if the image has none, then runs the host's
//! `ldconfig -r <root>`, which chroots into the container's root before reading or writing
//! anything there and rebuilds `/etc/ld.so.cache`.

use std::{
    io::Write,
    os::fd::AsFd,
    path::{Path, PathBuf},
    process::Command,
};

use rustix::fs::{Mode, OFlags};

use crate::links::{LinkError, dir_in_root, open_root};

/// The folders' drop-in.
pub const CONF: &str = "00-tessera-cdi.conf";
/// The image's own directories' drop-in.
pub const SYSTEM_CONF: &str = "zz-tessera-cdi-system.conf";
/// Library directories a distribution may use, in the order `ldconfig` should see them.
const SYSTEM_DIRS: [&str; 6] = [
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib",
    "/usr/lib",
];
/// Where hosts have `ldconfig` (Ubuntu's `ldconfig` is a script around `ldconfig.real`).
const LDCONFIG: [&str; 2] = ["/sbin/ldconfig.real", "/sbin/ldconfig"];

/// Why the cache could not be rebuilt.
#[derive(Debug, thiserror::Error)]
pub enum LdcacheError {
    /// A file could not be written inside the container.
    #[error(transparent)]
    Files(#[from] LinkError),
    /// Writing a configuration file failed.
    #[error("writing /etc/{0} in the container")]
    Write(String, #[source] std::io::Error),
    /// The host has no `ldconfig`.
    #[error("no ldconfig on the host (looked for {})", LDCONFIG.join(", "))]
    NoLdconfig,
    /// `ldconfig` could not run or failed.
    #[error("{} -r {}: {detail}", .ldconfig.display(), .root.display())]
    Ldconfig {
        /// The program.
        ldconfig: PathBuf,
        /// The container's root.
        root: PathBuf,
        /// Its exit status and output.
        detail: String,
    },
}

/// The configuration text listing `dirs`, each once.
pub fn conf_text(dirs: &[String]) -> String {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = String::from("# Written by tessera-cdi-hook: NVIDIA driver libraries.\n");
    for d in dirs {
        if seen.insert(d.as_str()) {
            out.push_str(d);
            out.push('\n');
        }
    }
    out
}

/// Writes `text` to `<dir>/<name>` inside the root (through a temporary file renamed over
/// it, never following a link at the final name).
fn write_in(dir: &impl AsFd, name: &str, text: &str, what: &str) -> Result<(), LdcacheError> {
    let tmp = format!(".{name}.tmp");
    let err = |e: std::io::Error| LdcacheError::Write(what.to_string(), e);
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| err(e.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(text.as_bytes()).map_err(err)?;
    drop(file);
    rustix::fs::renameat(dir, tmp.as_str(), dir, name).map_err(|e| err(e.into()))
}

/// Adds `folders` to the container's loader configuration and rebuilds its cache.
pub fn update(root: &Path, folders: &[String], ldconfig: Option<&str>) -> Result<(), LdcacheError> {
    let root_fd = open_root(root)?;
    let etc = dir_in_root(&root_fd, Path::new("/etc"))?;
    let confd = dir_in_root(&root_fd, Path::new("/etc/ld.so.conf.d"))?;
    write_in(
        &confd,
        CONF,
        &conf_text(folders),
        &format!("ld.so.conf.d/{CONF}"),
    )?;
    let system: Vec<String> = SYSTEM_DIRS
        .iter()
        .filter(|d| dir_in_root_exists(&root_fd, d))
        .map(ToString::to_string)
        .collect();
    write_in(
        &confd,
        SYSTEM_CONF,
        &conf_text(&system),
        &format!("ld.so.conf.d/{SYSTEM_CONF}"),
    )?;
    let has_conf =
        rustix::fs::statat(&etc, "ld.so.conf", rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok();
    if !has_conf {
        write_in(
            &etc,
            "ld.so.conf",
            "include /etc/ld.so.conf.d/*.conf\n",
            "ld.so.conf",
        )?;
    }
    let ldconfig = match ldconfig {
        Some(p) => PathBuf::from(p),
        None => LDCONFIG
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or(LdcacheError::NoLdconfig)?,
    };
    let out = Command::new(&ldconfig)
        .arg("-r")
        .arg(root)
        .output()
        .map_err(|e| LdcacheError::Ldconfig {
            ldconfig: ldconfig.clone(),
            root: root.to_path_buf(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(LdcacheError::Ldconfig {
            ldconfig,
            root: root.to_path_buf(),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// Whether the directory `dir` exists inside the root (without making it).
fn dir_in_root_exists(root: &impl AsFd, dir: &str) -> bool {
    rustix::fs::openat2(
        root,
        dir.trim_start_matches('/'),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conf_lists_each_folder_once() {
        let text = conf_text(&["/a".into(), "/b".into(), "/a".into()]);
        assert_eq!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            ["/a", "/b"]
        );
    }

    #[test]
    fn the_cache_of_a_root_without_ldconfig_or_shell_learns_the_folders() {
        let Some(ldconfig) = LDCONFIG.iter().find(|p| Path::new(p).is_file()) else {
            eprintln!("this machine has no ldconfig; the hook would say so");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let lib = root.join("opt/driver/lib");
        std::fs::create_dir_all(&lib).unwrap();
        // A real shared object with a SONAME: the host's libc, copied under another name.
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("the host's libc");
        std::fs::copy(libc, lib.join("libc.so.6")).unwrap();
        update(root, &["/opt/driver/lib".into()], Some(ldconfig)).unwrap();
        let cache = std::fs::read(root.join("etc/ld.so.cache")).expect("ldconfig wrote the cache");
        let needle = b"/opt/driver/lib/libc.so.6";
        assert!(
            cache.windows(needle.len()).any(|w| w == needle),
            "the cache lists the folder's library"
        );
        assert!(root.join("etc/ld.so.conf").is_file());
        assert!(!dir.path().join("opt/driver/lib/ld.so.cache").exists());
    }
}
