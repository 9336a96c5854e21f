//! `cargo xtask node-images`: the images the test bed's containerd nodes run, built with
//! buildah like `cargo xtask image` (no registry is reachable) and saved as OCI archives
//! that each node imports into its containerd (`tessera_e2e::node_images`):
//!
//! - `localhost/tessera-pause`: the pod sandbox, a static `pause` compiled here from
//!   `xtask/pause/pause.c` (what `registry.k8s.io/pause` does), on an empty image.
//! - `localhost/tessera-probe`: `tessera-probe` on the distroless-like base of Tessera's
//!   own image (glibc, no shell), with `/pause` to hold a pod after its probe ran. It runs
//!   as root, as CUDA images do: a MIG device's capability nodes are root's.
//! - `localhost/tessera`: `cargo xtask image`'s build, tagged for this checkout
//!   (`<version>-tb<hash of the checkout's path>`) so that checkouts sharing buildah's
//!   storage do not replace each other's image.
//!
//! The archives and `images.json` go to `<target dir>/node-images/`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::Context;
use tessera_e2e::node_images::{MANIFEST, NodeImages, PAUSE_IN_IMAGE, PROBE_IN_IMAGE};

use crate::{
    image::{self, BASE_IMAGE, buildah, fnv, output, run_cmd},
    steps::{cargo, human, repo_root, timed},
};

const PAUSE_SOURCE: &str = include_str!("../pause/pause.c");

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    let mut timings = Vec::new();
    let images = build(&mut timings)?;
    println!("\nbuilt into {}:", images.dir.display());
    for (name, reference) in images.all() {
        println!("  {name}: {reference}");
    }
    for (name, took) in &timings {
        println!("  {:>8}  {name}", human(*took));
    }
    Ok(())
}

/// The target directory cargo builds into.
fn target_dir() -> anyhow::Result<PathBuf> {
    Ok(match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => repo_root()?.join("target"),
    })
}

/// Builds the three images and saves them; each step's time goes to `timings`.
pub fn build(timings: &mut Vec<(String, Duration)>) -> anyhow::Result<NodeImages> {
    let root = repo_root()?;
    let version = env!("CARGO_PKG_VERSION");
    let checkout = fnv(&root.display().to_string());
    let tag = format!("{version}-tb{}", &checkout[..8]);
    let out = target_dir()?.join("node-images");
    std::fs::create_dir_all(&out)?;
    let tessera = image::build(
        image::Args {
            tag: Some(tag.clone()),
            arch: None,
            from_source: false,
        },
        timings,
    )?;
    let mut step = |name: &str, f: &mut dyn FnMut() -> anyhow::Result<String>| {
        let (reference, took) = timed(name, f)?;
        timings.push((name.to_string(), took));
        anyhow::Ok(reference)
    };
    let pause = step("pause image (static pause.c)", &mut || pause_image(&out))?;
    let probe = step("probe image (tessera-probe on the base)", &mut || {
        probe_image(&out, &tag)
    })?;
    let images = NodeImages {
        pause,
        probe,
        tessera,
        dir: out.clone(),
    };
    step("save the images as OCI archives", &mut || {
        for (name, reference) in images.all() {
            let archive = images.archive(name);
            let _ = std::fs::remove_file(&archive);
            output(
                buildah()?
                    .args(["push", "--quiet", reference])
                    .arg(format!("oci-archive:{}:{reference}", archive.display())),
            )?;
        }
        std::fs::write(out.join(MANIFEST), serde_json::to_vec_pretty(&images)?)?;
        Ok(String::new())
    })?;
    Ok(images)
}

/// `pause` for the sandbox image, compiled statically (it runs in an empty image).
fn compile_pause(work: &Path) -> anyhow::Result<PathBuf> {
    let src = work.join("pause.c");
    let bin = work.join("pause");
    std::fs::write(&src, PAUSE_SOURCE)?;
    run_cmd(
        Command::new("cc")
            .args(["-static", "-Os", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&bin)
            .arg(&src),
    )?;
    run_cmd(Command::new("strip").arg(&bin))?;
    Ok(bin)
}

/// The sandbox image, named by its source's hash and built only when missing.
fn pause_image(out: &Path) -> anyhow::Result<String> {
    let reference = format!("localhost/tessera-pause:{}", &fnv(PAUSE_SOURCE)[..12]);
    if image::exists(&reference)? {
        println!("  {reference} is up to date");
        return Ok(reference);
    }
    let bin = compile_pause(out)?;
    let container = output(buildah()?.args(["from", "scratch"]))?
        .trim()
        .to_string();
    let result = (|| {
        run_cmd(
            buildah()?
                .args(["copy", "--chmod", "0755", &container])
                .arg(&bin)
                .arg("/pause"),
        )?;
        run_cmd(buildah()?.args([
            "config",
            "--entrypoint",
            r#"["/pause"]"#,
            "--user",
            "65535:65535",
            &container,
        ]))?;
        run_cmd(buildah()?.args(["commit", "--rm", "--quiet", &container, &reference]))
    })();
    if result.is_err() {
        let _ = buildah()?.args(["rm", &container]).output();
    }
    result.map(|()| reference)
}

/// The probe's image: `tessera-probe` (the dev build `cargo xtask test` makes) and a
/// static `pause` on the base image.
fn probe_image(out: &Path, tag: &str) -> anyhow::Result<String> {
    cargo(&["build", "--quiet", "-p", "tessera-probe"], &[])?;
    let probe = target_dir()?.join("debug/tessera-probe");
    let pause = compile_pause(out)?;
    let reference = format!("localhost/tessera-probe:{tag}");
    let container = output(buildah()?.args(["from", "--pull=never", BASE_IMAGE]))?
        .trim()
        .to_string();
    let result = (|| {
        for (from, to) in [(&probe, PROBE_IN_IMAGE), (&pause, PAUSE_IN_IMAGE)] {
            run_cmd(
                buildah()?
                    .args(["copy", "--chmod", "0755", &container])
                    .arg(from)
                    .arg(to),
            )?;
        }
        run_cmd(
            buildah()?
                .args(["config", "--user", "0:0"])
                .args(["--entrypoint", &format!(r#"["{PROBE_IN_IMAGE}"]"#)])
                .args(["--cmd", ""])
                .arg(&container),
        )?;
        run_cmd(buildah()?.args(["commit", "--rm", "--quiet", &container, &reference]))
    })();
    if result.is_err() {
        let _ = buildah()?.args(["rm", &container]).output();
    }
    result
        .map(|()| reference)
        .context("building the probe image (needs the base image of `cargo xtask image`)")
}
