//! What a CUDA program needs inside its container, checked from inside it
//! (containers.md §2): the control nodes and the GPU's node as character devices with the
//! driver's numbers; `libcuda.so.1` and `libnvidia-ml.so.1` found by the dynamic loader by
//! their bare names, as the CUDA runtime and NVML users load them; the devices the CUDA
//! driver API then enumerates (`cuInit`, `cuDeviceGetCount`, `cuDeviceGetUuid`, a context
//! and `cuMemGetInfo`); for a MIG device its two capability nodes; for an MPS client the
//! pipe directory its env names. Every finding is printed; the first missing thing is
//! the failure.

mod cuda;
mod nodes;

use std::{collections::BTreeMap, path::PathBuf};

pub use cuda::{CudaDevice, CudaReport};
pub use nodes::Node;

/// The environment the probe reads (the container's).
#[derive(Clone, Debug, Default)]
pub struct Env {
    /// All variables.
    pub vars: BTreeMap<String, String>,
    /// The device directory (`/dev`).
    pub dev: PathBuf,
    /// `/proc/devices`.
    pub proc_devices: PathBuf,
}

impl Env {
    /// The process's.
    pub fn from_process() -> Self {
        Env {
            vars: std::env::vars().collect(),
            dev: "/dev".into(),
            proc_devices: "/proc/devices".into(),
        }
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.vars.get(k).map(String::as_str)
    }
}

/// What the probe found.
#[derive(Debug, Default)]
pub struct Report {
    lines: Vec<String>,
    failures: Vec<String>,
}

impl Report {
    fn found(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    fn missing(&mut self, reason: impl Into<String>) {
        let reason = reason.into();
        self.lines.push(format!("MISSING: {reason}"));
        self.failures.push(reason);
    }

    /// Everything found, one line each.
    pub fn text(&self) -> String {
        self.lines.iter().map(|l| format!("{l}\n")).collect()
    }

    /// The first thing missing, if any.
    pub fn failure(&self) -> Option<&str> {
        self.failures.first().map(String::as_str)
    }
}

/// Runs every check.
pub fn run(env: &Env) -> Report {
    let mut r = Report::default();
    let majors = nodes::majors(&env.proc_devices);
    nodes::check(env, &majors, &mut r);
    let cuda = cuda::probe(&mut r);
    if let Some(want) = env.get("TESSERA_DEVICE_UUID") {
        let seen: Vec<&str> = cuda.devices.iter().map(|d| d.uuid.as_str()).collect();
        if cuda::same_uuid_in(want, &seen) {
            r.found(format!("CUDA sees the claimed device {want}"));
        } else if cuda.init == 0 {
            r.missing(format!(
                "CUDA does not see the claimed device {want} (it sees {seen:?})"
            ));
        }
    }
    if let Some(pipe) = env.get("CUDA_MPS_PIPE_DIRECTORY") {
        let dir = PathBuf::from(pipe);
        if dir.is_dir() {
            r.found(format!("MPS pipe directory {pipe}"));
        } else {
            r.missing(format!(
                "the MPS pipe directory {pipe} (CUDA_MPS_PIPE_DIRECTORY) is not there"
            ));
        }
        for k in [
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        ] {
            if let Some(v) = env.get(k) {
                r.found(format!("{k}={v}"));
            }
        }
    }
    r
}
