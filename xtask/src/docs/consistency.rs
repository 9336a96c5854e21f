//! The checks that code and hand-written docs name the same things, in both directions:
//! what exists is documented, and what is documented exists. Each takes the texts it
//! compares and returns one line per disagreement.

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::Value;

use super::markdown::{code_spans, section_rows, table_rows};

/// The first code span of the first cell of every table row of `text`: the names a
/// reference table documents.
pub fn documented_names(rows: &[Vec<String>]) -> Vec<String> {
    rows.iter()
        .filter_map(|r| code_spans(r.first()?).into_iter().next())
        .collect()
}

/// Values whose keys are the user's (Kubernetes objects passed through as they are): the
/// reference documents the value, not each key inside it.
const FREE_FORM: [&str; 10] = [
    "livenessProbe",
    "readinessProbe",
    "resources",
    "affinity",
    "nodeSelector",
    "labels",
    "podAnnotations",
    "updateStrategy",
    "requests",
    "limits",
];

/// Every value path of a chart's `values.yaml` (`plugin.driver.root`), free-form maps
/// as one path.
pub fn value_paths(prefix: &str, v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, v) in m {
                let k = k.as_str().unwrap_or_default();
                let path = if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                };
                if FREE_FORM.contains(&k) {
                    out.push(path);
                } else {
                    value_paths(&path, v, out);
                }
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

/// Every chart value is a row of the chart-values page and every row is a value; a flag
/// a row names belongs to the binary the value configures.
pub fn chart_values(
    values: &Value,
    page: &str,
    plugin_flags: &BTreeSet<String>,
    operator_flags: &BTreeSet<String>,
) -> Vec<String> {
    let mut paths = Vec::new();
    value_paths("", values, &mut paths);
    let paths: BTreeSet<String> = paths.into_iter().collect();
    let rows = table_rows(page);
    let documented: BTreeSet<String> = documented_names(&rows).into_iter().collect();
    let mut out = Vec::new();
    for p in paths.difference(&documented) {
        out.push(format!(
            "chart value `{p}` (charts/tessera/values.yaml) is not documented in docs/reference/helm-values.md"
        ));
    }
    for p in documented.difference(&paths) {
        out.push(format!(
            "docs/reference/helm-values.md documents `{p}`, which charts/tessera/values.yaml does not have"
        ));
    }
    for row in &rows {
        let Some(value) = row.first().and_then(|c| code_spans(c).into_iter().next()) else {
            continue;
        };
        let flags = if value.starts_with("plugin.") {
            plugin_flags
        } else if value.starts_with("operator.") {
            operator_flags
        } else {
            continue;
        };
        for flag in row.iter().skip(1).flat_map(|c| code_spans(c)) {
            let Some(name) = flag.strip_prefix("--") else {
                continue;
            };
            let name = name.split(['=', ' ']).next().unwrap_or_default();
            if !flags.contains(name) {
                out.push(format!(
                    "docs/reference/helm-values.md: `{value}` names the flag --{name}, which its binary does not have"
                ));
            }
        }
    }
    out
}

/// The metrics a Rust source registers (`registry.register("name", "help", value)`), as
/// scraped with `prefix` (`tessera_plugin_`): name (`_total` for counters) → type, the
/// type read from the `let` that makes the registered value. Read from the source rather
/// than from an exposition, because a labelled family is not exposed until it has a
/// series.
pub fn metric_registrations(source: &str, prefix: &str) -> BTreeMap<String, String> {
    let code = without_tests(source);
    let mut out = BTreeMap::new();
    let mut rest = code;
    while let Some(i) = rest.find(".register(") {
        let call = &rest[i + ".register(".len()..];
        rest = call;
        // `"name", "help", value`: two string literals (the help may hold commas).
        let Some((name, after)) = string_literal(call) else {
            continue;
        };
        let Some((_, after)) = after
            .trim_start()
            .strip_prefix(',')
            .and_then(string_literal)
        else {
            continue;
        };
        let Some(value) = after.trim_start().strip_prefix(',') else {
            continue;
        };
        let var: String = value
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let kind = code
            .find(&format!("let {var} ="))
            .map(|d| &code[d..])
            .map(|decl| &decl[..decl.find(';').unwrap_or(decl.len())])
            .and_then(|decl| {
                ["Histogram", "Counter", "Gauge"]
                    .into_iter()
                    .find(|k| decl.contains(k))
            })
            .unwrap_or("unknown")
            .to_lowercase();
        let full = if kind == "counter" {
            format!("{prefix}{name}_total")
        } else {
            format!("{prefix}{name}")
        };
        out.insert(full, kind);
    }
    out
}

/// Every metric the binaries register is a row of the metrics page with its type, and
/// every row is a metric.
pub fn metrics(families: &BTreeMap<String, String>, page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let rows = table_rows(page);
    let mut documented = BTreeMap::new();
    for r in &rows {
        let Some(name) = r.first().and_then(|c| code_spans(c).into_iter().next()) else {
            continue;
        };
        if name.starts_with("tessera_") {
            documented.insert(name, r.get(1).cloned().unwrap_or_default());
        }
    }
    for (name, kind) in families {
        match documented.get(name) {
            None => out.push(format!(
                "metric {name} ({kind}) is not documented in docs/reference/metrics.md"
            )),
            Some(t) if t.trim() != kind => out.push(format!(
                "docs/reference/metrics.md says {name} is a {}, the code registers a {kind}",
                t.trim()
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !families.contains_key(name) {
            out.push(format!(
                "docs/reference/metrics.md documents {name}, which no binary registers"
            ));
        }
    }
    out
}

/// The crates' names, which `tessera_*` module paths (`RUST_LOG=tessera_plugin::…`) use.
const CRATES: [&str; 9] = [
    "tessera_api",
    "tessera_gpu",
    "tessera_kit",
    "tessera_cli",
    "tessera_e2e",
    "tessera_plugin",
    "tessera_operator",
    "tessera_simulate",
    "tessera_simdriver",
];

/// `tessera_*` metric names a document mentions that no binary serves (a histogram's
/// `_bucket`, `_sum` and `_count` series are served).
pub fn metric_mentions(families: &BTreeMap<String, String>, file: &str, text: &str) -> Vec<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("tessera_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..len];
        let next = tail[len..].chars().next();
        rest = &tail[len..];
        let word_start = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-'));
        if !word_start || next == Some(':') || CRATES.contains(&name) || name.ends_with('_') {
            continue;
        }
        let served = families.contains_key(name)
            || ["_bucket", "_sum", "_count"].iter().any(|s| {
                name.strip_suffix(s)
                    .is_some_and(|base| families.get(base).is_some_and(|k| k == "histogram"))
            });
        if !served {
            out.insert(format!("{file} mentions {name}, which no binary serves"));
        }
    }
    out.into_iter().collect()
}

/// The string literal `text` starts with (after white space), and what follows it.
fn string_literal(text: &str) -> Option<(&str, &str)> {
    let body = text.trim_start().strip_prefix('"')?;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some((&body[..i], &body[i + 1..])),
            _ => escaped = false,
        }
    }
    None
}

/// `pub const NAME: &str = "value";` of the module `module` of a Rust source.
fn module_consts(source: &str, module: &str) -> BTreeSet<String> {
    let Some(start) = source.find(&format!("pub mod {module} {{")) else {
        return BTreeSet::new();
    };
    let body = &source[start..];
    let end = body.find("\n}").unwrap_or(body.len());
    body[..end]
        .lines()
        .filter_map(|l| {
            let v = l.trim().strip_prefix("pub const ")?.split_once('=')?.1;
            Some(v.trim().trim_end_matches(';').trim_matches('"').to_string())
        })
        .collect()
}

/// The code of a Rust source before its `#[cfg(test)]` module.
fn without_tests(source: &str) -> &str {
    source.find("#[cfg(test)]").map_or(source, |i| &source[..i])
}

/// Every string literal right after `marker` in `source`.
fn literals_after(source: &str, marker: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = source;
    while let Some(i) = rest.find(marker) {
        let tail = &rest[i + marker.len()..];
        if let Some(end) = tail.find('"') {
            out.insert(tail[..end].to_string());
        }
        rest = tail;
    }
    out
}

/// The condition types and reasons and event reasons the code writes.
pub struct Reasons {
    /// `api/src/conditions.rs` `types`.
    pub condition_types: BTreeSet<String>,
    /// `api/src/conditions.rs` `reasons`, and the reasons of the claim device conditions.
    pub condition_reasons: BTreeSet<String>,
    /// `reason: "…"` of the events the operator and the plugin record.
    pub event_reasons: BTreeSet<String>,
}

impl Reasons {
    /// From the text of `api/src/conditions.rs` and of the operator's and plugin's
    /// sources (tests left out), plus `extra_types` (conditions named elsewhere, such as
    /// the claim device conditions of binding conditions).
    pub fn from_sources<'a>(
        conditions_rs: &str,
        sources: impl Iterator<Item = &'a str>,
        extra_types: &[&str],
    ) -> Self {
        let mut condition_types = module_consts(conditions_rs, "types");
        condition_types.extend(extra_types.iter().map(|s| s.to_string()));
        let mut condition_reasons = module_consts(conditions_rs, "reasons");
        let mut event_reasons = BTreeSet::new();
        for source in sources {
            let code = without_tests(source);
            event_reasons.extend(literals_after(code, "reason: \""));
            // Device conditions on a claim: `(SWITCHED_CONDITION, "GpuSwitched", …)`.
            condition_reasons.extend(literals_after(code, "_CONDITION, \""));
        }
        Self {
            condition_types,
            condition_reasons,
            event_reasons,
        }
    }

    fn all(&self) -> BTreeSet<String> {
        self.condition_types
            .iter()
            .chain(&self.condition_reasons)
            .chain(&self.event_reasons)
            .cloned()
            .collect()
    }
}

/// Every condition type and reason and every event reason is a row of the conditions
/// page, and every row is one the code writes.
pub fn reasons(code: &Reasons, page: &str) -> Vec<String> {
    let documented: BTreeSet<String> = documented_names(&table_rows(page)).into_iter().collect();
    let all = code.all();
    let mut out = Vec::new();
    for r in all.difference(&documented) {
        out.push(format!(
            "condition or event reason `{r}` is not documented in docs/reference/conditions-and-events.md"
        ));
    }
    for r in documented.difference(&all) {
        out.push(format!(
            "docs/reference/conditions-and-events.md documents `{r}`, which the code does not write"
        ));
    }
    out
}

/// One permission: (API group, resource, verb, resource name).
type Grant = (String, String, String, String);

/// The grants of every Role and ClusterRole of an RBAC file, by `Kind name`.
pub fn rbac_grants(yaml: &str) -> anyhow::Result<BTreeMap<String, BTreeSet<Grant>>> {
    let mut out = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        let kind = v["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        let mut grants = BTreeSet::new();
        for rule in v["rules"].as_sequence().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_sequence()
                    .map(|s| {
                        s.iter()
                            .filter_map(|x| x.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let names = list("resourceNames");
            let names = if names.is_empty() {
                vec![String::new()]
            } else {
                names
            };
            for g in list("apiGroups") {
                for r in list("resources") {
                    for verb in list("verbs") {
                        for n in &names {
                            grants.insert((g.clone(), r.clone(), verb.clone(), n.clone()));
                        }
                    }
                }
            }
        }
        out.insert(format!("{kind} {name}"), grants);
    }
    Ok(out)
}

/// The grants a security page's table under the heading ``{Kind} `{name}` `` (optionally
/// followed by more words) lists: rows of API group (`core` for the core group),
/// resources (a `(name x)` after a resource restricts it to that resource name), verbs.
fn documented_grants(page: &str, kind: &str, name: &str) -> Option<BTreeSet<Grant>> {
    let heading = format!("{kind} `{name}`");
    let text_heading = page
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .find(|h| *h == heading || h.starts_with(&format!("{heading} ")))?;
    let rows = section_rows(page, text_heading)?;
    let mut out = BTreeSet::new();
    for row in rows.iter().skip(1) {
        let [group, resources, verbs, ..] = row.as_slice() else {
            continue;
        };
        let group = match code_spans(group).first() {
            Some(g) => g.clone(),
            None if group.trim() == "core" => String::new(),
            None => continue,
        };
        let resource_name = resources
            .split_once("(name ")
            .and_then(|(_, n)| code_spans(n).into_iter().next())
            .unwrap_or_default();
        let resources = resources.split("(name ").next().unwrap_or_default();
        for r in code_spans(resources) {
            for v in code_spans(verbs) {
                out.insert((group.clone(), r.clone(), v, resource_name.clone()));
            }
        }
    }
    Some(out)
}

/// The security page lists exactly the grants of `config/rbac/`.
pub fn rbac(files: &[(&str, String)], page: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for (file, yaml) in files {
        for (role, grants) in rbac_grants(yaml)? {
            let (kind, name) = role.split_once(' ').unwrap_or_default();
            let Some(documented) = documented_grants(page, kind, name) else {
                out.push(format!(
                    "docs/operations/security.md has no section \"### {kind} `{name}`\" with the rules of {file}"
                ));
                continue;
            };
            let show = |g: &Grant| {
                let group = if g.0.is_empty() { "core" } else { &g.0 };
                let named = if g.3.is_empty() {
                    String::new()
                } else {
                    format!(" (name {})", g.3)
                };
                format!("{group} {}{named} {}", g.1, g.2)
            };
            for g in grants.difference(&documented) {
                out.push(format!(
                    "{file}: {role} grants `{}`, which docs/operations/security.md does not list",
                    show(g)
                ));
            }
            for g in documented.difference(&grants) {
                out.push(format!(
                    "docs/operations/security.md lists `{}` for {role}, which {file} does not grant",
                    show(g)
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_both_ways_and_flags_by_binary() {
        let values: Value =
            serde_yaml::from_str("plugin: {a: 1, resources: {x: 1}}\noperator: {b: 2}\n").unwrap();
        let page = "| value | meaning |\n|---|---|\n| `plugin.a` | sets `--a-flag` |\n| `plugin.resources` | x |\n| `operator.c` | gone |\n";
        let plugin: BTreeSet<String> = ["a-flag".to_string()].into();
        let problems = chart_values(&values, page, &plugin, &BTreeSet::new());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("`operator.b`"), "{problems:?}");
        assert!(problems[1].contains("`operator.c`"), "{problems:?}");
        let problems = chart_values(&values, page, &BTreeSet::new(), &BTreeSet::new());
        assert!(
            problems.iter().any(|p| p.contains("--a-flag")),
            "{problems:?}"
        );
    }

    #[test]
    fn metrics_are_checked_by_name_and_type() {
        let source = r#"
            let a = Family::<ResultLabel, Counter>::default();
            let b = Gauge::default();
            let c = Family::<L, Histogram>::new_with_constructor(h as fn() -> Histogram);
            registry.register("a", "A counter", a.clone());
            registry.register(
                "b",
                "A gauge, with, commas",
                b.clone(),
            );
            registry.register("c", "A histogram", c.clone());
        "#;
        let families = metric_registrations(source, "tessera_");
        assert_eq!(
            families,
            [
                ("tessera_a_total", "counter"),
                ("tessera_b", "gauge"),
                ("tessera_c", "histogram")
            ]
            .map(|(n, k)| (n.to_string(), k.to_string()))
            .into()
        );
        let page = "| metric | type |\n|---|---|\n| `tessera_a_total` | counter |\n| `tessera_b` | counter |\n| `tessera_d` | gauge |\n";
        let problems = metrics(&families, page);
        assert_eq!(problems.len(), 3, "{problems:?}");
        let mentions = metric_mentions(
            &families,
            "f.md",
            "`tessera_c_bucket` RUST_LOG=tessera_plugin::x tessera_e tessera_operator `tessera_a_total`",
        );
        assert_eq!(
            mentions,
            ["f.md mentions tessera_e, which no binary serves"]
        );
    }

    #[test]
    fn reasons_come_from_the_constants_and_the_event_literals() {
        let conditions = "pub mod types {\n    pub const READY: &str = \"Ready\";\n}\npub mod reasons {\n    pub const A: &str = \"AsExpected\";\n}\n";
        let operator =
            "Event { reason: \"Moved\".into() }\n#[cfg(test)]\nmod tests { reason: \"InATest\" }";
        let plugin = "(SWITCHED_CONDITION, \"GpuSwitched\", m)";
        let code = Reasons::from_sources(conditions, [operator, plugin].into_iter(), &["x/y"]);
        assert_eq!(
            code.all(),
            ["AsExpected", "GpuSwitched", "Moved", "Ready", "x/y"]
                .map(String::from)
                .into()
        );
        let page = "| reason |\n|---|\n| `Ready` |\n| `AsExpected` |\n| `Moved` |\n| `x/y` |\n| `Gone` |\n";
        let problems = reasons(&code, page);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn the_security_page_must_list_the_rules_verb_for_verb() {
        let yaml = "kind: ClusterRole\nmetadata: {name: r}\nrules:\n- apiGroups: [\"\"]\n  resources: [pods]\n  verbs: [list, watch]\n- apiGroups: [g]\n  resources: [x/driver]\n  resourceNames: [n]\n  verbs: [patch]\n";
        let page = "### ClusterRole `r`\n\n| API group | resources | verbs |\n|---|---|---|\n| core | `pods` | `list`, `watch` |\n| `g` | `x/driver` (name `n`) | `patch` |\n";
        assert!(rbac(&[("f", yaml.into())], page).unwrap().is_empty());
        let short = page.replace("`list`, `watch`", "`list`");
        let problems = rbac(&[("f", yaml.into())], &short).unwrap();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("core pods watch"), "{problems:?}");
    }
}
