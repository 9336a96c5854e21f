//! `cargo xtask chart [--check]`: the copies the Helm chart and the kustomize base need of
//! files that have one source elsewhere.
//!
//! Helm reads only files inside the chart and kustomize only files at or below a
//! kustomization, so neither can refer to `crds/` or `config/rbac/` directly. Rather than
//! keep two hand-edited copies, this writes them from their one source, each YAML copy
//! headed by where it came from; `cargo xtask test` fails when a copy is stale.
//!
//! | source | copies |
//! |---|---|
//! | `crds/*.yaml` (from `cargo xtask crds`) | `charts/tessera/crds/`, `config/crd/` (+ its kustomization.yaml) |
//! | `config/rbac/*.yaml` but `namespace.yaml` | `charts/tessera/files/rbac/` |
//! | `config/deviceclasses/*.yaml` | `charts/tessera/files/deviceclasses/` |
//! | `config/monitoring/prometheus-rules.yaml`, `grafana-dashboard.json` | `charts/tessera/files/monitoring/` |

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};

use crate::steps::repo_root;

#[derive(clap::Args)]
pub struct Args {
    /// Do not write: fail (and name the stale files) if a copy differs from its source.
    #[arg(long)]
    pub check: bool,
}

/// Destination directory (relative to the repo) → (file name → contents).
type Copies = BTreeMap<PathBuf, BTreeMap<String, String>>;

pub fn run(args: &Args) -> anyhow::Result<()> {
    let root = repo_root()?;
    if args.check {
        return check(&root);
    }
    write(&root)
}

/// Writes every copy and removes files in the copy directories that no source has.
pub fn write(root: &Path) -> anyhow::Result<()> {
    for (dir, files) in copies(root)? {
        let dir = root.join(dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, text) in &files {
            let path = dir.join(name);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
        }
        for stale in unexpected(&dir, &files)? {
            std::fs::remove_file(&stale)
                .with_context(|| format!("removing {}", stale.display()))?;
            println!("removed {} (its source is gone)", stale.display());
        }
    }
    Ok(())
}

/// Fails, naming the stale files, if a copy differs from its source.
pub fn check(root: &Path) -> anyhow::Result<()> {
    let mut stale = Vec::new();
    let mut n = 0;
    for (dir, files) in copies(root)? {
        let dir = root.join(dir);
        for (name, text) in &files {
            n += 1;
            let path = dir.join(name);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                stale.push(path.display().to_string());
            }
        }
        stale.extend(
            unexpected(&dir, &files)?
                .iter()
                .map(|p| p.display().to_string()),
        );
    }
    if !stale.is_empty() {
        bail!(
            "the chart's and the kustomize base's copies are out of date with their sources (crds/, config/): {}\nrun `cargo xtask chart` and commit the result",
            stale.join(", ")
        );
    }
    println!("the chart's and the kustomize base's copies are up to date ({n} files)");
    Ok(())
}

fn copies(root: &Path) -> anyhow::Result<Copies> {
    let mut out = Copies::new();
    let crds = sources(root, "crds", "yaml", &[])?;
    let mut crd_names: Vec<&String> = crds.keys().collect();
    crd_names.sort();
    let kustomization = format!(
        "{}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{}",
        header("crds/"),
        crd_names
            .iter()
            .map(|n| format!("  - {n}\n"))
            .collect::<String>()
    );
    let mut crd_copy = headed(&crds, "crds");
    out.insert("charts/tessera/crds".into(), crd_copy.clone());
    crd_copy.insert("kustomization.yaml".into(), kustomization);
    out.insert("config/crd".into(), crd_copy);
    let rbac = sources(
        root,
        "config/rbac",
        "yaml",
        &["namespace.yaml", "kustomization.yaml"],
    )?;
    out.insert(
        "charts/tessera/files/rbac".into(),
        headed(&rbac, "config/rbac"),
    );
    let classes = sources(
        root,
        "config/deviceclasses",
        "yaml",
        &["kustomization.yaml"],
    )?;
    out.insert(
        "charts/tessera/files/deviceclasses".into(),
        headed(&classes, "config/deviceclasses"),
    );
    let mut monitoring = BTreeMap::new();
    for name in ["prometheus-rules.yaml", "grafana-dashboard.json"] {
        let path = root.join("config/monitoring").join(name);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        // JSON has no comments: the dashboard is copied verbatim.
        let text = if name.ends_with(".yaml") {
            format!("{}{text}", header(&format!("config/monitoring/{name}")))
        } else {
            text
        };
        monitoring.insert(name.to_string(), text);
    }
    out.insert("charts/tessera/files/monitoring".into(), monitoring);
    Ok(out)
}

fn header(source: &str) -> String {
    format!("# Generated by `cargo xtask chart` from {source}: edit that, not this copy.\n")
}

fn headed(files: &BTreeMap<String, String>, dir: &str) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(name, text)| {
            (
                name.clone(),
                format!("{}{text}", header(&format!("{dir}/{name}"))),
            )
        })
        .collect()
}

/// The `*.<ext>` files of `dir` but `skip`, by name.
fn sources(
    root: &Path,
    dir: &str,
    ext: &str,
    skip: &[&str],
) -> anyhow::Result<BTreeMap<String, String>> {
    let path = root.join(dir);
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&path).with_context(|| format!("reading {}", path.display()))? {
        let p = entry?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if p.extension().is_some_and(|x| x == ext) && !skip.contains(&name.as_str()) {
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            out.insert(name, text);
        }
    }
    if out.is_empty() {
        bail!("no *.{ext} files in {}", path.display());
    }
    Ok(out)
}

fn unexpected(dir: &Path, files: &BTreeMap<String, String>) -> anyhow::Result<Vec<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(vec![]);
    };
    Ok(entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !files.contains_key(&name)
        })
        .collect())
}
