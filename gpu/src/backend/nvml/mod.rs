//! The NVML backend: real GPUs through `libnvidia-ml.so.1`, loaded at run time.
//!
//! - nvml-wrapper for enumeration, MIG mode and compute mode; the MIG calls it does not
//!   wrap (profiles by index with names, possible placements, GPU/compute instances)
//!   through its `-sys` function table in the private `raw` module.
//! - One `Nvml` handle for the process, all calls serialised by a mutex (concurrent NVML
//!   handle lookups are slow, `gpu-hardware.md` §5.2).
//! - Everything read from the driver: profiles, placements, memory. The catalogue is
//!   never consulted for facts, only to name the model.
//! - A missing `libnvidia-ml.so.1` is [`ErrorKind::LibraryNotFound`] from
//!   [`NvmlBackend::new`], never a panic; initialisation uses `NVML_INIT_FLAG_NO_GPUS` so a
//!   node without visible GPUs still starts.
//! - MPS through `nvidia-cuda-mps-control` ([`mps`]).
//! - Health: from the first subscription on, a thread waits on NVML critical-XID events
//!   and forwards them to [`GpuBackend::health_events`] receivers.

mod health;
pub mod mps;
mod raw;
pub mod root;

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, Once, atomic::AtomicBool},
};

use nvml_wrapper::{
    Device, Nvml, bitmasks::InitFlags, enum_wrappers::device::ComputeMode as NvmlComputeMode,
    enums::device::DeviceArchitecture, error::NvmlError,
};
use tokio::sync::broadcast;

use super::{
    BackendError, ComputeInstance, ComputeMode, ErrorKind, GpuBackend, GpuInfo, HealthEvent,
    MigInstance, MigModeChange, MpsDaemonConfig, MpsState, Operation, TimeSlice,
};
use crate::catalog::{Architecture, Engines, MigLayout, MigProfile, StartSet, find_model};

/// Maps an nvml-wrapper error to our error kinds. The codes the plugin acts on become the
/// kinds our own checks use too (`InUse`, `NotSupported`, …), named in the message; the
/// rest keep the NVML error as their source.
pub(crate) fn map_nvml(e: NvmlError) -> ErrorKind {
    match e {
        NvmlError::LibloadingError(e) => ErrorKind::LibraryNotFound(e),
        NvmlError::FailedToLoadSymbol(s) => {
            ErrorKind::NotSupported(format!("symbol missing from NVML: {s}"))
        }
        NvmlError::NotSupported => ErrorKind::NotSupported("NVML_ERROR_NOT_SUPPORTED".into()),
        NvmlError::InvalidArg => ErrorKind::InvalidArgument("NVML_ERROR_INVALID_ARGUMENT".into()),
        NvmlError::NoPermission => ErrorKind::NoPermission(e),
        NvmlError::NotFound => ErrorKind::NotFound("NVML_ERROR_NOT_FOUND".into()),
        NvmlError::InUse => ErrorKind::InUse("NVML_ERROR_IN_USE".into()),
        NvmlError::ResetRequired => {
            ErrorKind::NotSupported("NVML_ERROR_RESET_REQUIRED: reset the GPU or reboot".into())
        }
        NvmlError::UnexpectedVariant(23) => {
            ErrorKind::InsufficientResources("NVML_ERROR_INSUFFICIENT_RESOURCES".into())
        }
        other => ErrorKind::Driver(other),
    }
}

/// The NVML backend. Share it as `Arc<NvmlBackend>`.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    lock: Mutex<()>,
    events: broadcast::Sender<HealthEvent>,
    stop: Arc<AtomicBool>,
    health_started: Once,
    mps: mps::Mps,
    root: root::DriverRoot,
    /// The last good read of each GPU, by index.
    known: Mutex<std::collections::BTreeMap<u32, GpuInfo>>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn arch(a: DeviceArchitecture) -> Architecture {
    match a {
        DeviceArchitecture::Ampere => Architecture::Ampere,
        DeviceArchitecture::Ada => Architecture::Ada,
        DeviceArchitecture::Hopper => Architecture::Hopper,
        DeviceArchitecture::Blackwell => Architecture::Blackwell,
        _ => Architecture::Unknown,
    }
}

/// NVML GPU-instance profile indices that carry a name suffix (nvml.h).
fn suffix_for_index(index: u32) -> &'static str {
    match index {
        7 | 8 => "+me",       // *_REV1: the media-engine instance
        10..=12 => "+gfx",    // *_GFX
        13 | 14 => "-me",     // *_NO_ME
        15 | 16 => "+me.all", // *_ALL_ME
        _ => "",
    }
}

/// go-nvlib's name rule: GB = round(ceil(mig/total · 8) / 8 · ceil(total GiB)).
fn derived_name(compute: u32, memory_mib: u64, total_bytes: u64, suffix: &str) -> String {
    const GIB: u64 = 1 << 30;
    let total = total_bytes.max(1) as f64;
    let frac = ((memory_mib as f64) * (1u64 << 20) as f64 / total * 8.0).ceil() / 8.0;
    let gb = (frac * total_bytes.div_ceil(GIB) as f64).round() as u64;
    format!("{compute}g.{gb}gb{suffix}")
}

impl NvmlBackend {
    /// Loads the host's NVML (the dynamic loader's search).
    pub fn new() -> Result<Self, BackendError> {
        Self::with_driver_root(root::DriverRoot::default())
    }

    /// Loads NVML from the driver installed under `root` and runs that driver's tools
    /// (`nvidia-smi`, `nvidia-cuda-mps-control`) too.
    pub fn with_driver_root(root: root::DriverRoot) -> Result<Self, BackendError> {
        Self::load(Some(&root.library()), root)
    }

    /// Loads NVML from `path` (e.g. `/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1`);
    /// tools from `PATH`.
    pub fn with_library(path: Option<&OsStr>) -> Result<Self, BackendError> {
        Self::load(path, root::DriverRoot::default())
    }

    fn load(path: Option<&OsStr>, root: root::DriverRoot) -> Result<Self, BackendError> {
        let mut builder = Nvml::builder();
        builder.flags(InitFlags::NO_GPUS);
        if let Some(p) = path {
            builder.lib_path(p);
        }
        let nvml = builder
            .init()
            .map_err(|e| BackendError::new(None, Operation::Init, map_nvml(e)))?;
        let nvml = Arc::new(nvml);
        let (events, _) = broadcast::channel(256);
        let stop = Arc::new(AtomicBool::new(false));
        Ok(NvmlBackend {
            nvml,
            lock: Mutex::new(()),
            events,
            stop,
            health_started: Once::new(),
            mps: mps::Mps::new(root.tool(mps::MPS_CONTROL)),
            root,
            known: Mutex::default(),
        })
    }

    /// Runs the driver's `nvidia-smi` with `args` for `op` on GPU `gpu`.
    fn nvidia_smi(&self, gpu: u32, op: Operation, args: &str) -> Result<(), BackendError> {
        let err = |k| BackendError::new(gpu, op, k);
        let out = std::process::Command::new(self.root.tool("nvidia-smi"))
            .args(args.split(' '))
            .output()
            .map_err(|e| err(ErrorKind::io(format!("running nvidia-smi {args}"), e)))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(err(ErrorKind::NvidiaSmi {
                args: args.to_string(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }))
        }
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_device<T>(
        &self,
        gpu: u32,
        op: Operation,
        f: impl FnOnce(&Nvml, &Device<'_>) -> Result<T, ErrorKind>,
    ) -> Result<T, BackendError> {
        let _g = self.guard();
        let dev = self
            .nvml
            .device_by_index(gpu)
            .map_err(|e| BackendError::new(gpu, op, map_nvml(e)))?;
        f(&self.nvml, &dev).map_err(|k| BackendError::new(gpu, op, k))
    }

    fn info(&self, index: u32, dev: &Device<'_>) -> Result<GpuInfo, ErrorKind> {
        let product_name = dev.name().map_err(map_nvml)?;
        let mig = match dev.mig_mode() {
            Ok(m) => Some(m),
            Err(NvmlError::NotSupported) => None,
            Err(e) => return Err(map_nvml(e)),
        };
        let cc = dev.cuda_compute_capability().map_err(map_nvml)?;
        let compute_mode = match dev.compute_mode() {
            Ok(NvmlComputeMode::ExclusiveProcess) => ComputeMode::ExclusiveProcess,
            Ok(NvmlComputeMode::Prohibited) => ComputeMode::Prohibited,
            _ => ComputeMode::Default,
        };
        Ok(GpuInfo {
            index,
            uuid: dev.uuid().map_err(map_nvml)?,
            model: find_model(&product_name).ok().map(|m| m.id.clone()),
            memory_mib: dev.memory_info().map_err(map_nvml)?.total >> 20,
            architecture: dev
                .architecture()
                .map(arch)
                .unwrap_or(Architecture::Unknown),
            compute_capability: format!("{}.{}", cc.major, cc.minor),
            pci_bus_id: dev.pci_info().map_err(map_nvml)?.bus_id,
            minor_number: dev.minor_number().ok(),
            mig_capable: mig.is_some(),
            mig_enabled: mig.as_ref().is_some_and(|m| m.current == 1),

            mig_pending: mig.is_some_and(|m| m.pending == 1),
            compute_mode,
            driver_version: self.nvml.sys_driver_version().ok(),
            product_name,
        })
    }

    /// Reads the profiles and placements from the driver. Read-only.
    fn read_layout(nvml: &Nvml, dev: &Device<'_>) -> Result<Option<MigLayout>, ErrorKind> {
        let total_bytes = dev.memory_info().map_err(map_nvml)?.total;
        let mut profiles: Vec<MigProfile> = Vec::new();
        // NVML_GPU_INSTANCE_PROFILE_COUNT = 17 profile indices in nvml.h today.
        for index in 0..nvml_wrapper_sys::bindings::NVML_GPU_INSTANCE_PROFILE_COUNT {
            let Some(rp) = raw::profile_info(nvml, dev, index)? else {
                continue;
            };
            if profiles.iter().any(|p| p.profile_id == rp.id) {
                continue;
            }
            let placements = raw::possible_placements(nvml, dev, rp.id)?;
            let size = placements.first().map(|p| p.1).unwrap_or(0);
            let suffix = suffix_for_index(index);
            let name = rp
                .name
                .as_deref()
                .map(|n| n.trim_start_matches("MIG ").to_string())
                .unwrap_or_else(|| {
                    derived_name(rp.slice_count, rp.memory_mib, total_bytes, suffix)
                });
            let starts: Vec<u8> = placements
                .iter()
                .filter_map(|p| u8::try_from(p.0).ok())
                .collect();
            let [copy, decoders, encoders, jpeg, ofa] = rp.engines;
            profiles.push(MigProfile {
                name,
                profile_id: rp.id,
                compute_slices: u8::try_from(rp.slice_count).unwrap_or(u8::MAX),
                memory_slices: u8::try_from(size).unwrap_or(u8::MAX),
                memory_mib: rp.memory_mib,
                sm_count: rp.multiprocessor_count,
                max_instances: u8::try_from(rp.instance_count).unwrap_or(u8::MAX),
                starts: StartSet::from_starts(&starts),
                media_extension: suffix.starts_with("+me"),
                engines: Engines {
                    copy,
                    decoders,
                    encoders,
                    jpeg,
                    ofa,
                },
            });
        }
        if profiles.is_empty() {
            return Ok(None);
        }
        // NVML lists by profile index (REV1/REV2 profiles last); print and publish in the
        // catalogue's order: smallest first, a `+me` right after its plain twin.
        profiles.sort_by_key(|p| {
            (
                p.compute_slices,
                p.memory_slices,
                p.media_extension,
                p.profile_id,
            )
        });
        let memory_slices = profiles
            .iter()
            .map(|p| {
                p.starts
                    .iter()
                    .map(|s| s + p.memory_slices)
                    .max()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        Ok(Some(MigLayout {
            compute_slices: profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0),
            memory_slices,
            max_gpu_instances: profiles.iter().map(|p| p.max_instances).max().unwrap_or(0),
            profiles,
        }))
    }
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let _g = self.guard();
        let err = |k| BackendError::new(None, Operation::ListGpus, k);
        let count = self.nvml.device_count().map_err(|e| err(map_nvml(e)))?;
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        Ok((0..count)
            .map(|i| {
                let read = self
                    .nvml
                    .device_by_index(i)
                    .map_err(map_nvml)
                    .and_then(|dev| self.info(i, &dev));
                match read {
                    Ok(info) => {
                        known.insert(i, info.clone());
                        info
                    }
                    // A GPU that fell off the bus answers nothing, not even its handle:
                    // the node's other GPUs must still be listed. What this process read
                    // of it before stands; else it is listed without identity (an empty
                    // UUID), and every operation on it fails.
                    Err(e) => {
                        tracing::warn!(gpu = i, error = %crate::backend::chain(&e), "cannot read the GPU");
                        known
                            .get(&i)
                            .cloned()
                            .unwrap_or_else(|| GpuInfo::unreadable(i))
                    }
                }
            })
            .collect())
    }

    fn mig_layout(&self, gpu: u32) -> Result<Option<MigLayout>, BackendError> {
        self.with_device(gpu, Operation::ReadMigLayout, |nvml, dev| {
            match dev.mig_mode() {
                Err(NvmlError::NotSupported) => Ok(None),
                _ => Self::read_layout(nvml, dev),
            }
        })
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeChange, BackendError> {
        self.with_device(gpu, Operation::SetMigMode, |_, dev| {
            dev.set_mig_mode(enabled).map_err(map_nvml)?;
            let m = dev.mig_mode().map_err(map_nvml)?;
            Ok(MigModeChange {
                current: m.current == 1,
                pending: m.pending == 1,
                reset_required: m.current != m.pending,
            })
        })
    }

    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        // NVML has no public reset call; `nvidia-smi --gpu-reset` is what mig-parted runs.
        // It refuses while any process uses the GPU, which the caller has made sure of.
        let _g = self.guard();
        self.nvidia_smi(gpu, Operation::ResetGpu, &format!("--gpu-reset -i {gpu}"))
    }

    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.with_device(gpu, Operation::ListInstances, |nvml, dev| {
            if dev.mig_mode().map(|m| m.current != 1).unwrap_or(true) {
                return Ok(Vec::new());
            }
            let Some(layout) = Self::read_layout(nvml, dev)? else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            for p in &layout.profiles {
                for gi in raw::gpu_instances(nvml, dev, p.profile_id, u32::from(p.max_instances))? {
                    out.push(MigInstance {
                        gpu,
                        gpu_instance_id: gi.id,
                        profile_id: gi.profile_id,
                        profile_name: p.name.clone(),
                        start: u8::try_from(gi.start).unwrap_or(u8::MAX),
                        size: u8::try_from(gi.size).unwrap_or(u8::MAX),
                        compute_instances: gi
                            .cis
                            .into_iter()
                            .map(|c| ComputeInstance {
                                id: c.id,
                                uuid: c.uuid,
                            })
                            .collect(),
                    });
                }
            }
            out.sort_by_key(|i| (i.start, i.gpu_instance_id));
            Ok(out)
        })
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        self.with_device(gpu, Operation::CreateGpuInstance, |nvml, dev| {
            let layout = Self::read_layout(nvml, dev)?
                .ok_or_else(|| ErrorKind::NotSupported("GPU has no MIG".into()))?;
            let p = layout.profile(profile_id).ok_or_else(|| {
                ErrorKind::InvalidArgument(format!("unknown profile id {profile_id}"))
            })?;
            let gi = raw::create_gpu_instance(
                nvml,
                dev,
                profile_id,
                u32::from(start),
                u32::from(p.memory_slices),
            )?;
            Ok(MigInstance {
                gpu,
                gpu_instance_id: gi.id,
                profile_id,
                profile_name: p.name.clone(),
                start,
                size: p.memory_slices,
                compute_instances: Vec::new(),
            })
        })
    }

    fn create_compute_instance(&self, gpu: u32, gi: u32) -> Result<MigInstance, BackendError> {
        let inst = self
            .mig_instances(gpu)?
            .into_iter()
            .find(|i| i.gpu_instance_id == gi)
            .ok_or_else(|| {
                BackendError::new(
                    gpu,
                    Operation::CreateComputeInstance,
                    ErrorKind::NotFound(format!("no GPU instance {gi}")),
                )
            })?;
        self.with_device(gpu, Operation::CreateComputeInstance, |nvml, dev| {
            let layout = Self::read_layout(nvml, dev)?
                .ok_or_else(|| ErrorKind::NotSupported("GPU has no MIG".into()))?;
            let slices = layout
                .profile(inst.profile_id)
                .map(|p| u32::from(p.compute_slices))
                .unwrap_or(0);
            let ci = raw::create_compute_instance(nvml, dev, gi, slices)?;
            let mut inst = inst;
            inst.compute_instances.push(ComputeInstance {
                id: ci.id,
                uuid: ci.uuid,
            });
            Ok(inst)
        })
    }

    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError> {
        self.with_device(gpu, Operation::DestroyComputeInstance, |nvml, dev| {
            raw::destroy_compute_instance(nvml, dev, gi, ci)
        })
    }

    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        self.with_device(gpu, Operation::DestroyGpuInstance, |nvml, dev| {
            raw::destroy_gpu_instance(nvml, dev, gi)
        })
    }

    fn start_mps(&self, gpu: u32, config: &MpsDaemonConfig) -> Result<MpsState, BackendError> {
        let uuid = self.with_device(gpu, Operation::StartMps, |_, dev| {
            dev.uuid().map_err(map_nvml)
        })?;
        self.mps
            .start(gpu, &uuid, config)
            .map_err(|k| BackendError::new(gpu, Operation::StartMps, k))
    }

    fn stop_mps(&self, gpu: u32, config: &MpsDaemonConfig) -> Result<(), BackendError> {
        self.mps
            .stop(config)
            .map_err(|k| BackendError::new(gpu, Operation::StopMps, k))
    }

    fn mps_state(&self, gpu: u32, pipe_dir: &Path) -> Result<MpsState, BackendError> {
        self.mps
            .state(gpu, pipe_dir)
            .map_err(|k| BackendError::new(gpu, Operation::MpsState, k))
    }

    fn mps_daemons(&self, gpu: u32) -> Result<Vec<PathBuf>, BackendError> {
        Ok(self.mps.daemons(gpu))
    }

    fn mps_known_running(&self, _gpu: u32, pipe_dir: &Path) -> bool {
        self.mps.known_running(pipe_dir)
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError> {
        let _g = self.guard();
        let err = |k| BackendError::new(gpu, Operation::SetComputeMode, k);
        let mut dev = self
            .nvml
            .device_by_index(gpu)
            .map_err(|e| err(map_nvml(e)))?;
        {
            let m = match mode {
                ComputeMode::Default => NvmlComputeMode::Default,
                ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
                ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
            };
            dev.set_compute_mode(m).map_err(|e| err(map_nvml(e)))
        }
    }

    fn set_time_slice(&self, gpu: u32, slice: TimeSlice) -> Result<(), BackendError> {
        let _g = self.guard();
        // NVML has no public call for it: `nvidia-smi compute-policy` is what NVIDIA's own
        // DRA driver runs too.
        self.nvidia_smi(
            gpu,
            Operation::SetTimeSlice,
            &format!("compute-policy -i {gpu} --set-timeslice={}", slice.level()),
        )
    }

    fn health_events(&self) -> broadcast::Receiver<HealthEvent> {
        // The watcher starts with the first subscriber, so read-only uses of the backend
        // (`kubectl tessera gpus --backend nvml`) register nothing with the driver.
        let rx = self.events.subscribe();
        self.health_started.call_once(|| {
            health::spawn(self.nvml.clone(), self.events.clone(), self.stop.clone());
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nvml_library_is_one_clear_error_not_a_panic() {
        let err = NvmlBackend::with_library(Some(OsStr::new("/nonexistent/libnvidia-ml.so.1")))
            .err()
            .expect("loading a missing library must fail");
        assert_eq!(err.operation, Operation::Init);
        assert!(matches!(err.kind, ErrorKind::LibraryNotFound(_)), "{err}");
        assert!(err.to_string().contains("libnvidia-ml.so.1"), "{err}");
        // dlopen's own message comes once, as the source.
        let chain = crate::backend::chain(&err);
        assert_eq!(
            chain.matches("/nonexistent/libnvidia-ml.so.1").count(),
            1,
            "{chain}"
        );
    }

    #[test]
    fn derived_profile_names_follow_go_nvlib() {
        // A100-40GB: 40960 MiB board, 4864 MiB 1g → 1g.5gb; 9856 MiB → 2g.10gb.
        let total = 40960u64 << 20;
        assert_eq!(derived_name(1, 4864, total, ""), "1g.5gb");
        assert_eq!(derived_name(1, 4864, total, "+me"), "1g.5gb+me");
        assert_eq!(derived_name(2, 9856, total, ""), "2g.10gb");
        assert_eq!(derived_name(7, 40192, total, ""), "7g.40gb");
    }

    #[test]
    fn nvml_insufficient_resources_maps_to_our_kind() {
        assert!(matches!(
            map_nvml(NvmlError::UnexpectedVariant(23)),
            ErrorKind::InsufficientResources(_)
        ));
        assert!(matches!(map_nvml(NvmlError::InUse), ErrorKind::InUse(_)));
    }

    #[test]
    fn other_nvml_errors_are_the_source_and_are_printed_once() {
        let err = BackendError::new(
            0,
            Operation::CreateGpuInstance,
            map_nvml(NvmlError::Unknown),
        );
        assert!(matches!(&err.kind, ErrorKind::Driver(NvmlError::Unknown)));
        assert_eq!(
            crate::backend::chain(&err),
            format!(
                "create-gpu-instance on GPU 0: driver error: {}",
                NvmlError::Unknown
            )
        );
    }
}
