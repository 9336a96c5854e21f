//! Replacing a file whole: the bytes go to a temp file beside it (a dot-file, which the
//! container runtimes watching the CDI directory ignore), which is renamed over it, so a
//! reader or a crash sees the old content or the new, never a part.

use std::{
    fs::{self, File},
    io::{self, Write},
    path::{Path, PathBuf},
};

/// Whether the bytes must be on disk before the rename.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// fsync first: the file must outlive a power loss (records, the checkpoint).
    Synced,
    /// Only atomicity: the file lives on a tmpfs, or is rewritten at start-up anyway.
    Atomic,
}

/// A step of [`write`] failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}", path.display())]
pub struct Error {
    /// `creating`, `writing`, `syncing` or `renaming into place`.
    pub action: &'static str,
    /// The file the step acted on.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// Replaces `path` with `bytes` (see the module doc). The directory must exist.
pub fn write(path: &Path, bytes: &[u8], durability: Durability) -> Result<(), Error> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let step = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error {
            action,
            path,
            source,
        }
    };
    let mut f = File::create(&tmp).map_err(step("creating", &tmp))?;
    f.write_all(bytes).map_err(step("writing", &tmp))?;
    if durability == Durability::Synced {
        f.sync_all().map_err(step("syncing", &tmp))?;
    }
    drop(f);
    fs::rename(&tmp, path).map_err(step("renaming into place", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        fs::write(&path, b"old").unwrap();
        write(&path, b"new", Durability::Synced).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
    }

    #[test]
    fn a_failed_write_names_its_step_and_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir").join("record.json");
        let err = write(&missing, b"new", Durability::Atomic).unwrap_err();
        assert_eq!(err.action, "creating");
        assert!(!missing.exists());
    }
}
