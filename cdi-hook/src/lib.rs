//! The OCI `createContainer` hook Tessera's CDI specs name, with the two jobs NVIDIA's
//! `nvidia-cdi-hook` does for a CUDA container (containers.md §1.2):
//!
//! - `create-symlinks --link <target>::<link> …`: the libraries' SONAME and `.so` links
//!   next to the library files the spec mounts (`libcuda.so.1 -> libcuda.so.<version>`),
//!   since a bind mount brings a file, not the links `ldconfig` made for it on the host.
//! - `update-ldcache --folder <dir> …`: lists the mounted library directories in the
//!   container's `/etc/ld.so.conf.d` and rebuilds its `/etc/ld.so.cache` with the host's
//!   `ldconfig -r <container root>`, so the loader finds the libraries where the host's
//!   distribution put them even when the image's distribution puts its own elsewhere.
//!   `ldconfig` chroots into the container's root before it reads anything there, and the
//!   image needs neither a shell nor `ldconfig` (distroless images work).
//!
//! The runtime runs the hook with the container's state on stdin, in the container's mount
//! namespace before it switches root (OCI runtime spec, `createContainer`), so the hook
//! finds the root file system from the bundle's `config.json` and sees the spec's mounts.
//! Every path inside the container is resolved inside its root (`openat2` with
//! `RESOLVE_IN_ROOT`), so a link in the image cannot point a write outside the container.

mod ldcache;
mod links;
mod state;

use std::io::Read;

pub use ldcache::LdcacheError;
pub use links::{Link, LinkError};
pub use state::StateError;

/// Why the hook failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line is not one the hook takes.
    #[error(
        "{0}\nusage: tessera-cdi-hook create-symlinks --link <target>::<link>… | update-ldcache --folder <dir>… [--ldconfig-path <path>]"
    )]
    Usage(String),
    /// The container's state could not be read.
    #[error(transparent)]
    State(#[from] StateError),
    /// A link could not be made.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The loader cache could not be rebuilt.
    #[error(transparent)]
    Ldcache(#[from] LdcacheError),
}

/// `e` and its sources, `: `-separated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A parsed command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `create-symlinks`.
    CreateSymlinks(Vec<Link>),
    /// `update-ldcache`.
    UpdateLdcache {
        /// Directories (container paths) to add.
        folders: Vec<String>,
        /// The host's `ldconfig`, when given.
        ldconfig: Option<String>,
    },
}

/// Parses `args` (with `argv[0]`).
pub fn parse(args: &[String]) -> Result<Command, Error> {
    let mut it = args.iter().skip(1);
    let command = it.next().ok_or_else(|| Error::Usage("no command".into()))?;
    let mut pairs: Vec<(String, String)> = Vec::new();
    while let Some(flag) = it.next() {
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => {
                let v = it
                    .next()
                    .ok_or_else(|| Error::Usage(format!("{flag} needs a value")))?;
                (flag.clone(), v.clone())
            }
        };
        pairs.push((name, value));
    }
    let take = |want: &str| -> Vec<String> {
        pairs
            .iter()
            .filter(|(n, _)| n == want)
            .map(|(_, v)| v.clone())
            .collect()
    };
    let known: &[&str] = match command.as_str() {
        "create-symlinks" => &["--link"],
        "update-ldcache" => &["--folder", "--ldconfig-path"],
        other => return Err(Error::Usage(format!("unknown command {other:?}"))),
    };
    if let Some((n, _)) = pairs.iter().find(|(n, _)| !known.contains(&n.as_str())) {
        return Err(Error::Usage(format!("{command} takes no {n}")));
    }
    Ok(match command.as_str() {
        "create-symlinks" => Command::CreateSymlinks(
            take("--link")
                .iter()
                .map(|l| Link::parse(l))
                .collect::<Result<_, _>>()?,
        ),
        _ => Command::UpdateLdcache {
            folders: take("--folder"),
            ldconfig: take("--ldconfig-path").pop(),
        },
    })
}

/// Runs the hook: `args` with `argv[0]`, the container's state on `stdin`.
pub fn run(args: &[String], mut stdin: impl Read) -> Result<(), Error> {
    let command = parse(args)?;
    let mut text = String::new();
    stdin.read_to_string(&mut text).map_err(StateError::Read)?;
    let root = state::container_root(&text)?;
    match command {
        Command::CreateSymlinks(links) => links::create(&root, &links)?,
        Command::UpdateLdcache { folders, ldconfig } => {
            ldcache::update(&root, &folders, ldconfig.as_deref())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_specs_command_lines_parse() {
        assert_eq!(
            parse(&args(&[
                "tessera-cdi-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
            ]))
            .unwrap(),
            Command::CreateSymlinks(vec![Link {
                target: "libcuda.so.1".into(),
                link: "/usr/lib/x86_64-linux-gnu/libcuda.so".into()
            }])
        );
        assert_eq!(
            parse(&args(&[
                "h",
                "update-ldcache",
                "--folder",
                "/a",
                "--folder=/b"
            ]))
            .unwrap(),
            Command::UpdateLdcache {
                folders: vec!["/a".into(), "/b".into()],
                ldconfig: None
            }
        );
        for bad in [
            &["h"][..],
            &["h", "chmod"],
            &["h", "create-symlinks", "--link"],
            &["h", "create-symlinks", "--folder", "/a"],
            &["h", "create-symlinks", "--link", "no-separator"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
    }
}
