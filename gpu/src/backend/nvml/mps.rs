//! MPS control through `nvidia-cuda-mps-control` (`gpu-hardware.md` §8.1).
//!
//! Several control daemons may serve one GPU, each on its own pipe directory (its
//! identity), with its own log directory, its own `/dev/shm` and its servers' limits in its
//! environment, and `CUDA_VISIBLE_DEVICES=<GPU UUID>`. A daemon runs in the foreground
//! (`-f`) as a child of the caller so its pid is known. With a shared-memory directory, the
//! daemon runs in a mount namespace of its own where that directory, a tmpfs, is
//! `/dev/shm`: MPS server and clients communicate through shared memory there as well as
//! through the pipe directory, and the clients get the same tmpfs as their `/dev/shm`
//! (`containers.md` §4.1). The state check reads the daemon's process in `/proc`, else
//! asks the daemon itself (`get_server_list` on its pipe directory), so a restarted
//! caller that asks again with the same configuration adopts it.

// The daemon's mount namespace is set up between fork and exec (`pre_exec`).
#![allow(unsafe_code)]

use std::{
    collections::HashMap,
    ffi::CString,
    io::Write,
    os::unix::{ffi::OsStrExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
};

use rustix::mount::{MountFlags, MountPropagationFlags};

use crate::backend::{ErrorKind, MpsDaemonConfig, MpsState};

/// The control binary, found on `PATH`.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// How long a new daemon has to answer on its control pipe before its start is reported
/// failed.
const MPS_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The tmpfs behind a daemon's `/dev/shm`: at most half the node's memory, as NVIDIA's
/// DRA driver sizes it; pages are used only as the server and clients write them.
const SHM_OPTIONS: &std::ffi::CStr = c"size=50%,mode=1777";

/// A known daemon: its configuration and pid.
type Known = (MpsDaemonConfig, u32, u32);

/// Known daemons, by pipe directory.
pub struct Mps {
    /// The control binary of the driver in use.
    binary: PathBuf,
    daemons: Mutex<HashMap<PathBuf, Known>>,
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

/// A path as the C string a syscall takes, made before fork: the child may not allocate.
fn c_path(path: &Path) -> Result<CString, ErrorKind> {
    CString::new(path.as_os_str().as_bytes()).map_err(|e| {
        ErrorKind::io(
            format!("the path {} for a mount", path.display()),
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        )
    })
}

/// Whether `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(here), Some(Ok(parent))) =
        (std::fs::metadata(dir), dir.parent().map(std::fs::metadata))
    else {
        return false;
    };
    here.dev() != parent.dev()
}

/// Mounts the tmpfs a daemon and its clients share as `/dev/shm` on `dir`, unless one is
/// there (a daemon adopted after a restart keeps its own).
fn mount_shm(dir: &Path) -> Result<(), ErrorKind> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ErrorKind::io(format!("creating {}", dir.display()), e))?;
    if is_mount_point(dir) {
        return Ok(());
    }
    rustix::mount::mount(
        "tessera-mps-shm",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        SHM_OPTIONS,
    )
    .map_err(|e| ErrorKind::io(format!("mounting a tmpfs on {}", dir.display()), e.into()))
}

/// Unmounts the shared-memory tmpfs of a stopped daemon; nothing mounted is fine.
pub fn unmount_shm(dir: &Path) -> Result<(), ErrorKind> {
    if !is_mount_point(dir) {
        return Ok(());
    }
    rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
        ErrorKind::io(
            format!("unmounting the tmpfs on {}", dir.display()),
            e.into(),
        )
    })
}

/// The daemon's command: its environment, and with a shared-memory directory, a mount
/// namespace of its own where that directory is `/dev/shm`.
fn daemon_command(
    binary: &Path,
    uuid: &str,
    config: &MpsDaemonConfig,
) -> Result<Command, ErrorKind> {
    let mut cmd = Command::new(binary);
    cmd.arg("-f")
        .env("CUDA_VISIBLE_DEVICES", uuid)
        .env("CUDA_MPS_PIPE_DIRECTORY", &config.pipe_dir)
        .env("CUDA_MPS_LOG_DIRECTORY", &config.log_dir)
        .env_remove(crate::mps::ENV_ACTIVE_THREAD_PERCENTAGE)
        .env_remove(crate::mps::ENV_PINNED_DEVICE_MEM_LIMIT)
        .envs(config.limit_env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(shm) = &config.shm_dir {
        let (shm, dev_shm, root) = (
            c_path(shm)?,
            c_path(Path::new("/dev/shm"))?,
            c_path(Path::new("/"))?,
        );
        // SAFETY: between fork and exec the closure makes three system calls through
        // rustix on C strings made before the fork; it allocates nothing and touches no
        // lock, so it is async-signal-safe. Unsharing the mount namespace (not the file
        // table) affects only the child.
        unsafe {
            cmd.pre_exec(move || {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
                // Nothing mounted here reaches the caller's namespace.
                rustix::mount::mount_change(
                    root.as_c_str(),
                    MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
                )?;
                rustix::mount::mount_bind(shm.as_c_str(), dev_shm.as_c_str())?;
                Ok(())
            });
        }
    }
    Ok(cmd)
}

impl Mps {
    /// Daemons run with `binary` (`nvidia-cuda-mps-control` of the driver in use).
    pub fn new(binary: PathBuf) -> Self {
        Mps {
            binary,
            daemons: Mutex::default(),
        }
    }

    /// Starts (or adopts) the daemon `config` describes for GPU `gpu` with UUID `uuid`.
    pub fn start(
        &self,
        gpu: u32,
        uuid: &str,
        config: &MpsDaemonConfig,
    ) -> Result<MpsState, ErrorKind> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((c, pid, _)) = daemons.get(&config.pipe_dir).cloned()
            && answers(&self.binary, &c, pid)
        {
            // One adopted by asking (pid 0) had no known configuration: it is the caller's.
            if c != *config && pid != 0 {
                return Err(ErrorKind::InUse(format!(
                    "an MPS control daemon with another configuration runs on {}; stop it first",
                    config.pipe_dir.display()
                )));
            }
            daemons.insert(config.pipe_dir.clone(), (config.clone(), pid, gpu));
            return Ok(MpsState::Running {
                pid,
                config: config.clone(),
            });
        }
        for dir in [&config.pipe_dir, &config.log_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| ErrorKind::io(format!("creating {}", dir.display()), e))?;
        }
        if let Some(shm) = &config.shm_dir {
            mount_shm(shm)?;
        }
        // One that answers already (started before the caller restarted) is adopted: a
        // second would refuse the pipe directory anyway.
        if control(&self.binary, config, "get_server_list").is_ok() {
            daemons.insert(config.pipe_dir.clone(), (config.clone(), 0, gpu));
            return Ok(MpsState::Running {
                pid: 0,
                config: config.clone(),
            });
        }
        let mut child = daemon_command(&self.binary, uuid, config)?
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
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
        // The daemon must outlive a restart of its caller, so nothing waits for it to
        // exit but a thread that reaps it when it does (a quit, a crash): a dead daemon
        // left a zombie would read as alive to a `kill -0`, and zombies would pile up.
        if let Err(e) = std::thread::Builder::new()
            .name("mps-reaper".into())
            .spawn(move || child.wait())
        {
            tracing::warn!(error = %e, "no thread to reap the MPS control daemon when it exits");
        }
        daemons.insert(config.pipe_dir.clone(), (config.clone(), pid, gpu));
        Ok(MpsState::Running {
            pid,
            config: config.clone(),
        })
    }

    /// Stops the daemon `config` describes and unmounts its shared memory (idempotent,
    /// also for a daemon started before the caller restarted).
    pub fn stop(&self, config: &MpsDaemonConfig) -> Result<(), ErrorKind> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        // "quit" fails when the daemon is already gone: that is the goal anyway.
        let _ = control(&self.binary, config, "quit");
        if let Some(shm) = &config.shm_dir {
            unmount_shm(shm)?;
        }
        daemons.remove(&config.pipe_dir);
        Ok(())
    }

    /// Whether the daemon on `pipe_dir` is the one this caller started and is alive: a
    /// `/proc` read, no process start. `false` for an adopted daemon, which only
    /// [`Mps::state`] can check, and while another call holds the daemons (a start or a
    /// check runs processes under the lock, for seconds at worst): this is called on the
    /// async runtime's worker, which must not wait for them.
    pub fn known_running(&self, pipe_dir: &Path) -> bool {
        let daemons = match self.daemons.try_lock() {
            Ok(d) => d,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        daemons
            .get(pipe_dir)
            .is_some_and(|(_, pid, _)| *pid != 0 && alive(*pid))
    }

    /// Whether the daemon on `pipe_dir` answers; one that answers and was not known (a
    /// caller restarted) is adopted.
    pub fn state(&self, gpu: u32, pipe_dir: &Path) -> Result<MpsState, ErrorKind> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((config, pid, _)) = daemons.get(pipe_dir) {
            return Ok(if answers(&self.binary, config, *pid) {
                MpsState::Running {
                    pid: *pid,
                    config: config.clone(),
                }
            } else {
                MpsState::Stopped
            });
        }
        let config = MpsDaemonConfig {
            pipe_dir: pipe_dir.to_path_buf(),
            log_dir: pipe_dir.with_file_name("log"),
            ..MpsDaemonConfig::default()
        };
        if control(&self.binary, &config, "get_server_list").is_err() {
            return Ok(MpsState::Stopped);
        }
        daemons.insert(pipe_dir.to_path_buf(), (config.clone(), 0, gpu));
        Ok(MpsState::Running { pid: 0, config })
    }

    /// The pipe directories of the daemons known on `gpu`.
    pub fn daemons(&self, gpu: u32) -> Vec<PathBuf> {
        let daemons = self.daemons.lock().unwrap_or_else(|p| p.into_inner());
        daemons
            .iter()
            .filter(|(_, (_, _, g))| *g == gpu)
            .map(|(p, _)| p.clone())
            .collect()
    }
}

/// Whether the daemon started as `pid` with `config` is there: alive by `/proc` when that
/// process is the daemon, else by asking it (`get_server_list`). Every MPS prepare checks
/// its GPU's daemon, and asking costs a process start each time; the daemon this plugin
/// started is its own child, so its process state says as much. A daemon adopted after a
/// restart is not the child that was started (that one exited, finding the pipe
/// directory taken), so it is asked.
fn answers(binary: &Path, config: &MpsDaemonConfig, pid: u32) -> bool {
    (pid != 0 && alive(pid)) || control(binary, config, "get_server_list").is_ok()
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
            ..MpsDaemonConfig::default()
        };
        let mut child = spawn_copied(&daemon);
        assert!(answers(refuses, &config, child.id()));
        // Known to run without asking, as the daemon this plugin started; a GPU without
        // one is not.
        let mps = Mps::new(refuses.to_path_buf());
        mps.daemons
            .lock()
            .expect("lock")
            .insert(config.pipe_dir.clone(), (config.clone(), child.id(), 0));
        let elsewhere = dir.path().join("elsewhere");
        assert!(mps.known_running(&config.pipe_dir));
        assert!(!mps.known_running(&elsewhere));
        {
            // Another call holding the daemons (a start running processes): not known,
            // rather than waiting.
            let _held = mps.daemons.lock().expect("lock");
            assert!(!mps.known_running(&config.pipe_dir));
        }
        assert!(mps.known_running(&config.pipe_dir));
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
        assert!(!mps.known_running(&config.pipe_dir));
    }

    /// A daemon adopted by asking (its configuration unknown) that has since died is
    /// started again with the caller's configuration, not refused as "another
    /// configuration" (found by the fault campaign: a killed daemon was never restarted).
    #[test]
    fn a_dead_adopted_daemon_is_started_again_not_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = MpsDaemonConfig {
            pipe_dir: dir.path().join("pipe"),
            log_dir: dir.path().join("log"),
            default_active_thread_percentage: Some(25),
            ..MpsDaemonConfig::default()
        };
        // `false` stands in for a control binary: nothing answers, a daemon exits at once.
        let mps = Mps::new(PathBuf::from("/bin/false"));
        mps.daemons.lock().expect("lock").insert(
            config.pipe_dir.clone(),
            (
                MpsDaemonConfig {
                    pipe_dir: config.pipe_dir.clone(),
                    ..MpsDaemonConfig::default()
                },
                0,
                0,
            ),
        );
        let err = mps
            .start(0, "GPU-x", &config)
            .expect_err("the stand-in daemon exits");
        assert!(
            matches!(err, ErrorKind::MpsControl { ref command, .. } if command == "-f"),
            "{err:?}"
        );
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
