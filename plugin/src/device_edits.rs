//! The CDI edits of one prepared device: its own device nodes (a GPU's, or a MIG device's
//! GPU and capability nodes), an env naming it, and what its sharing needs (MPS: the limits,
//! the pipe directory and its mount). What every container of a claim needs besides (the
//! driver's files) is [`crate::driver_files::DriverFiles::common_edits`].

use std::path::{Path, PathBuf};

use tessera_gpu::mps;

use crate::{
    cdi::{ContainerEdits, Mount},
    checkpoint::{DeviceKind, DeviceRecord},
    driver_files::{DriverFiles, Error},
};

/// Where the MPS pipe directory appears inside containers.
pub const MPS_PIPE_IN_CONTAINER: &str = "/tmp/nvidia-mps";
/// Where the MPS daemon's shared memory appears inside containers.
pub const MPS_SHM_IN_CONTAINER: &str = "/dev/shm";
/// The env naming the device a container got (`GPU-…` or `MIG-…`).
pub const DEVICE_UUID_ENV: &str = "TESSERA_DEVICE_UUID";

/// What a device's edits depend on besides its record.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// The driver's files.
    pub files: &'a DriverFiles,
    /// Where the driver publishes MIG capabilities.
    pub caps_root: &'a Path,
    /// The GPU's minor number, if the driver reported one.
    pub minor: Option<u32>,
    /// The claim's MPS daemon's pipe directory on the host.
    pub mps_pipe_dir: &'a Path,
    /// The tmpfs the claim's MPS daemon has as `/dev/shm`, on the host.
    pub mps_shm_dir: &'a Path,
}

/// The edits of device `d`.
pub fn edits(d: &DeviceRecord, ctx: &Context<'_>) -> Result<ContainerEdits, Error> {
    let minor = ctx.minor.ok_or(Error::UnknownMinor { gpu: d.gpu })?;
    let mut edits = ContainerEdits::default();
    match &d.kind {
        DeviceKind::Gpu { uuid } | DeviceKind::TimeSlice { uuid } => {
            edits.extend(ctx.files.gpu_edits(minor)?);
            edits.env.push(format!("{DEVICE_UUID_ENV}={uuid}"));
        }
        DeviceKind::Mig {
            profile,
            start,
            size,
            created,
            ..
        } => {
            if let Some(m) = created {
                edits.extend(ctx.files.mig_edits(
                    ctx.caps_root,
                    minor,
                    m.gpu_instance_id,
                    m.compute_instance_id,
                )?);
                edits.env.push(format!("{DEVICE_UUID_ENV}={}", m.uuid));
            }
            edits.env.push(format!("TESSERA_MIG_PROFILE={profile}"));
            edits
                .env
                .push(format!("TESSERA_MIG_PLACEMENT={start}:{size}"));
        }
        // What a client needs to reach the claim's daemon: its pipe directory and the
        // shared memory its server uses, as NVIDIA's DRA driver binds them. No limit
        // variables: the limits are the server's, and a client's own could only lower
        // them (containers.md §4.3).
        DeviceKind::Mps { uuid, .. } => {
            edits.extend(ctx.files.gpu_edits(minor)?);
            edits.env.push(format!("{DEVICE_UUID_ENV}={uuid}"));
            edits.env.push(format!(
                "{}={MPS_PIPE_IN_CONTAINER}",
                mps::ENV_PIPE_DIRECTORY
            ));
            for (host, container) in [
                (ctx.mps_pipe_dir, MPS_PIPE_IN_CONTAINER),
                (ctx.mps_shm_dir, MPS_SHM_IN_CONTAINER),
            ] {
                edits.mounts.push(Mount {
                    host_path: PathBuf::from(host).display().to_string(),
                    container_path: container.into(),
                    options: ["rw", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
                });
            }
        }
    }
    Ok(edits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{checkpoint::MigIdentity, driver_files::tests::node_files};

    fn record(gpu: u32, kind: DeviceKind) -> DeviceRecord {
        DeviceRecord {
            request_names: vec![],
            pool: "n".into(),
            device: format!("gpu-{gpu}"),
            gpu,
            kind,
            share_id: None,
            cdi_device_ids: vec![],
        }
    }

    #[test]
    fn each_kind_gets_its_nodes_and_env() {
        let (_fs, files) = node_files();
        let caps = tempfile::tempdir().unwrap();
        let gi = caps.path().join("gpu0/mig/gi1");
        std::fs::create_dir_all(gi.join("ci0")).unwrap();
        std::fs::write(gi.join("access"), "DeviceFileMinor: 12\n").unwrap();
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 13\n").unwrap();
        let ctx = Context {
            files: &files,
            caps_root: caps.path(),
            minor: Some(0),
            mps_pipe_dir: Path::new("/var/lib/kubelet/plugins/gpu.tessera.dev/mps/c1-gpu0/pipe"),
            mps_shm_dir: Path::new("/var/lib/kubelet/plugins/gpu.tessera.dev/mps/c1-gpu0/shm"),
        };
        let gpu = edits(
            &record(
                0,
                DeviceKind::Gpu {
                    uuid: "GPU-a".into(),
                },
            ),
            &ctx,
        )
        .unwrap();
        assert_eq!(gpu.device_nodes[0].path, "/dev/nvidia0");
        assert_eq!(gpu.env, ["TESSERA_DEVICE_UUID=GPU-a"]);
        let mig = DeviceKind::Mig {
            profile_id: 19,
            profile: "1g.10gb".into(),
            start: 0,
            size: 1,
            created: Some(MigIdentity {
                gpu_instance_id: 1,
                compute_instance_id: 0,
                uuid: "MIG-b".into(),
            }),
            held: false,
        };
        let mig = edits(&record(0, mig), &ctx).unwrap();
        let paths: Vec<&str> = mig.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap12",
                "/dev/nvidia-caps/nvidia-cap13"
            ]
        );
        assert!(mig.env.contains(&"TESSERA_DEVICE_UUID=MIG-b".to_string()));
        let mps = DeviceKind::Mps {
            uuid: "GPU-a".into(),
            active_thread_percentage: 25,
            pinned_memory_limit_mib: 1024,
        };
        let mps = edits(&record(0, mps), &ctx).unwrap();
        assert!(
            mps.env
                .contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string())
        );
        let mounts: Vec<(&str, &str)> = mps
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                (
                    "/var/lib/kubelet/plugins/gpu.tessera.dev/mps/c1-gpu0/pipe",
                    "/tmp/nvidia-mps"
                ),
                (
                    "/var/lib/kubelet/plugins/gpu.tessera.dev/mps/c1-gpu0/shm",
                    "/dev/shm"
                )
            ]
        );
        // The limits are the server's: none in the client's environment.
        assert!(
            !mps.env
                .iter()
                .any(|e| e.starts_with("CUDA_MPS_ACTIVE") || e.starts_with("CUDA_MPS_PINNED"))
        );
        let no_minor = Context { minor: None, ..ctx };
        assert!(matches!(
            edits(
                &record(
                    3,
                    DeviceKind::Gpu {
                        uuid: "GPU-c".into()
                    }
                ),
                &no_minor
            ),
            Err(Error::UnknownMinor { gpu: 3 })
        ));
    }
}
