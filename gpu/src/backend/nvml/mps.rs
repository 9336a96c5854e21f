//! MPS control through `nvidia-cuda-mps-control` (`gpu-hardware.md` §8.1).
//!
//! One control daemon per GPU, each with its own pipe and log directory and
//! `CUDA_VISIBLE_DEVICES=<GPU UUID>`. The daemon runs in the foreground (`-f`) as a child
//! of the plugin so its pid is known; it keeps running if the plugin restarts, and the
//! state check asks the daemon itself (`get_server_list` on its pipe directory), so a
//! restarted plugin that calls [`Mps::start`] again with the same configuration adopts it.

use std::{
    collections::HashMap,
    io::Write,
    process::{Command, Stdio},
    sync::Mutex,
};

use crate::backend::{ErrorKind, MpsDaemonConfig, MpsState};

/// The control binary, found on `PATH`.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// Known daemons, by GPU index.
#[derive(Default)]
pub struct Mps {
    daemons: Mutex<HashMap<u32, (MpsDaemonConfig, u32)>>,
}

fn control(config: &MpsDaemonConfig, command: &str) -> Result<String, ErrorKind> {
    let mut child = Command::new(MPS_CONTROL)
        .env("CUDA_MPS_PIPE_DIRECTORY", &config.pipe_dir)
        .env("CUDA_MPS_LOG_DIRECTORY", &config.log_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ErrorKind::io(format!("running {MPS_CONTROL}"), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        writeln!(stdin, "{command}")
            .map_err(|e| ErrorKind::io(format!("sending {command:?} to {MPS_CONTROL}"), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| ErrorKind::io(format!("waiting for {MPS_CONTROL} {command:?}"), e))?;
    if !out.status.success() {
        return Err(ErrorKind::MpsControl {
            command: command.to_string(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Mps {
    /// Starts (or adopts) the daemon of GPU `gpu` with UUID `uuid`.
    pub fn start(
        &self,
        gpu: u32,
        uuid: &str,
        config: &MpsDaemonConfig,
    ) -> Result<MpsState, ErrorKind> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((c, pid)) = daemons.get(&gpu) {
            if c == config && control(config, "get_server_list").is_ok() {
                return Ok(MpsState::Running {
                    pid: *pid,
                    config: c.clone(),
                });
            }
            if c != config {
                return Err(ErrorKind::InUse(
                    "MPS is running with another configuration; stop it first".into(),
                ));
            }
        }
        for dir in [&config.pipe_dir, &config.log_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| ErrorKind::io(format!("creating {}", dir.display()), e))?;
        }
        let child = Command::new(MPS_CONTROL)
            .arg("-f")
            .env("CUDA_VISIBLE_DEVICES", uuid)
            .env("CUDA_MPS_PIPE_DIRECTORY", &config.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &config.log_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| ErrorKind::io(format!("starting {MPS_CONTROL} -f"), e))?;
        let pid = child.id();
        // The daemon must outlive a plugin restart, so the child is not waited for here.
        drop(child);
        // The control socket appears asynchronously; retry briefly, then report why the
        // last try failed.
        let mut tries = 1;
        while let Err(e) = control(config, "get_server_list") {
            if tries == 50 {
                return Err(e);
            }
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if let Some(p) = config.default_active_thread_percentage {
            control(config, &format!("set_default_active_thread_percentage {p}"))?;
        }
        if let Some(m) = config.default_pinned_memory_limit_mib {
            // Device 0 is the only device the daemon sees (CUDA_VISIBLE_DEVICES=<uuid>).
            control(
                config,
                &format!("set_default_device_pinned_mem_limit 0 {m}M"),
            )?;
        }
        daemons.insert(gpu, (config.clone(), pid));
        Ok(MpsState::Running {
            pid,
            config: config.clone(),
        })
    }

    /// Stops the daemon of GPU `gpu` (idempotent).
    pub fn stop(&self, gpu: u32) -> Result<(), ErrorKind> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((config, _)) = daemons.get(&gpu) {
            // "quit" fails when the daemon is already gone: that is the goal anyway.
            let _ = control(config, "quit");
        }
        daemons.remove(&gpu);
        Ok(())
    }

    /// Whether the daemon of GPU `gpu` answers.
    pub fn state(&self, gpu: u32) -> Result<MpsState, ErrorKind> {
        let daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match daemons.get(&gpu) {
            Some((config, pid)) if control(config, "get_server_list").is_ok() => {
                MpsState::Running {
                    pid: *pid,
                    config: config.clone(),
                }
            }
            _ => MpsState::Stopped,
        })
    }
}
