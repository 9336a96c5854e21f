//! The simulated driver's `nvidia-cuda-mps-control`: the control daemon (`-f`) and its
//! client (commands on stdin), speaking over `$CUDA_MPS_PIPE_DIRECTORY/control` as the
//! real pair does. The daemon's existence and limits live in the simulated hardware, so
//! the simulator's MPS rules (no MPS on a time-sliced GPU) apply to the real control
//! path, and a "reboot" of the simulated node (which forgets the daemon) ends it.
//!
//! Commands: `get_server_list`, `set_default_active_thread_percentage <p>`,
//! `set_default_device_pinned_mem_limit <dev> <n>M|G`, `quit`. The daemon writes
//! `control.log` in `$CUDA_MPS_LOG_DIRECTORY`, where the real one says why it stopped.
//!
//! The rules the real pair follows and the simulated one enforces (`containers.md` §4):
//! - The daemon's servers take their limits from the daemon: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
//!   and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` in its environment are its defaults, which
//!   `set_default_*` commands change. A client's own variables only lower them.
//! - Server and clients share memory in `/dev/shm` as well as the pipe directory: the
//!   daemon leaves a segment in its `/dev/shm`, and a client that does not see it there
//!   cannot connect (`CUDA_ERROR_MPS_CONNECTION_FAILED`).
//! - Clients learn their server through `sim_client_attach`, a request of this simulation
//!   standing in for MPS's private client protocol; once the daemon is gone, its clients'
//!   calls fail (`CUDA_ERROR_MPS_RPC_FAILURE`).

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    time::Duration,
};

use tessera_gpu::backend::{BackendError, GpuBackend, MpsDaemonConfig, chain};

use crate::root::SimRoot;

/// The control socket's name in the pipe directory.
pub const SOCKET: &str = "control";
/// How often the daemon checks that the hardware still knows it.
const WATCH: Duration = Duration::from_millis(500);

/// The environment both halves read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Env {
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log_dir: PathBuf,
    /// `CUDA_VISIBLE_DEVICES`: the GPU UUID the daemon serves.
    pub visible_devices: Option<String>,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: a daemon's default, a client's own lower limit.
    pub thread_percentage: Option<u8>,
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, in MiB: likewise.
    pub pinned_memory_mib: Option<u64>,
}

/// The MiB of a `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` value (`0=4096M`, `GPU-…=2G`, or a bare
/// `4096M`; the first device's, as the daemon and its clients see one device).
pub fn parse_memory_limit(value: &str) -> Option<u64> {
    let first = value.split(',').next()?.trim();
    let limit = first.rsplit_once('=').map_or(first, |(_, l)| l);
    let (n, unit) = limit.split_at(limit.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    match unit {
        "M" => Some(n),
        "G" => Some(n * 1024),
        _ => None,
    }
}

/// What a client learns when it attaches to its daemon's server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The daemon's pid.
    pub pid: u32,
    /// The GPU it serves.
    pub uuid: String,
    /// The server's active thread percentage.
    pub thread_percentage: Option<u8>,
    /// The server's pinned memory limit, MiB.
    pub pinned_memory_mib: Option<u64>,
    /// The shared-memory segment the client must see in its `/dev/shm`.
    pub shm_segment: String,
}

impl Attached {
    fn line(&self) -> String {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        format!(
            "{} {} {} {} {}",
            self.pid,
            self.uuid,
            opt(self.thread_percentage.map(u64::from)),
            opt(self.pinned_memory_mib),
            self.shm_segment
        )
    }

    fn parse(line: &str) -> Option<Self> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [pid, uuid, pct, mib, shm] = w.as_slice() else {
            return None;
        };
        Some(Attached {
            pid: pid.parse().ok()?,
            uuid: (*uuid).to_string(),
            thread_percentage: (*pct != "-").then(|| pct.parse().ok()).flatten(),
            pinned_memory_mib: (*mib != "-").then(|| mib.parse().ok()).flatten(),
            shm_segment: (*shm).to_string(),
        })
    }
}

/// The shared-memory segment a daemon leaves in its `/dev/shm`.
pub fn shm_segment(pid: u32) -> String {
    format!("tessera-sim-mps.{pid}")
}

/// Where this process's POSIX shared memory lives.
pub const DEV_SHM: &str = "/dev/shm";

/// Attaches to the daemon on `pipe_dir`: `None` when no daemon answers there.
pub fn attach(pipe_dir: &Path) -> Option<Attached> {
    let answer = ask(&pipe_dir.join(SOCKET), "sim_client_attach").ok()?;
    Attached::parse(answer.lines().next()?)
}

impl Env {
    /// From the process environment, with MPS's defaults.
    pub fn from_process() -> Self {
        let var = |k: &str, default: &str| {
            std::env::var_os(k)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(default))
        };
        Env {
            pipe_dir: var("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"),
            log_dir: var("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"),
            visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            thread_percentage: std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                .ok()
                .and_then(|p| p.trim().parse().ok())
                .filter(|p| (1..=100).contains(p)),
            pinned_memory_mib: std::env::var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
                .ok()
                .and_then(|v| parse_memory_limit(&v)),
        }
    }

    fn socket(&self) -> PathBuf {
        self.pipe_dir.join(SOCKET)
    }
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// `CUDA_VISIBLE_DEVICES` does not name one GPU.
    #[error("CUDA_VISIBLE_DEVICES must name the GPU (by UUID) the daemon serves")]
    NoDevice,
    /// A daemon already answers on the pipe directory.
    #[error("An instance of this daemon is already running")]
    AlreadyRunning,
    /// The hardware refused.
    #[error("{}", chain(.0))]
    Backend(#[source] BackendError),
    /// A file or socket operation failed.
    #[error("{what} {}", path.display())]
    Io {
        /// What.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MpsError {
    let path = path.to_path_buf();
    move |source| MpsError::Io { what, path, source }
}

/// A command of the control protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `get_server_list`.
    GetServerList,
    /// `set_default_active_thread_percentage <p>`.
    ThreadPercentage(u8),
    /// `set_default_device_pinned_mem_limit <dev> <n>M|G`, in MiB.
    PinnedMemoryMib(u64),
    /// `quit`.
    Quit,
    /// `sim_client_attach`: a client asks for its server (see the module's doc).
    Attach,
}

/// Parses one command line.
pub fn parse(line: &str) -> Result<Request, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["get_server_list"] => Ok(Request::GetServerList),
        ["quit"] => Ok(Request::Quit),
        ["sim_client_attach"] => Ok(Request::Attach),
        ["set_default_active_thread_percentage", p] => p
            .parse::<u8>()
            .ok()
            .filter(|p| (1..=100).contains(p))
            .map(Request::ThreadPercentage)
            .ok_or_else(|| format!("invalid active thread percentage {p:?} (1-100)")),
        ["set_default_device_pinned_mem_limit", _device, limit] => parse_memory_limit(limit)
            .map(Request::PinnedMemoryMib)
            .ok_or_else(|| format!("invalid memory limit {limit:?} (use M or G)")),
        _ => Err(format!("unknown command {line:?}")),
    }
}

/// The client: each line of `input` to the daemon, its answers to `out`; an error, or no
/// daemon, to `err` with status 1.
pub fn client(env: &Env, input: impl BufRead, out: &mut impl Write, err: &mut impl Write) -> i32 {
    for line in input.lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        match ask(&env.socket(), &line) {
            Ok(answer) => {
                let _ = out.write_all(answer.as_bytes());
            }
            Err(e) => {
                let _ = writeln!(err, "{e}");
                return 1;
            }
        }
    }
    0
}

fn ask(socket: &Path, line: &str) -> Result<String, String> {
    let mut s = UnixStream::connect(socket)
        .map_err(|_| "Cannot find MPS control daemon process".to_string())?;
    writeln!(s, "{line}").map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    reader.read_line(&mut status).map_err(|e| e.to_string())?;
    let mut rest = String::new();
    for l in reader.lines() {
        rest.push_str(&l.map_err(|e| e.to_string())?);
        rest.push('\n');
    }
    match status.trim_end().strip_prefix("ERR ") {
        Some(msg) => Err(msg.to_string()),
        None => Ok(rest),
    }
}

/// The daemon for the GPU `CUDA_VISIBLE_DEVICES` names, on the hardware of `root`;
/// returns after `quit`, or when the hardware no longer knows this daemon (the node
/// "rebooted", or its root is gone).
pub fn daemon(root: &SimRoot, env: &Env) -> Result<(), MpsError> {
    let uuid = env.visible_devices.as_deref().ok_or(MpsError::NoDevice)?;
    for dir in [&env.pipe_dir, &env.log_dir] {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    let socket = env.socket();
    if UnixStream::connect(&socket).is_ok() {
        return Err(MpsError::AlreadyRunning);
    }
    match std::fs::remove_file(&socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("removing the stale socket", &socket)(e)),
    }
    let listener = UnixListener::bind(&socket).map_err(io("binding", &socket))?;
    let sim = root.open().map_err(MpsError::Backend)?;
    let gpu = sim.gpu_by_uuid(uuid).map_err(MpsError::Backend)?;
    let pid = std::process::id();
    let config = MpsDaemonConfig {
        pipe_dir: env.pipe_dir.clone(),
        log_dir: env.log_dir.clone(),
        shm_dir: None,
        default_active_thread_percentage: env.thread_percentage,
        default_pinned_memory_limit_mib: env.pinned_memory_mib,
    };
    sim.mps_daemon_started(gpu, pid, &config)
        .map_err(MpsError::Backend)?;
    let segment = Path::new(DEV_SHM).join(shm_segment(pid));
    std::fs::write(&segment, b"").map_err(io("creating the shared-memory segment", &segment))?;
    log(
        env,
        &format!(
            "Starting control daemon {pid} for GPU {uuid} (active thread percentage {:?}, pinned memory limit {:?} MiB)",
            env.thread_percentage, env.pinned_memory_mib
        ),
    );
    watch(root.clone(), gpu, pid, socket.clone(), segment.clone());
    let server = Server {
        sim: &sim,
        gpu,
        uuid,
        pid,
        env,
    };
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if server.serve(conn) {
            break;
        }
    }
    let _ = std::fs::remove_file(&segment);
    let _ = std::fs::remove_file(&socket);
    log(env, "Control daemon exited");
    Ok(())
}

/// A running daemon, as its connections see it.
struct Server<'a> {
    sim: &'a tessera_gpu::backend::sim::SimBackend,
    gpu: u32,
    uuid: &'a str,
    pid: u32,
    env: &'a Env,
}

impl Server<'_> {
    /// What a client attaching now gets: the limits the daemon holds now.
    fn attached(&self) -> Result<Attached, BackendError> {
        let state = self.sim.mps_state(self.gpu, &self.env.pipe_dir)?;
        let config = match state {
            tessera_gpu::backend::MpsState::Running { config, .. } => config,
            tessera_gpu::backend::MpsState::Stopped => MpsDaemonConfig::default(),
        };
        Ok(Attached {
            pid: self.pid,
            uuid: self.uuid.to_string(),
            thread_percentage: config.default_active_thread_percentage,
            pinned_memory_mib: config.default_pinned_memory_limit_mib,
            shm_segment: shm_segment(self.pid),
        })
    }

    /// Answers one connection; true after `quit`.
    fn serve(&self, conn: UnixStream) -> bool {
        let (sim, gpu, env) = (self.sim, self.gpu, self.env);
        let mut line = String::new();
        let Ok(reader) = conn.try_clone() else {
            return false;
        };
        if BufReader::new(reader).read_line(&mut line).is_err() {
            return false;
        }
        let mut conn = conn;
        let request = match parse(&line) {
            Ok(r) => r,
            Err(e) => {
                let _ = writeln!(conn, "ERR {e}");
                return false;
            }
        };
        if request == Request::Attach {
            match self.attached() {
                Ok(a) => {
                    let _ = writeln!(conn, "OK\n{}", a.line());
                }
                Err(e) => {
                    let _ = writeln!(conn, "ERR {}", chain(&e));
                }
            }
            return false;
        }
        let done = request == Request::Quit;
        let pipe = &env.pipe_dir;
        let result = match request {
            Request::GetServerList | Request::Attach => Ok(()),
            Request::ThreadPercentage(p) => sim.set_mps_defaults(gpu, pipe, Some(p), None),
            Request::PinnedMemoryMib(m) => sim.set_mps_defaults(gpu, pipe, None, Some(m)),
            Request::Quit => sim.stop_mps(
                gpu,
                &MpsDaemonConfig {
                    pipe_dir: pipe.clone(),
                    ..MpsDaemonConfig::default()
                },
            ),
        };
        match result {
            Ok(()) => {
                log(env, line.trim());
                let _ = writeln!(conn, "OK");
            }
            Err(e) => {
                let msg = chain(&e);
                log(env, &format!("{}: {msg}", line.trim()));
                let _ = writeln!(conn, "ERR {msg}");
            }
        }
        done
    }
}

/// Ends the daemon when the hardware forgets it, as a reboot ends the real one.
fn watch(root: SimRoot, gpu: u32, pid: u32, socket: PathBuf, segment: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("mps-watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(WATCH);
                let known = root.state().exists()
                    && tessera_gpu::backend::sim::state::load_state(&root.state())
                        .ok()
                        .flatten()
                        .and_then(|s| s.gpus.get(gpu as usize).cloned())
                        .is_some_and(|g| g.mps.iter().any(|m| m.pid == pid));
                if !known {
                    let _ = std::fs::remove_file(&segment);
                    let _ = std::fs::remove_file(&socket);
                    std::process::exit(0);
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("no watcher for the simulated hardware: {e}");
    }
}

/// Appends a line to `control.log`, as the real daemon keeps one.
pub fn log(env: &Env, line: &str) {
    let path = env.log_dir.join("control.log");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commands_the_plugin_sends_are_understood() {
        assert_eq!(parse("get_server_list"), Ok(Request::GetServerList));
        assert_eq!(
            parse("set_default_active_thread_percentage 25"),
            Ok(Request::ThreadPercentage(25))
        );
        assert_eq!(
            parse("set_default_device_pinned_mem_limit 0 4096M"),
            Ok(Request::PinnedMemoryMib(4096))
        );
        assert_eq!(
            parse("set_default_device_pinned_mem_limit 0 2G"),
            Ok(Request::PinnedMemoryMib(2048))
        );
        assert_eq!(parse("quit"), Ok(Request::Quit));
    }

    #[test]
    fn memory_limits_read_as_mps_writes_them() {
        assert_eq!(parse_memory_limit("0=4096M"), Some(4096));
        assert_eq!(parse_memory_limit("GPU-1234=2G"), Some(2048));
        assert_eq!(parse_memory_limit("512M"), Some(512));
        assert_eq!(parse_memory_limit("0=12K"), None);
        assert_eq!(parse_memory_limit(""), None);
    }

    #[test]
    fn an_attached_client_reads_back_what_the_daemon_said() {
        let a = Attached {
            pid: 7,
            uuid: "GPU-1".into(),
            thread_percentage: Some(25),
            pinned_memory_mib: None,
            shm_segment: shm_segment(7),
        };
        assert_eq!(Attached::parse(&a.line()), Some(a));
    }

    #[test]
    fn bad_commands_are_refused_with_a_reason() {
        assert!(parse("set_default_active_thread_percentage 0").is_err());
        assert!(parse("set_default_device_pinned_mem_limit 0 12K").is_err());
        assert!(parse("start_server -uid 0").is_err());
    }

    #[test]
    fn a_client_without_daemon_says_so_and_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = Env {
            pipe_dir: dir.path().to_path_buf(),
            log_dir: dir.path().to_path_buf(),
            visible_devices: None,
            thread_percentage: None,
            pinned_memory_mib: None,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = client(&env, "get_server_list\n".as_bytes(), &mut out, &mut err);
        assert_eq!(code, 1);
        assert!(String::from_utf8_lossy(&err).contains("Cannot find MPS control daemon"));
    }
}
