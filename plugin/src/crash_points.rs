//! Crash points: named moments right after one of the plugin's durable steps (a claim's
//! checkpoint record written or removed, its CDI spec written or removed) where a test
//! can make the plugin abort. The simulated driver's `abortAfter` covers the moments right
//! after a hardware step; these cover the ones between two file writes with no hardware
//! step between them (a whole GPU's or a time-slice's prepare is nothing else), so the
//! fault campaign can prove a crash there loses nothing either.
//!
//! Inert unless the environment variable [`ENV`] names a control file; each point then
//! re-reads it (`{"abortAfter": ["claim-recorded:prepare-started"]}`), and a point it
//! lists is taken off the list (so the restarted plugin runs through it) before the
//! process aborts. Nothing in an install sets the variable; it costs one environment
//! lookup per process otherwise.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use serde::{Deserialize, Serialize};
use tracing::{error, warn};

use crate::checkpoint::ClaimPhase;

/// The environment variable naming the control file.
pub const ENV: &str = "TESSERA_CRASH_POINTS";

/// A claim's record was written in `PrepareStarted` (the intent, and again after each
/// MIG instance it made).
pub const CLAIM_RECORDED_STARTED: &str = "claim-recorded:prepare-started";
/// A claim's record was written in `PrepareCompleted`.
pub const CLAIM_RECORDED_COMPLETED: &str = "claim-recorded:prepare-completed";
/// A claim's CDI spec was written.
pub const CDI_SPEC_WRITTEN: &str = "cdi-spec-written";
/// A claim's CDI spec was removed (unprepare or rollback).
pub const CDI_SPEC_REMOVED: &str = "cdi-spec-removed";
/// A claim's record was removed (unprepare or rollback done).
pub const CLAIM_FORGOTTEN: &str = "claim-forgotten";

/// Every point, for the campaign and the docs.
pub const ALL: [&str; 5] = [
    CLAIM_RECORDED_STARTED,
    CLAIM_RECORDED_COMPLETED,
    CDI_SPEC_WRITTEN,
    CDI_SPEC_REMOVED,
    CLAIM_FORGOTTEN,
];

/// The point reached once a record in `phase` is on disk.
pub fn claim_recorded(phase: ClaimPhase) -> &'static str {
    match phase {
        ClaimPhase::PrepareStarted => CLAIM_RECORDED_STARTED,
        ClaimPhase::PrepareCompleted => CLAIM_RECORDED_COMPLETED,
    }
}

/// The control file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Control {
    #[serde(default)]
    abort_after: Vec<String>,
}

static CONTROL: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Marks `point` reached; aborts the process when the control file lists it.
pub fn reached(point: &str) {
    let Some(path) = CONTROL.get_or_init(|| std::env::var_os(ENV).map(PathBuf::from)) else {
        return;
    };
    if take(path, point) {
        error!(point, control = %path.display(), "crash point reached: aborting, as the control file asks");
        std::process::abort();
    }
}

/// Whether the control file at `path` lists `point`; if so, takes it off the list.
fn take(path: &Path, point: &str) -> bool {
    let Ok(text) = fs::read_to_string(path) else {
        return false;
    };
    let mut control: Control = match serde_json::from_str(&text) {
        Ok(c) => c,
        Err(e) => {
            warn!(control = %path.display(), error = %crate::error_chain(&e), "unreadable crash-point control file; ignored");
            return false;
        }
    };
    let Some(i) = control.abort_after.iter().position(|p| p == point) else {
        return false;
    };
    control.abort_after.remove(i);
    if let Err(e) = write_back(path, &control) {
        // Aborting anyway would abort again at the same point after the restart.
        warn!(control = %path.display(), error = %crate::error_chain(&e), "could not take the crash point off the control file; not aborting");
        return false;
    }
    true
}

fn write_back(path: &Path, control: &Control) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(control).map_err(std::io::Error::other)?;
    crate::atomic_file::write(path, &bytes, crate::atomic_file::Durability::Synced)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_point_is_taken_off_the_list_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crash-points.json");
        fs::write(
            &path,
            r#"{"abortAfter": ["cdi-spec-written", "claim-forgotten"]}"#,
        )
        .unwrap();
        assert!(!take(&path, CLAIM_RECORDED_STARTED));
        assert!(take(&path, CDI_SPEC_WRITTEN));
        assert!(!take(&path, CDI_SPEC_WRITTEN));
        let left: Control = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(left.abort_after, [CLAIM_FORGOTTEN]);
    }

    #[test]
    fn a_missing_or_unreadable_file_arms_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crash-points.json");
        assert!(!take(&path, CDI_SPEC_WRITTEN));
        fs::write(&path, "not json").unwrap();
        assert!(!take(&path, CDI_SPEC_WRITTEN));
        assert_eq!(fs::read_to_string(&path).unwrap(), "not json");
    }

    #[test]
    fn every_phase_has_a_point() {
        for phase in [ClaimPhase::PrepareStarted, ClaimPhase::PrepareCompleted] {
            assert!(ALL.contains(&claim_recorded(phase)));
        }
    }
}
