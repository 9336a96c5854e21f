//! Child processes of a control plane: each in its own process group, output to a log file,
//! stopped with SIGTERM then SIGKILL, and swept up by the next run if a test process died
//! without running its destructors.

use std::{
    fs::File,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};

/// A running component.
pub(crate) struct Component {
    pub name: &'static str,
    pub child: Child,
    pub log: PathBuf,
}

/// Starting a component failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create log file {0}")]
    Log(PathBuf, #[source] std::io::Error),
    #[error("cannot start {name} ({binary})")]
    Spawn {
        name: &'static str,
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn spawn(
    name: &'static str,
    binary: &Path,
    args: &[String],
    log_dir: &Path,
    nice: Option<i32>,
) -> Result<Component, Error> {
    let log = log_dir.join(format!("{name}.log"));
    let out = File::create(&log).map_err(|e| Error::Log(log.clone(), e))?;
    let err = out.try_clone().map_err(|e| Error::Log(log.clone(), e))?;
    // `nice` execs the binary, so the pid (and process group) is the component's, and
    // every thread it starts inherits the niceness.
    let mut cmd = match nice {
        Some(n) => {
            let mut c = Command::new("nice");
            c.arg("-n").arg(n.to_string()).arg(binary);
            c
        }
        None => Command::new(binary),
    };
    let child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Own process group: a Ctrl-C meant for `cargo xtask` does not reach a detached
        // control plane, and stopping kills the whole group.
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            name,
            binary: binary.to_path_buf(),
            source,
        })?;
    Ok(Component { name, child, log })
}

/// Stops a process group: SIGTERM, then SIGKILL after `grace`.
pub(crate) fn stop_group(pid: u32, grace: Duration) {
    let Ok(raw) = i32::try_from(pid) else { return };
    let pgid = Pid::from_raw(raw);
    if killpg(pgid, Signal::SIGTERM).is_err() {
        return; // already gone
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if killpg(pgid, None).is_err() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = killpg(pgid, Signal::SIGKILL);
}

/// Whether a process exists.
pub(crate) fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|raw| nix::sys::signal::kill(Pid::from_raw(raw), None).is_ok())
}

/// The last `n` lines of a file, for failure reports.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A binary of this workspace: `$<env>` when set, else next to the running test or xtask
/// binary (tests run from `target/<profile>/deps/`, xtask from `target/<profile>/`).
pub fn workspace_binary(name: &str, env: &str) -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    let dirs = [exe.parent(), exe.parent().and_then(Path::parent)];
    let candidates: Vec<PathBuf> = dirs.iter().flatten().map(|d| d.join(name)).collect();
    match candidates.iter().find(|c| c.is_file()) {
        Some(c) => Ok(c.clone()),
        None => anyhow::bail!(
            "{name} is not built (looked at {}): run `cargo build -p {name}` (cargo xtask test does) or set {env}",
            candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// GETs `path` from a component's HTTP endpoint on loopback `port`: (status, body).
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Ok((status, body))
}

/// The value of one sample (`name{labels}` as exposed) of a Prometheus text exposition.
pub fn sample(exposition: &str, sample: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A memory figure of process `pid` from `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
