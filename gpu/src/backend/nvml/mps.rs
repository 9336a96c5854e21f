//! MPS control through `nvidia-cuda-mps-control` (`gpu-hardware.md` §8.1).
//!
//! One control daemon per GPU, each with its own pipe and log directory and
//! `CUDA_VISIBLE_DEVICES=<GPU UUID>`. The daemon runs in the foreground (`-f`) as a child
//! of the plugin so its pid is known; it keeps running if the plugin restarts. The state
//! check reads that process in `/proc`, else asks the daemon itself (`get_server_list` on
//! its pipe directory), so a restarted plugin that calls [`Mps::start`] again with the
//! same configuration adopts it.

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
};

use crate::backend::{ErrorKind, MpsDaemonConfig, MpsState};

/// The control binary, found on `PATH`.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// How long a new daemon has to answer on its control pipe before its start is reported
/// failed.
const MPS_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Known daemons, by GPU index.
pub struct Mps {
    /// The control binary of the driver in use.
    binary: PathBuf,
    daemons: Mutex<HashMap<u32, (MpsDaemonConfig, u32)>>,
}

fn control(binary: &Path, config: &MpsDaemonConfig, command: &str) -> Result<String, ErrorKind> {
    let mut child = Command::new(binary)
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
    /// Daemons run with `binary` (`nvidia-cuda-mps-control` of the driver in use).
    pub fn new(binary: PathBuf) -> Self {
        Mps {
            binary,
            daemons: Mutex::default(),
        }
    }

    /// Starts (or adopts) the daemon of GPU `gpu` with UUID `uuid`.
    pub fn start(
        &self,
        gpu: u32,
        uuid: &str,
        config: &MpsDaemonConfig,
    ) -> Result<MpsState, ErrorKind> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((c, pid)) = daemons.get(&gpu) {
            if c == config && answers(&self.binary, config, *pid) {
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
        let mut child = Command::new(&self.binary)
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
        // The control socket appears asynchronously, usually within milliseconds: ask
        // again after a pause that starts short and grows, so a daemon a little slow to
        // answer costs a prepare (and every prepare waiting for the GPU) a few
        // milliseconds, not a whole long pause; past the deadline, report why the last
        // try failed. A daemon that exits instead (another one holds the pipe directory,
        // the GPU refuses MPS) says why in its log, not on a terminal.
        let deadline = std::time::Instant::now() + MPS_START_TIMEOUT;
        let mut pause = std::time::Duration::from_millis(2);
        while let Err(e) = control(&self.binary, config, "get_server_list") {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(ErrorKind::MpsControl {
                    command: "-f".into(),
                    status,
                    stderr: last_log_line(&config.log_dir),
                });
            }
            if std::time::Instant::now() >= deadline {
                return Err(e);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
        // The daemon must outlive a plugin restart, so the child is not waited for; one
        // that exited because another daemon already answers is reaped here.
        let _ = child.try_wait();
        drop(child);
        if let Some(p) = config.default_active_thread_percentage {
            control(
                &self.binary,
                config,
                &format!("set_default_active_thread_percentage {p}"),
            )?;
        }
        if let Some(m) = config.default_pinned_memory_limit_mib {
            // Device 0 is the only device the daemon sees (CUDA_VISIBLE_DEVICES=<uuid>).
            control(
                &self.binary,
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
            let _ = control(&self.binary, config, "quit");
        }
        daemons.remove(&gpu);
        Ok(())
    }

    /// Whether the daemon of GPU `gpu` is the one this plugin started and is alive: a
    /// `/proc` read, no process start. `false` for an adopted daemon, which only
    /// [`Mps::state`] can check, and while another call holds the daemons (a start or a
    /// check runs processes under the lock, for seconds at worst): this is called on the
    /// async runtime's worker, which must not wait for them.
    pub fn known_running(&self, gpu: u32) -> bool {
        let daemons = match self.daemons.try_lock() {
            Ok(d) => d,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        daemons.get(&gpu).is_some_and(|(_, pid)| alive(*pid))
    }

    /// Whether the daemon of GPU `gpu` answers.
    pub fn state(&self, gpu: u32) -> Result<MpsState, ErrorKind> {
        let daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match daemons.get(&gpu) {
            Some((config, pid)) if answers(&self.binary, config, *pid) => MpsState::Running {
                pid: *pid,
                config: config.clone(),
            },
            _ => MpsState::Stopped,
        })
    }
}

/// Whether the daemon started as `pid` with `config` is there: alive by `/proc` when that
/// process is the daemon, else by asking it (`get_server_list`). Every MPS prepare checks
/// its GPU's daemon, and asking costs a process start each time; the daemon this plugin
/// started is its own child, so its process state says as much. A daemon adopted after a
/// restart is not the child that was started (that one exited, finding the pipe
/// directory taken), so it is asked.
fn answers(binary: &Path, config: &MpsDaemonConfig, pid: u32) -> bool {
    alive(pid) || control(binary, config, "get_server_list").is_ok()
}

/// Whether `pid` is a live control daemon, by `/proc`.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| is_live_daemon(&stat))
}

/// Whether a `/proc/<pid>/stat` line is a running (not exited, not a zombie) control
/// daemon. The kernel keeps the first 15 bytes of the program's name.
fn is_live_daemon(stat: &str) -> bool {
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let state = stat[close + 1..].trim_start().chars().next();
    !comm.is_empty()
        && MPS_CONTROL.starts_with(comm)
        && state.is_some_and(|s| !matches!(s, 'Z' | 'X' | 'x'))
}

/// The last line of the daemon's `control.log`, where MPS writes why it stopped.
fn last_log_line(log_dir: &Path) -> String {
    std::fs::read_to_string(log_dir.join("control.log"))
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn a_running_control_daemon_is_live_and_an_exited_or_foreign_process_is_not() {
        assert!(is_live_daemon("4242 (nvidia-cuda-mps) S 1 4242 4242 0 -1"));
        assert!(is_live_daemon("4242 (nvidia-cuda-mps) R 1 4242 4242 0 -1"));
        assert!(!is_live_daemon("4242 (nvidia-cuda-mps) Z 1 4242 4242 0 -1"));
        assert!(!is_live_daemon("4242 (nvidia-cuda-mps) X 1 4242 4242 0 -1"));
        assert!(!is_live_daemon("4242 (sleep) S 1 4242 4242 0 -1"));
        assert!(!is_live_daemon("4242 () S 1"));
        assert!(!is_live_daemon(""));
    }

    /// A process under the control binary's name: alive (and, as the daemon this plugin
    /// started, known to run without asking) while it runs, not once it has exited (a
    /// zombie until reaped, then gone), whatever the binary would answer.
    #[test]
    fn the_daemon_started_is_alive_by_its_process_until_it_exits() {
        let dir = tempfile::tempdir().expect("temp dir");
        let daemon = dir.path().join(MPS_CONTROL);
        std::fs::copy("/bin/sleep", &daemon).expect("copying sleep");
        // Asking fails: `false` stands in for a control binary whose daemon does not answer.
        let refuses = Path::new("/bin/false");
        let config = MpsDaemonConfig {
            pipe_dir: dir.path().join("pipe"),
            log_dir: dir.path().join("log"),
            default_active_thread_percentage: None,
            default_pinned_memory_limit_mib: None,
        };
        let mut child = spawn_copied(&daemon);
        assert!(answers(refuses, &config, child.id()));
        // Known to run without asking, as the daemon this plugin started; a GPU without
        // one is not.
        let mps = Mps::new(refuses.to_path_buf());
        mps.daemons
            .lock()
            .expect("lock")
            .insert(0, (config.clone(), child.id()));
        assert!(mps.known_running(0));
        assert!(!mps.known_running(1));
        {
            // Another call holding the daemons (a start running processes): not known,
            // rather than waiting.
            let _held = mps.daemons.lock().expect("lock");
            assert!(!mps.known_running(0));
        }
        assert!(mps.known_running(0));
        child.kill().expect("killing");
        // Not reaped yet: a zombie.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while answers(refuses, &config, child.id()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the killed process still counts"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        child.wait().expect("reaping");
        assert!(!answers(refuses, &config, child.id()));
        assert!(!mps.known_running(0));
    }

    /// Starts the binary just copied to `path`. Another test thread forking while the copy
    /// was open for writing leaves its child holding it until that child execs, and exec
    /// refuses a file open for writing ("text file busy"): retry until that child is gone.
    fn spawn_copied(path: &Path) -> std::process::Child {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match Command::new(path).arg("30").spawn() {
                Err(e)
                    if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::yield_now();
                }
                other => return other.expect("spawning"),
            }
        }
    }
}
