//! A small JSON record the plugin keeps in its state directory, outliving the process:
//! read whole or found absent, written whole (temp file, fsync, rename, so a crash leaves
//! the old record or the new one) and only when its content changes.

use std::{
    fs,
    path::{Path, PathBuf},
};

use serde::{Serialize, de::DeserializeOwned};

use crate::atomic_file::{self, Durability};

/// Reading or writing a record failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{action} {}", .path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file does not hold such a record.
    #[error("{} is not a record of {what}", .path.display())]
    Parse {
        /// What the record holds.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

/// One record file.
#[derive(Clone, Debug)]
pub struct RecordFile {
    path: PathBuf,
    what: &'static str,
}

impl RecordFile {
    /// The record at `path`, holding `what` (for error messages).
    pub fn new(path: impl Into<PathBuf>, what: &'static str) -> Self {
        Self {
            path: path.into(),
            what,
        }
    }

    /// Where it lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record; `None` when there is no file.
    pub fn read<T: DeserializeOwned>(&self) -> Result<Option<T>, Error> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(self.io("reading", source)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| Error::Parse {
                what: self.what,
                path: self.path.clone(),
                source,
            })
    }

    /// Writes `record`, unless the file already holds exactly it.
    pub fn write<T: Serialize>(&self, record: &T) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(record).unwrap_or_default();
        if fs::read_to_string(&self.path).is_ok_and(|old| old == text) {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)
                .map_err(|source| self.io("creating the directory of", source))?;
        }
        // fsync, then rename: the record is whole or absent after a crash.
        atomic_file::write(&self.path, text.as_bytes(), Durability::Synced).map_err(|e| Error::Io {
            action: e.action,
            path: e.path,
            source: e.source,
        })
    }

    fn io(&self, action: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            action,
            path: self.path.clone(),
            source,
        }
    }
}
