//! Building and caching the control-plane binaries from the Go module proxy.
//!
//! `k8s.io/kubernetes` requires its staging modules (`k8s.io/api`, …) at `v0.0.0`, which the
//! proxy does not serve, and `go install` refuses modules with replace directives. So we
//! write our own small go.mod that requires `k8s.io/kubernetes v1.Y.Z` and replaces every
//! `v0.0.0` staging requirement of *that tag's* go.mod with `v0.Y.Z` (derived, never copied:
//! the list grows between releases), then `go build` the commands. etcd is built the same
//! way in a separate module so its pins cannot skew Kubernetes' dependency graph.
//!
//! The hollow kubelet (`e2e/hollow-kubelet/`, the real kubelet code with a fake container
//! runtime or containerd) is our own Go module, built the same way against each release;
//! its sources are compiled into this crate, and the binary is named by their hash
//! (`tessera-hollow-kubelet-<hash>`), so it is rebuilt whenever they change and two
//! checkouts with different sources sharing one cache never replace each other's.
//!
//! Layout: `${TESSERA_CACHE:-$HOME/.cache/tessera}/k8s/<version>/{bin,src,etcd-src,kubelet-src-<hash>}`.
//! Binaries are built into `bin/.partial/` and moved into `bin/` only when complete, so an
//! interrupted build is never mistaken for a cached one.

use std::{
    collections::VecDeque,
    env,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::version::K8sVersion;

/// The Kubernetes commands the test bed needs, as `k8s.io/kubernetes/cmd/<name>`.
pub const K8S_COMMANDS: [&str; 4] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

/// The hollow kubelet binary: the real kubelet code for one simulated node.
pub const HOLLOW_KUBELET: &str = "tessera-hollow-kubelet";

/// The hollow kubelet's Go sources, as (file name, text).
const HOLLOW_KUBELET_SOURCES: [(&str, &str); 3] = [
    ("main.go", include_str!("../hollow-kubelet/main.go")),
    ("compat.go", include_str!("../hollow-kubelet/compat.go")),
    (
        "compat_1_36.go",
        include_str!("../hollow-kubelet/compat_1_36.go"),
    ),
];

/// A stable hash of the hollow kubelet's sources (FNV-1a; a cache key, not a checksum
/// anyone relies on for integrity).
pub fn hollow_kubelet_source_hash() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, text) in HOLLOW_KUBELET_SOURCES {
        for b in name.bytes().chain([0]).chain(text.bytes()).chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Building or finding binaries failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither `$TESSERA_CACHE` nor `$HOME` is set.
    #[error("cannot find a cache directory: set TESSERA_CACHE or HOME")]
    NoCacheDir,
    /// A file operation failed.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The `go` command could not be started.
    #[error("cannot run `go` (is Go installed and on PATH?)")]
    GoMissing(#[source] std::io::Error),
    /// A `go` command failed.
    #[error("`go {args}` failed in {dir}:\n{tail}{hint}")]
    GoFailed {
        /// Arguments.
        args: String,
        /// Working directory.
        dir: PathBuf,
        /// Last lines of its output.
        tail: String,
        /// What to do about it, when we recognise the failure.
        hint: String,
    },
    /// The proxy serves no release of the requested minor.
    #[error(
        "the Go module proxy serves no k8s.io/kubernetes release of 1.{minor} (it serves: {served})"
    )]
    NoRelease {
        /// Requested minor.
        minor: u32,
        /// What it serves.
        served: String,
    },
    /// Binaries are not built and the caller asked not to build them.
    #[error(
        "the control-plane binaries for Kubernetes {version} are not built in {dir}: run `cargo xtask controlplane build --version {version}` first (about 10-25 minutes the first time on 2 cores)"
    )]
    NotBuilt {
        /// Version.
        version: K8sVersion,
        /// Where they were looked for.
        dir: PathBuf,
    },
    /// No binaries are cached at all.
    #[error(
        "no control-plane binaries are cached under {0}: run `cargo xtask controlplane build` first"
    )]
    NothingCached(PathBuf),
    /// A response of the Go tooling was not what we expect.
    #[error("unexpected output from `go {args}`: {detail}")]
    Unexpected {
        /// Arguments.
        args: String,
        /// What was wrong.
        detail: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A directory holding a complete set of control-plane binaries of one version.
#[derive(Clone, Debug)]
pub struct BinDir {
    /// Kubernetes version.
    pub version: K8sVersion,
    /// The directory.
    pub dir: PathBuf,
}

impl BinDir {
    /// Path of a binary in this directory (`etcd`, `kube-apiserver`, …).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The binaries the test bed needs that are missing here (the hollow kubelet also
    /// when none was built from these sources).
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing: Vec<&'static str> = K8S_COMMANDS
            .iter()
            .copied()
            .chain(["etcd"])
            .filter(|name| !self.path(name).is_file())
            .collect();
        if !self.hollow_kubelet().is_file() {
            missing.push(HOLLOW_KUBELET);
        }
        missing
    }

    /// The hollow kubelet built from this checkout's sources.
    pub fn hollow_kubelet(&self) -> PathBuf {
        self.dir
            .join(format!("{HOLLOW_KUBELET}-{}", hollow_kubelet_source_hash()))
    }

    /// The cached binaries of `version`, if all are present.
    pub fn cached(version: K8sVersion) -> Result<Option<Self>> {
        let dir = version_dir(version)?.join("bin");
        let bins = Self { version, dir };
        Ok(bins.missing().is_empty().then_some(bins))
    }

    /// The binaries tests should use, without building or touching the network:
    /// `$TESSERA_K8S_BIN_DIR` (with `$TESSERA_K8S_VERSION`), else the cached binaries of
    /// `$TESSERA_K8S_VERSION`, else the newest cached version.
    pub fn for_tests() -> Result<Self> {
        let version: Option<K8sVersion> = env::var("TESSERA_K8S_VERSION")
            .ok()
            .and_then(|v| v.parse().ok());
        if let (Ok(dir), Some(version)) = (env::var("TESSERA_K8S_BIN_DIR"), version) {
            return Ok(Self {
                version,
                dir: dir.into(),
            });
        }
        let version = match version {
            Some(v) => v,
            None => newest_cached()?.ok_or_else(|| match cache_root() {
                Ok(root) => Error::NothingCached(root.join("k8s")),
                Err(e) => e,
            })?,
        };
        Self::cached(version)?.ok_or(Error::NotBuilt {
            version,
            dir: version_dir(version)?.join("bin"),
        })
    }
}

/// `${TESSERA_CACHE:-$HOME/.cache/tessera}`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = env::var_os("TESSERA_CACHE") {
        return Ok(dir.into());
    }
    let home = env::var_os("HOME").ok_or(Error::NoCacheDir)?;
    Ok(PathBuf::from(home).join(".cache").join("tessera"))
}

fn version_dir(version: K8sVersion) -> Result<PathBuf> {
    Ok(cache_root()?.join("k8s").join(version.to_string()))
}

/// The newest version with a complete set of cached binaries.
pub fn newest_cached() -> Result<Option<K8sVersion>> {
    let root = cache_root()?.join("k8s");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(None);
    };
    let mut versions: Vec<K8sVersion> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    for v in versions.into_iter().rev() {
        if BinDir::cached(v)?.is_some() {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// The newest release of `1.<minor>` the Go module proxy serves.
pub fn newest_release(minor: u32) -> Result<K8sVersion> {
    let args = ["list", "-m", "-versions", "k8s.io/kubernetes"];
    let out = go_output(&args, Path::new("."))?;
    let served: Vec<K8sVersion> = out
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    served
        .iter()
        .filter(|v| v.minor == minor)
        .max()
        .copied()
        .ok_or_else(|| Error::NoRelease {
            minor,
            served: served
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Builds whatever of `version` is not cached yet and returns the complete directory.
/// `progress` receives one human-readable line at a time.
pub fn ensure(version: K8sVersion, progress: &mut dyn FnMut(&str)) -> Result<BinDir> {
    let root = version_dir(version)?;
    let bins = BinDir {
        version,
        dir: root.join("bin"),
    };
    let missing = bins.missing();
    if missing.is_empty() {
        progress(&format!(
            "Kubernetes {version}: all binaries cached in {}",
            bins.dir.display()
        ));
        return Ok(bins);
    }
    progress(&format!(
        "Kubernetes {version}: building {}",
        missing.join(", ")
    ));
    create_dir(&bins.dir)?;
    let k8s_mod = kubernetes_go_mod(version, &root)?;
    let k8s_cmds: Vec<&str> = missing
        .iter()
        .copied()
        .filter(|m| K8S_COMMANDS.contains(m))
        .collect();
    if !k8s_cmds.is_empty() {
        build_kubernetes(
            version,
            &k8s_mod,
            &root.join("src"),
            &bins.dir,
            &k8s_cmds,
            progress,
        )?;
    }
    if missing.contains(&"etcd") {
        build_etcd(&k8s_mod, &root.join("etcd-src"), &bins.dir, progress)?;
    }
    if missing.contains(&HOLLOW_KUBELET) {
        build_hollow_kubelet(
            version,
            &k8s_mod,
            &root.join(format!("kubelet-src-{}", hollow_kubelet_source_hash())),
            &bins,
            progress,
        )?;
    }
    let still = bins.missing();
    if !still.is_empty() {
        return Err(Error::Unexpected {
            args: "build".into(),
            detail: format!("{} missing after a successful build", still.join(", ")),
        });
    }
    Ok(bins)
}

/// The text of `k8s.io/kubernetes`'s go.mod at `version`, fetched through the proxy.
fn kubernetes_go_mod(version: K8sVersion, root: &Path) -> Result<String> {
    let scratch = root.join("modinfo");
    create_dir(&scratch)?;
    let module = format!("k8s.io/kubernetes@{}", version.tag());
    let args = ["mod", "download", "-json", module.as_str()];
    let out = go_output(&args, &scratch)?;
    let info: serde_json::Value = serde_json::from_str(&out).map_err(|e| Error::Unexpected {
        args: args.join(" "),
        detail: e.to_string(),
    })?;
    let path = info["GoMod"].as_str().ok_or_else(|| Error::Unexpected {
        args: args.join(" "),
        detail: format!("no GoMod field in {out}"),
    })?;
    read(Path::new(path))
}

/// Staging modules the tag requires at the unpublished `v0.0.0`.
pub fn staging_modules(k8s_go_mod: &str) -> Vec<String> {
    let mut mods: Vec<String> = k8s_go_mod
        .lines()
        .filter_map(|line| {
            let line = line.split("//").next()?.trim();
            let line = line.strip_prefix("require").map_or(line, str::trim);
            let mut it = line.split_whitespace();
            let (name, ver) = (it.next()?, it.next()?);
            (name.starts_with("k8s.io/") && ver == "v0.0.0" && it.next().is_none())
                .then(|| name.to_string())
        })
        .collect();
    mods.sort();
    mods.dedup();
    mods
}

/// The `go` directive of a go.mod (e.g. `1.26.0`).
pub(crate) fn go_directive(go_mod: &str) -> Option<&str> {
    go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("go ").map(str::trim))
}

/// The version of a module required in a go.mod.
fn required_version<'a>(go_mod: &'a str, module: &str) -> Option<&'a str> {
    go_mod.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == module).then(|| it.next()).flatten()
    })
}

/// Our go.mod named `module` for building against the Kubernetes code of `version`.
pub fn render_go_mod(module: &str, version: K8sVersion, k8s_go_mod: &str) -> String {
    let mut out = String::from(
        "// Generated by tessera-e2e: builds against Kubernetes from the module proxy.\n",
    );
    out.push_str(&format!("module {module}\n\n"));
    out.push_str(&format!(
        "go {}\n\n",
        go_directive(k8s_go_mod).unwrap_or("1.24.0")
    ));
    out.push_str(&format!("require k8s.io/kubernetes {}\n\n", version.tag()));
    out.push_str(
        "// k8s.io/kubernetes requires these at v0.0.0, which the proxy does not serve.\n",
    );
    out.push_str("replace (\n");
    for m in staging_modules(k8s_go_mod) {
        out.push_str(&format!("\t{m} => {m} {}\n", version.staging_tag()));
    }
    out.push_str(")\n");
    out
}

pub(crate) fn tools_go(imports: &[String]) -> String {
    let mut out = String::from(
        "//go:build tools\n\n// Keeps the commands in the module graph.\npackage tools\n\nimport (\n",
    );
    for i in imports {
        out.push_str(&format!("\t_ \"{i}\"\n"));
    }
    out.push_str(")\n");
    out
}

fn build_kubernetes(
    version: K8sVersion,
    k8s_mod: &str,
    src: &Path,
    bin: &Path,
    cmds: &[&str],
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    create_dir(src)?;
    let pkgs: Vec<String> = K8S_COMMANDS
        .iter()
        .map(|c| format!("k8s.io/kubernetes/cmd/{c}"))
        .collect();
    write(
        &src.join("go.mod"),
        &render_go_mod("tessera.local/k8s-bins", version, k8s_mod),
    )?;
    write(&src.join("tools.go"), &tools_go(&pkgs))?;
    progress("  go mod tidy (downloads ~150 modules on a cold cache)");
    go_run(&["mod", "tidy"], src, progress)?;
    let ldflags = version_ldflags(version);
    let partial = bin.join(".partial");
    create_dir(&partial)?;
    let out_dir = format!("{}/", partial.display());
    let mut args: Vec<String> = [
        "build",
        "-v",
        "-trimpath",
        "-pgo=off",
        "-ldflags",
        &ldflags,
        "-o",
        &out_dir,
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    args.extend(cmds.iter().map(|c| format!("k8s.io/kubernetes/cmd/{c}")));
    progress(&format!(
        "  go build {} (the slow step: 10-25 min cold on 2 cores)",
        cmds.join(" ")
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    go_run(&args, src, progress)?;
    for c in cmds {
        rename(&partial.join(c), &bin.join(c))?;
    }
    Ok(())
}

fn build_etcd(k8s_mod: &str, src: &Path, bin: &Path, progress: &mut dyn FnMut(&str)) -> Result<()> {
    // The etcd release this Kubernetes release is built and tested against.
    let module = "go.etcd.io/etcd/server/v3";
    let etcd_version = required_version(k8s_mod, module).unwrap_or("v3.6.5");
    create_dir(src)?;
    write(
        &src.join("go.mod"),
        &format!(
            "// Generated by tessera-e2e: builds etcd from the module proxy.\nmodule tessera.local/etcd-bin\n\ngo {}\n\nrequire {module} {etcd_version}\n",
            go_directive(k8s_mod).unwrap_or("1.24.0")
        ),
    )?;
    write(&src.join("tools.go"), &tools_go(&[module.to_string()]))?;
    progress(&format!("  etcd {etcd_version}: go mod tidy"));
    go_run(&["mod", "tidy"], src, progress)?;
    let partial = bin.join(".partial");
    create_dir(&partial)?;
    let target = partial.join("etcd");
    let target_str = target.display().to_string();
    progress(&format!("  etcd {etcd_version}: go build (1-3 min cold)"));
    go_run(
        &[
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
            &target_str,
            module,
        ],
        src,
        progress,
    )?;
    rename(&target, &bin.join("etcd"))
}

/// The `-ldflags` that stamp a build with the release it was built from.
fn version_ldflags(version: K8sVersion) -> String {
    format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={tag} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor={minor} -X k8s.io/component-base/version.gitTreeState=clean",
        tag = version.tag(),
        minor = version.minor
    )
}

/// Builds the hollow kubelet from the embedded sources, in its own module (so its extra
/// imports do not change the control plane's graph) sharing Go's module and build caches.
fn build_hollow_kubelet(
    version: K8sVersion,
    k8s_mod: &str,
    src: &Path,
    bins: &BinDir,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let started = Instant::now();
    create_dir(src)?;
    write(
        &src.join("go.mod"),
        &render_go_mod("tessera.local/hollow-kubelet", version, k8s_mod),
    )?;
    for (name, text) in HOLLOW_KUBELET_SOURCES {
        write(&src.join(name), text)?;
    }
    progress(&format!("  {HOLLOW_KUBELET}: go mod tidy"));
    go_run(&["mod", "tidy"], src, progress)?;
    let partial = bins.dir.join(".partial");
    create_dir(&partial)?;
    let target = partial.join(bins.hollow_kubelet().file_name().unwrap_or_default());
    let target_str = target.display().to_string();
    let ldflags = version_ldflags(version);
    // Kubernetes APIs the hollow kubelet calls changed between minors; compat*.go pick
    // the right spelling by this tag.
    let tags = format!("k8s_1_{}", version.minor);
    progress(&format!(
        "  {HOLLOW_KUBELET}: go build (reuses the control plane's build cache; a few minutes cold)"
    ));
    go_run(
        &[
            "build",
            "-v",
            "-trimpath",
            "-pgo=off",
            "-tags",
            &tags,
            "-ldflags",
            &ldflags,
            "-o",
            &target_str,
            ".",
        ],
        src,
        progress,
    )?;
    rename(&target, &bins.hollow_kubelet())?;
    progress(&format!(
        "  {HOLLOW_KUBELET} built in {}s",
        started.elapsed().as_secs()
    ));
    Ok(())
}

fn go_command(args: &[&str], dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.args(args)
        .current_dir(dir)
        // Official Kubernetes binaries are static; cgo would also need a C toolchain.
        .env("CGO_ENABLED", "0")
        // A release whose go.mod names a newer Go than the installed one fetches that
        // toolchain from the module proxy instead of failing.
        .env(
            "GOTOOLCHAIN",
            env::var("GOTOOLCHAIN")
                .ok()
                .filter(|v| v != "local")
                .unwrap_or_else(|| "auto".into()),
        )
        .env("GOFLAGS", "-mod=mod -buildvcs=false");
    cmd
}

pub(crate) fn go_output(args: &[&str], dir: &Path) -> Result<String> {
    let out = go_command(args, dir).output().map_err(Error::GoMissing)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(go_failed(
            args,
            dir,
            stderr.lines().map(str::to_string).collect(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `go`, reporting progress every 20 s (how many packages `-v` has listed so far, or
/// that it is still linking when it lists nothing), and keeps the last lines of output for
/// the error.
pub(crate) fn go_run(args: &[&str], dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<()> {
    go_run_with(args, dir, &[], progress)
}

/// [`go_run`] with extra environment (`CGO_ENABLED=1` for a program that loads C
/// libraries).
pub(crate) fn go_run_with(
    args: &[&str],
    dir: &Path,
    env: &[(&str, &str)],
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut child = go_command(args, dir)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::GoMissing)?;
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = child.stderr.take().map(|stderr| {
        std::thread::spawn(move || {
            for line in BufReader::new(stderr)
                .lines()
                .map_while(std::result::Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        })
    });
    let mut last_report = Instant::now();
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut lines = 0usize;
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(line) => {
                lines += 1;
                if tail.len() == 60 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if last_report.elapsed() >= Duration::from_secs(20) {
            last_report = Instant::now();
            progress(&format!(
                "    … {:>4}s, {lines} packages so far (latest: {})",
                started.elapsed().as_secs(),
                tail.back().map_or("", String::as_str)
            ));
        }
    }
    if let Some(r) = reader {
        let _ = r.join();
    }
    let status = child.wait().map_err(|source| Error::Io {
        action: "waiting for go in",
        path: dir.to_path_buf(),
        source,
    })?;
    if !status.success() {
        return Err(go_failed(args, dir, tail.into_iter().collect()));
    }
    progress(&format!("    done in {}s", started.elapsed().as_secs()));
    Ok(())
}

fn go_failed(args: &[&str], dir: &Path, tail: Vec<String>) -> Error {
    let text = tail.join("\n");
    let hint = if let Some(line) = tail.iter().find(|l| l.contains("unknown revision v0.0.0")) {
        format!(
            "\nhint: a staging module is required at v0.0.0 but has no replace line ({line}); the staging list is derived from the tag's go.mod, so this module is not listed there as `v0.0.0` - add it to staging_modules()"
        )
    } else {
        String::new()
    };
    Error::GoFailed {
        args: args.join(" "),
        dir: dir.to_path_buf(),
        tail: text,
        hint,
    }
}

pub(crate) fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|source| Error::Io {
        action: "creating",
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        action: "writing",
        path: path.to_path_buf(),
        source,
    })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        action: "reading",
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|source| Error::Io {
        action: "moving into place",
        path: from.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GO_MOD: &str = "module k8s.io/kubernetes\n\ngo 1.26.0\n\nrequire (\n\tk8s.io/api v0.0.0\n\tk8s.io/utils v0.0.0-20260626114624-be93311217bd\n\tk8s.io/streaming v0.0.0 // indirect\n\tgo.etcd.io/etcd/server/v3 v3.7.0 // indirect\n)\n\nrequire k8s.io/kubelet v0.0.0\n";

    #[test]
    fn staging_modules_are_exactly_the_v0_0_0_requirements() {
        assert_eq!(
            staging_modules(GO_MOD),
            ["k8s.io/api", "k8s.io/kubelet", "k8s.io/streaming"]
        );
    }

    #[test]
    fn our_go_mod_replaces_each_staging_module_with_the_matching_tag() {
        let v: K8sVersion = "1.37.2".parse().unwrap();
        let m = render_go_mod("tessera.local/k8s-bins", v, GO_MOD);
        assert!(m.contains("go 1.26.0\n"));
        assert!(m.contains("require k8s.io/kubernetes v1.37.2"));
        assert!(m.contains("\tk8s.io/api => k8s.io/api v0.37.2\n"));
        assert!(m.contains("\tk8s.io/streaming => k8s.io/streaming v0.37.2\n"));
        assert!(
            !m.contains("k8s.io/utils =>"),
            "pseudo-versions are published: {m}"
        );
    }

    #[test]
    fn etcd_follows_the_version_kubernetes_requires() {
        assert_eq!(
            required_version(GO_MOD, "go.etcd.io/etcd/server/v3"),
            Some("v3.7.0")
        );
    }

    #[test]
    fn a_missing_staging_module_failure_carries_a_hint() {
        let e = go_failed(
            &["build"],
            Path::new("/x"),
            vec!["go: k8s.io/foo@v0.0.0: unknown revision v0.0.0".into()],
        );
        assert!(e.to_string().contains("hint: a staging module"));
    }
}
