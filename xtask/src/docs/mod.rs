//! `cargo xtask docs [--check]`: the reference pages generated from their sources, and
//! the check that the hand-written docs and the code name the same things.
//!
//! Generated (rewritten by `cargo xtask docs`, compared by `--check`):
//!
//! | page | source |
//! |---|---|
//! | `docs/reference/tessera-plugin.md` | the plugin's clap `Args` |
//! | `docs/reference/tessera-operator.md` | the operator's clap `Args` |
//! | `docs/reference/kubectl-tessera.md` | `kubectl tessera`'s clap `Cli` |
//! | `docs/reference/api.md` | `crds/*.yaml` |
//! | `docs/reference/alerts.md` | `config/monitoring/prometheus-rules.yaml` |
//! | `docs/development/xtask.md` | `cargo xtask`'s clap `Cli` |
//!
//! Checked both ways against the code (see [`consistency`]): chart values, metrics,
//! condition and event reasons, the RBAC the security page lists, flags having help text,
//! and every relative link of the docs. `cargo xtask test` runs the check as a step, and
//! `cargo test -p xtask` runs it as a unit test.

mod consistency;
mod markdown;
mod render;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use clap::CommandFactory;

use crate::steps::repo_root;

#[derive(clap::Args)]
pub struct Args {
    /// Do not write: fail, naming each stale page and each disagreement between the docs
    /// and the code.
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let root = repo_root()?;
    if args.check {
        return check(&root);
    }
    for (path, text) in generated(&root)? {
        let file = root.join(&path);
        if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
            println!("wrote {}", path.display());
        }
    }
    let problems = problems(&root, &Commands::of_the_code())?;
    if !problems.is_empty() {
        bail!(
            "the docs and the code disagree:\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// Fails, listing every stale generated page and every disagreement.
pub fn check(root: &Path) -> anyhow::Result<()> {
    let mut all = stale(root, &generated(root)?);
    all.extend(problems(root, &Commands::of_the_code())?);
    if !all.is_empty() {
        bail!(
            "the docs do not match the code:\n  {}\nrun `cargo xtask docs` for the generated pages; the rest is hand-written",
            all.join("\n  ")
        );
    }
    println!("the docs match the code");
    Ok(())
}

/// The command-line definitions the docs describe.
pub struct Commands {
    pub plugin: clap::Command,
    pub operator: clap::Command,
    pub cli: clap::Command,
    pub xtask: clap::Command,
}

impl Commands {
    pub fn of_the_code() -> Self {
        Self {
            plugin: tessera_plugin::config::Args::command(),
            operator: tessera_operator::config::Args::command(),
            cli: tessera_cli::Cli::command(),
            xtask: crate::Cli::command(),
        }
    }
}

fn read(root: &Path, path: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(root.join(path)).with_context(|| format!("reading {path}"))
}

/// Every generated page, by path relative to the repository.
pub fn generated(root: &Path) -> anyhow::Result<BTreeMap<PathBuf, String>> {
    generated_from(root, &Commands::of_the_code())
}

fn generated_from(root: &Path, cmds: &Commands) -> anyhow::Result<BTreeMap<PathBuf, String>> {
    let mut out = BTreeMap::new();
    out.insert(
        "docs/reference/tessera-plugin.md".into(),
        render::flags_page(
            &cmds.plugin,
            "the plugin's clap definitions (plugin/src/config.rs, plugin/src/kubelet/config.rs)",
            "Every flag has an environment twin. The chart sets the ones its values name \
             ([chart values](helm-values.md)); what the plugin does: \
             [the plugin](../concepts/plugin.md).",
        ),
    );
    out.insert(
        "docs/reference/tessera-operator.md".into(),
        render::flags_page(
            &cmds.operator,
            "the operator's clap definitions (operator/src/config.rs)",
            "Every flag has an environment twin. The chart runs the operator with \
             `--leader-elect` and sets the flags its values name \
             ([chart values](helm-values.md)); what the operator does: \
             [policies and GpuNodes](../concepts/policies.md), [Adaptive](../concepts/adaptive.md).",
        ),
    );
    out.insert(
        "docs/reference/kubectl-tessera.md".into(),
        render::help_page(
            cmds.cli.clone(),
            "kubectl-tessera",
            "its clap definitions (cli/src/)",
            "The kubectl plugin (`kubectl tessera …` once `kubectl-tessera` is on `PATH`), \
             as `--help` prints each subcommand. How to use it: \
             [kubectl tessera](../guides/kubectl-tessera.md), \
             [simulate](../guides/simulate.md).",
        ),
    );
    out.insert(
        "docs/development/xtask.md".into(),
        render::help_page(
            cmds.xtask.clone(),
            "cargo xtask",
            "its clap definitions (xtask/src/)",
            "The project's task runner, as `--help` prints each command. What each is for: \
             [development](README.md).",
        ),
    );
    let mut crds = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(root.join("crds"))
        .context("reading crds/")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    names.sort();
    for p in names {
        let name = p
            .file_name()
            .map(|n| format!("crds/{}", n.to_string_lossy()))
            .unwrap_or_default();
        let crd: serde_yaml::Value =
            serde_yaml::from_str(&read(root, &name)?).with_context(|| format!("parsing {name}"))?;
        crds.push((name, crd));
    }
    // The policy first: it is what people write.
    crds.sort_by_key(|(n, _)| !n.contains("gpusharingpolicies"));
    out.insert("docs/reference/api.md".into(), render::api_page(&crds)?);
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read(root, "config/monitoring/prometheus-rules.yaml")?)
            .context("parsing config/monitoring/prometheus-rules.yaml")?;
    out.insert(
        "docs/reference/alerts.md".into(),
        render::alerts_page(&render::alerts(&rules)?),
    );
    Ok(out)
}

/// The generated pages that differ from what is committed.
fn stale(root: &Path, pages: &BTreeMap<PathBuf, String>) -> Vec<String> {
    pages
        .iter()
        .filter(|(path, text)| {
            std::fs::read_to_string(root.join(path)).ok().as_deref() != Some(text.as_str())
        })
        .map(|(path, _)| format!("{} is stale", path.display()))
        .collect()
}

/// The flags of a binary by long name.
fn flag_names(cmd: &clap::Command) -> BTreeSet<String> {
    render::flags(cmd).into_iter().map(|f| f.long).collect()
}

/// The Markdown files the docs check reads: `docs/` and the repository's front pages.
fn markdown_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = [
        "README.md",
        "CONTRIBUTING.md",
        "SECURITY.md",
        "CHANGELOG.md",
        "charts/tessera/README.md",
    ]
    .iter()
    .map(PathBuf::from)
    .filter(|p| root.join(p).is_file())
    .collect();
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(root.join(&dir))
            .with_context(|| format!("reading {}", dir.display()))?
        {
            let entry = entry?;
            let rel = dir.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                dirs.push(rel);
            } else if rel.extension().is_some_and(|x| x == "md") {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Every disagreement between the hand-written docs and the code.
fn problems(root: &Path, cmds: &Commands) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();

    // Flags: each has a help text, and the reference pages list exactly the code's.
    for (cmd, page) in [
        (&cmds.plugin, "docs/reference/tessera-plugin.md"),
        (&cmds.operator, "docs/reference/tessera-operator.md"),
    ] {
        let code = flag_names(cmd);
        for f in render::flags(cmd) {
            if f.help.trim().is_empty() {
                out.push(format!(
                    "flag --{} of {} has no help text",
                    f.long,
                    cmd.get_name()
                ));
            }
        }
        let text = std::fs::read_to_string(root.join(page)).unwrap_or_default();
        let documented: BTreeSet<String> =
            consistency::documented_names(&markdown::table_rows(&text))
                .iter()
                .filter_map(|n| n.rsplit("--").next().map(String::from))
                .collect();
        for f in code.difference(&documented) {
            out.push(format!(
                "flag --{f} of {} is not documented in {page}",
                cmd.get_name()
            ));
        }
        for f in documented.difference(&code) {
            out.push(format!(
                "{page} documents --{f}, which {} does not have",
                cmd.get_name()
            ));
        }
    }

    let values: serde_yaml::Value =
        serde_yaml::from_str(&read(root, "charts/tessera/values.yaml")?)
            .context("parsing charts/tessera/values.yaml")?;
    out.extend(consistency::chart_values(
        &values,
        &read(root, "docs/reference/helm-values.md")?,
        &flag_names(&cmds.plugin),
        &flag_names(&cmds.operator),
    ));

    let mut families = BTreeMap::new();
    for (file, prefix) in [
        ("kit/src/build_info.rs", "tessera_"),
        ("plugin/src/metrics.rs", "tessera_plugin_"),
        ("operator/src/metrics.rs", "tessera_operator_"),
    ] {
        let registered = consistency::metric_registrations(&read(root, file)?, prefix);
        if registered.is_empty() {
            out.push(format!(
                "{file} registers no metric the docs check can read"
            ));
        }
        families.extend(registered);
    }
    out.extend(consistency::metrics(
        &families,
        &read(root, "docs/reference/metrics.md")?,
    ));

    let mut sources = Vec::new();
    for dir in ["operator/src", "plugin/src"] {
        rust_sources(&root.join(dir), &mut sources)?;
    }
    let texts: Vec<String> = sources
        .iter()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .collect::<anyhow::Result<_>>()?;
    let reasons = consistency::Reasons::from_sources(
        &read(root, "api/src/conditions.rs")?,
        texts.iter().map(String::as_str),
        &[
            tessera_api::constants::SWITCHED_CONDITION,
            tessera_api::constants::SWITCH_FAILED_CONDITION,
        ],
    );
    out.extend(consistency::reasons(
        &reasons,
        &read(root, "docs/reference/conditions-and-events.md")?,
    ));

    let rbac: Vec<(&str, String)> = ["config/rbac/operator.yaml", "config/rbac/plugin.yaml"]
        .into_iter()
        .map(|f| read(root, f).map(|t| (f, t)))
        .collect::<anyhow::Result<_>>()?;
    out.extend(consistency::rbac(
        &rbac,
        &read(root, "docs/operations/security.md")?,
    )?);

    // Links resolve, anchors included; metric names are served.
    let files = markdown_files(root)?;
    let mut texts: BTreeMap<PathBuf, String> = BTreeMap::new();
    for f in &files {
        texts.insert(f.clone(), read(root, &f.to_string_lossy())?);
    }
    for (file, text) in &texts {
        let name = file.display().to_string();
        out.extend(consistency::metric_mentions(&families, &name, text));
        for link in markdown::relative_links(text) {
            if let Some(problem) = broken(root, file, &link.target, &texts) {
                out.push(format!(
                    "{name}:{}: link {}: {problem}",
                    link.line, link.target
                ));
            }
        }
    }
    Ok(out)
}

/// Why a relative link of `file` leads nowhere, if it does.
fn broken(
    root: &Path,
    file: &Path,
    target: &str,
    texts: &BTreeMap<PathBuf, String>,
) -> Option<String> {
    let (path, fragment) = match target.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else {
        normalize(&file.parent().unwrap_or(Path::new("")).join(path))?
    };
    if !root.join(&dest).exists() {
        return Some(format!("{} does not exist", dest.display()));
    }
    let fragment = fragment?;
    let text = match texts.get(&dest) {
        Some(t) => t.clone(),
        None if dest.extension().is_some_and(|x| x == "md") => {
            std::fs::read_to_string(root.join(&dest)).ok()?
        }
        None => return None,
    };
    (!markdown::anchors(&text).iter().any(|a| a == fragment))
        .then(|| format!("{} has no heading #{fragment}", dest.display()))
}

/// `a/b/../c` → `a/c`; `None` for a path that leaves the repository.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    Some(out)
}

/// The `.rs` files under `dir`, tests (`tests.rs`, `tests/`) left out.
fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = entry?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if p.is_dir() {
            if name != "tests" {
                rust_sources(&p, out)?;
            }
        } else if p.extension().is_some_and(|x| x == "rs") && name != "tests.rs" {
            out.push(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Arg;

    use super::*;

    #[test]
    fn the_docs_match_the_code() {
        let root = repo_root().unwrap();
        if let Err(e) = check(&root) {
            panic!("{e}");
        }
    }

    /// A flag added to the plugin without a help text and without regenerating the docs
    /// is named three ways: no help text, missing from the reference page, and the page
    /// stale.
    #[test]
    fn an_undocumented_flag_fails_the_check() {
        let root = repo_root().unwrap();
        let mut cmds = Commands::of_the_code();
        cmds.plugin = cmds.plugin.arg(Arg::new("gpu-budget").long("gpu-budget"));
        let problems = problems(&root, &cmds).unwrap();
        assert!(
            problems.contains(&"flag --gpu-budget of tessera-plugin has no help text".to_string()),
            "{problems:?}"
        );
        assert!(
            problems.contains(
                &"flag --gpu-budget of tessera-plugin is not documented in docs/reference/tessera-plugin.md"
                    .to_string()
            ),
            "{problems:?}"
        );
        let pages = generated_from(&root, &cmds).unwrap();
        assert_eq!(
            stale(&root, &pages),
            ["docs/reference/tessera-plugin.md is stale"]
        );
    }

    #[test]
    fn links_are_resolved_from_the_linking_file() {
        assert_eq!(
            normalize(Path::new("docs/guides/../concepts/x.md")),
            Some(PathBuf::from("docs/concepts/x.md"))
        );
        assert_eq!(normalize(Path::new("../outside")), None);
    }
}
