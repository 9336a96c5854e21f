//! The container's root file system, from the state the runtime passes on stdin: the
//! bundle's `config.json` names it (`root.path`, relative to the bundle or absolute).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Why the root could not be found.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// stdin could not be read.
    #[error("reading the container state from stdin")]
    Read(#[source] std::io::Error),
    /// The state is not the OCI state JSON.
    #[error("the container state on stdin is not OCI state JSON")]
    Parse(#[source] serde_json::Error),
    /// The bundle's config could not be read.
    #[error("reading {}", .0.display())]
    Config(PathBuf, #[source] std::io::Error),
    /// The bundle's config is not an OCI config.
    #[error("{} is not an OCI runtime config", .0.display())]
    ConfigParse(PathBuf, #[source] serde_json::Error),
    /// The root is the host's own: nothing in it is the hook's to change.
    #[error("the container's root is {}: refusing to change the host's", .0.display())]
    HostRoot(PathBuf),
}

#[derive(Deserialize)]
struct State {
    bundle: PathBuf,
}

#[derive(Deserialize)]
struct Config {
    root: Root,
}

#[derive(Deserialize)]
struct Root {
    path: PathBuf,
}

/// The container's root from the OCI state `text`.
pub fn container_root(text: &str) -> Result<PathBuf, StateError> {
    let state: State = serde_json::from_str(text).map_err(StateError::Parse)?;
    let config_path = state.bundle.join("config.json");
    let config = std::fs::read_to_string(&config_path)
        .map_err(|e| StateError::Config(config_path.clone(), e))?;
    let config: Config =
        serde_json::from_str(&config).map_err(|e| StateError::ConfigParse(config_path, e))?;
    let root = if config.root.path.is_absolute() {
        config.root.path
    } else {
        state.bundle.join(config.root.path)
    };
    if root
        .components()
        .all(|c| c == std::path::Component::RootDir)
        || root == Path::new("")
    {
        return Err(StateError::HostRoot(root));
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_the_bundles_relative_or_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let state = format!(
            r#"{{"ociVersion":"1.2.0","id":"c","status":"creating","pid":1,"bundle":"{}"}}"#,
            dir.path().display()
        );
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"root":{"path":"rootfs"}}"#,
        )
        .unwrap();
        assert_eq!(container_root(&state).unwrap(), dir.path().join("rootfs"));
        std::fs::write(dir.path().join("config.json"), r#"{"root":{"path":"/"}}"#).unwrap();
        assert!(matches!(
            container_root(&state),
            Err(StateError::HostRoot(_))
        ));
        assert!(matches!(container_root("{}"), Err(StateError::Parse(_))));
    }
}
