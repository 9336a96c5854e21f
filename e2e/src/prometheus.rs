//! Prometheus 3 and promtool, built from the Go module proxy and cached like Helm
//! ([`crate::helm`]), and a Prometheus server on loopback for the monitoring tests: the
//! shipped alerts and dashboard are checked by the Prometheus users run, not by a reading
//! of their text.
//!
//! The proxy serves Prometheus 3 as `github.com/prometheus/prometheus v0.3MM.P` (release
//! 3.MM.P; 2.x was `v0.MM.P`), without replace directives, so a go.mod requiring it builds
//! `cmd/prometheus` and `cmd/promtool` as they are. The build tags are the release's
//! (`netgo`) plus `remove_all_sd`, which leaves out every service discovery but the file and
//! HTTP ones (`plugins/plugin_*.go`): the tests give static targets, and the cloud SDKs are
//! most of what a full build compiles. Without `builtinassets` the web UI is left out; the
//! HTTP API, all the tests use, is not.
//!
//! Layout: `${TESSERA_CACHE:-$HOME/.cache/tessera}/prometheus/<3.MM.P>/{bin/{prometheus,promtool},src}`;
//! built into `bin/.partial/` and moved into place when complete.

use std::{
    fmt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    str::FromStr,
    time::{Duration, Instant},
};

use anyhow::Context;

use crate::{
    binaries::{
        self, cache_root, create_dir, go_directive, go_output, go_run, rename, tools_go, write,
    },
    wait::eventually,
};

/// The Go module.
pub const MODULE: &str = "github.com/prometheus/prometheus";

/// The commands built, as `<MODULE>/cmd/<name>`.
pub const COMMANDS: [&str; 2] = ["prometheus", "promtool"];

/// `remove_all_sd`: no service discovery but file and HTTP (see the module doc).
const BUILD_TAGS: &str = "netgo,remove_all_sd";

/// Building or finding Prometheus failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Go build (or a cache lookup) failed.
    #[error(transparent)]
    Build(#[from] binaries::Error),
    /// The proxy serves no Prometheus 3 release.
    #[error("the Go module proxy serves no Prometheus 3 release of {MODULE} (v0.3MM.P)")]
    NoRelease,
    /// Tests asked for Prometheus before anyone built it.
    #[error(
        "Prometheus is not built in {}: `cargo xtask test` builds it, or point TESSERA_PROMETHEUS_BIN_DIR at a directory with prometheus and promtool",
        .0.display()
    )]
    NotBuilt(PathBuf),
    /// A built binary could not be run.
    #[error("cannot run {}", .bin.display())]
    Run {
        /// The binary.
        bin: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A built binary is not the release asked for (a wrong `-X` path in the ldflags).
    #[error("`{} --version` printed {printed:?}, not version {version}", .bin.display())]
    WrongVersion {
        /// The binary.
        bin: PathBuf,
        /// The release built.
        version: PrometheusVersion,
        /// What it printed.
        printed: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A Prometheus 3 release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PrometheusVersion {
    /// 3.`minor`.
    pub minor: u32,
    /// 3.minor.`patch`.
    pub patch: u32,
}

impl PrometheusVersion {
    /// The module version the proxy serves it as (`v0.316.0` for 3.16.0).
    pub fn module_version(self) -> String {
        format!("v0.{}.{}", 300 + self.minor, self.patch)
    }

    /// The release a module version is (`v0.316.0` is 3.16.0); `None` for 2.x, for
    /// pre-releases and for anything else.
    pub fn from_module_version(v: &str) -> Option<Self> {
        let mut it = v.strip_prefix("v0.")?.split('.');
        let (mm, patch) = (it.next()?, it.next()?);
        if it.next().is_some() {
            return None;
        }
        let mm: u32 = mm.parse().ok()?;
        Some(Self {
            minor: mm.checked_sub(300).filter(|m| *m < 100)?,
            patch: patch.parse().ok()?,
        })
    }
}

impl fmt::Display for PrometheusVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "3.{}.{}", self.minor, self.patch)
    }
}

impl FromStr for PrometheusVersion {
    type Err = String;

    /// `3.16.0` (or `v3.16.0`).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("not a Prometheus 3 release (3.MINOR.PATCH): {s}");
        let mut it = s.strip_prefix('v').unwrap_or(s).split('.');
        let (major, minor, patch) = (it.next(), it.next(), it.next());
        if major != Some("3") || it.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            minor: minor.and_then(|m| m.parse().ok()).ok_or_else(bad)?,
            patch: patch.and_then(|p| p.parse().ok()).ok_or_else(bad)?,
        })
    }
}

/// A directory holding `prometheus` and `promtool`.
#[derive(Clone, Debug)]
pub struct PrometheusBins {
    /// The directory.
    pub dir: PathBuf,
}

impl PrometheusBins {
    /// `prometheus`.
    pub fn prometheus(&self) -> PathBuf {
        self.dir.join("prometheus")
    }

    /// `promtool`.
    pub fn promtool(&self) -> PathBuf {
        self.dir.join("promtool")
    }

    fn complete(&self) -> bool {
        COMMANDS.iter().all(|c| self.dir.join(c).is_file())
    }

    /// What tests use, without building: `$TESSERA_PROMETHEUS_BIN_DIR`, else the newest
    /// cached release.
    pub fn for_tests() -> Result<Self> {
        if let Some(dir) = std::env::var_os("TESSERA_PROMETHEUS_BIN_DIR") {
            return Ok(Self { dir: dir.into() });
        }
        match newest_cached()? {
            Some(v) => Ok(Self {
                dir: version_dir(v)?.join("bin"),
            }),
            None => Err(Error::NotBuilt(cache_root()?.join("prometheus"))),
        }
    }
}

fn version_dir(version: PrometheusVersion) -> Result<PathBuf> {
    Ok(cache_root()?.join("prometheus").join(version.to_string()))
}

/// The newest release with both binaries cached.
pub fn newest_cached() -> Result<Option<PrometheusVersion>> {
    let Ok(entries) = std::fs::read_dir(cache_root()?.join("prometheus")) else {
        return Ok(None);
    };
    let mut versions: Vec<PrometheusVersion> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    for v in versions.into_iter().rev() {
        let bins = PrometheusBins {
            dir: version_dir(v)?.join("bin"),
        };
        if bins.complete() {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// The newest Prometheus 3 release the Go module proxy serves.
pub fn newest_release() -> Result<PrometheusVersion> {
    let out = go_output(&["list", "-m", "-versions", MODULE], Path::new("."))?;
    newest_of(&out).ok_or(Error::NoRelease)
}

/// The newest 3.x release in `go list -m -versions` output.
fn newest_of(list: &str) -> Option<PrometheusVersion> {
    list.split_whitespace()
        .skip(1)
        .filter_map(PrometheusVersion::from_module_version)
        .max()
}

/// Builds `version` unless it is cached; returns its directory. `progress` gets one line at
/// a time, including how long the build took (the cold figure the docs quote).
pub fn ensure(
    version: PrometheusVersion,
    progress: &mut dyn FnMut(&str),
) -> Result<PrometheusBins> {
    let root = version_dir(version)?;
    let bins = PrometheusBins {
        dir: root.join("bin"),
    };
    if bins.complete() {
        progress(&format!(
            "Prometheus {version}: cached in {}",
            bins.dir.display()
        ));
        return Ok(bins);
    }
    let started = Instant::now();
    let src = root.join("src");
    let partial = bins.dir.join(".partial");
    create_dir(&src)?;
    create_dir(&partial)?;
    let module_version = version.module_version();
    let upstream = module_go_mod(&root, &module_version)?;
    write(
        &src.join("go.mod"),
        &format!(
            "// Generated by tessera-e2e: builds Prometheus from the module proxy.\nmodule tessera.local/prometheus-bin\n\ngo {}\n\nrequire {MODULE} {module_version}\n",
            go_directive(&upstream).unwrap_or("1.24.0")
        ),
    )?;
    let pkgs: Vec<String> = COMMANDS
        .iter()
        .map(|c| format!("{MODULE}/cmd/{c}"))
        .collect();
    write(&src.join("tools.go"), &tools_go(&pkgs))?;
    progress(&format!("  prometheus {version}: go mod tidy"));
    go_run(&["mod", "tidy"], &src, progress)?;
    // What Prometheus' .promu.yml stamps, so `--version` names the release.
    let ldflags = format!(
        "-s -w -X github.com/prometheus/common/version.Version={version} -X github.com/prometheus/common/version.Revision={module_version} -X github.com/prometheus/common/version.Branch=HEAD -X github.com/prometheus/common/version.BuildUser=tessera-e2e"
    );
    let out_dir = format!("{}/", partial.display());
    let mut args: Vec<&str> = vec![
        "build",
        "-v",
        "-trimpath",
        "-tags",
        BUILD_TAGS,
        "-ldflags",
        &ldflags,
        "-o",
        &out_dir,
    ];
    args.extend(pkgs.iter().map(String::as_str));
    progress(&format!(
        "  prometheus {version}: go build prometheus promtool (tags {BUILD_TAGS})"
    ));
    go_run(&args, &src, progress)?;
    for c in COMMANDS {
        rename(&partial.join(c), &bins.dir.join(c))?;
    }
    for c in COMMANDS {
        check_version(&bins.dir.join(c), version)?;
    }
    progress(&format!(
        "  prometheus and promtool {version} built in {}s",
        started.elapsed().as_secs()
    ));
    Ok(bins)
}

/// Prometheus' own go.mod at `module_version` (for its `go` directive).
fn module_go_mod(root: &Path, module_version: &str) -> Result<String> {
    let scratch = root.join("modinfo");
    create_dir(&scratch)?;
    let module = format!("{MODULE}@{module_version}");
    let args = ["mod", "download", "-json", module.as_str()];
    let out = go_output(&args, &scratch)?;
    let unexpected = |detail: String| binaries::Error::Unexpected {
        args: args.join(" "),
        detail,
    };
    let info: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| unexpected(e.to_string()))?;
    let path = info["GoMod"]
        .as_str()
        .ok_or_else(|| unexpected(format!("no GoMod field in {out}")))?;
    std::fs::read_to_string(path).map_err(|source| {
        binaries::Error::Io {
            action: "reading",
            path: path.into(),
            source,
        }
        .into()
    })
}

/// A fresh binary must say it is the release asked for (`prometheus, version 3.16.0 (…`).
fn check_version(bin: &Path, version: PrometheusVersion) -> Result<()> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .map_err(|source| Error::Run {
            bin: bin.to_path_buf(),
            source,
        })?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !text.contains(&format!("version {version} ")) {
        return Err(Error::WrongVersion {
            bin: bin.to_path_buf(),
            version,
            printed: text,
        });
    }
    Ok(())
}

/// How long Prometheus may take to open its database and load its configuration.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A Prometheus server on loopback with its own configuration and database in a temporary
/// directory; killed when dropped.
pub struct Prometheus {
    dir: tempfile::TempDir,
    port: u16,
    process: Option<Child>,
}

impl Prometheus {
    /// Writes `files` (name, text: the configuration refers to them by name) and
    /// `prometheus.yml` = `config` into a fresh directory, starts Prometheus there and waits
    /// until it is ready.
    pub async fn start(
        bins: &PrometheusBins,
        config: &str,
        files: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tessera-prometheus-")
            .tempdir()?;
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text)?;
        }
        std::fs::write(dir.path().join("prometheus.yml"), config)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
        let process = Command::new(bins.prometheus())
            .current_dir(dir.path())
            .arg("--config.file=prometheus.yml")
            .arg("--storage.tsdb.path=data")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bins.prometheus().display()))?;
        let prom = Self {
            dir,
            port,
            process: Some(process),
        };
        eventually("Prometheus to be ready", READY_TIMEOUT, || async {
            crate::process::http_get(prom.port, "/-/ready")
                .await
                .ok()
                .filter(|(code, _)| *code == 200)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nPrometheus log:\n{}", prom.log_tail(30)))?;
        Ok(prom)
    }

    /// Its directory (configuration, files, database, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// GETs `/api/v1/<path>` with `params` and returns `data`; an answer that is not
    /// `"status": "success"` is an error carrying Prometheus' `errorType` and `error`.
    pub async fn api(
        &self,
        path: &str,
        params: &[(&str, &str)],
    ) -> anyhow::Result<serde_json::Value> {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let url = format!("/api/v1/{path}?{query}");
        let (code, body) = crate::process::http_get(self.port, &url).await?;
        let answer: serde_json::Value = serde_json::from_str(&body)
            .with_context(|| format!("GET {url}: HTTP {code}, not JSON: {body}"))?;
        if answer["status"] != "success" {
            anyhow::bail!(
                "{}: {}",
                answer["errorType"].as_str().unwrap_or("error"),
                answer["error"].as_str().unwrap_or(&body)
            );
        }
        Ok(answer["data"].clone())
    }

    /// Evaluates `promql` now: the result's samples (a scalar as one).
    pub async fn query(&self, promql: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let data = self.api("query", &[("query", promql)]).await?;
        Ok(match data["resultType"].as_str() {
            Some("scalar" | "string") => vec![data["result"].clone()],
            _ => data["result"].as_array().cloned().unwrap_or_default(),
        })
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        crate::process::tail(&self.dir.path().join("prometheus.log"), n)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("==== prometheus (last lines)\n{}", self.log_tail(40));
        }
        if let Some(mut c) = self.process.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_3_releases_are_the_v0_3xx_module_versions() {
        let v = PrometheusVersion::from_module_version("v0.316.0").unwrap();
        assert_eq!(v.to_string(), "3.16.0");
        assert_eq!(v.module_version(), "v0.316.0");
        assert_eq!("3.16.0".parse::<PrometheusVersion>().unwrap(), v);
        assert_eq!(
            PrometheusVersion::from_module_version("v0.53.4"),
            None,
            "2.53.4"
        );
        assert_eq!(
            PrometheusVersion::from_module_version("v0.314.0-rc.0"),
            None
        );
        assert!("2.53.4".parse::<PrometheusVersion>().is_err());
    }

    #[test]
    fn the_newest_release_skips_pre_releases_and_2_x() {
        let list =
            "github.com/prometheus/prometheus v0.55.1 v0.309.2 v0.316.0 v0.317.0-rc.0 v0.315.1";
        assert_eq!(newest_of(list).unwrap().to_string(), "3.16.0");
        assert_eq!(newest_of("github.com/prometheus/prometheus v0.55.1"), None);
    }
}
