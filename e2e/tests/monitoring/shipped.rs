//! What `config/monitoring` ships, read as Prometheus and Grafana read it: the alerts of the
//! PrometheusRule (and its groups as a plain rule file), the dashboard's queries with
//! Grafana's variables expanded, and the rule unit tests.

use std::collections::BTreeMap;

use serde_yaml::Value as Yaml;
use tessera_e2e::repo_root;

/// One alerting rule.
pub struct Alert {
    pub name: String,
    pub expr: String,
    pub for_: String,
    pub annotations: BTreeMap<String, String>,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn rule_resource() -> Yaml {
    serde_yaml::from_str(&read("config/monitoring/prometheus-rules.yaml")).unwrap()
}

/// The PrometheusRule's `spec` (its groups): what the Prometheus Operator hands Prometheus
/// as a rule file.
pub fn rule_file() -> String {
    serde_yaml::to_string(&rule_resource()["spec"]).unwrap()
}

/// Every alert, in file order.
pub fn alerts() -> Vec<Alert> {
    let rules = rule_resource();
    let mut out = Vec::new();
    for group in rules["spec"]["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"]
                .as_str()
                .unwrap_or_else(|| {
                    panic!("a rule without `alert` (recording rules are not shipped): {rule:?}")
                })
                .to_string();
            let annotations = rule["annotations"]
                .as_mapping()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            (
                                k.as_str().unwrap().to_string(),
                                v.as_str().unwrap().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Alert {
                expr: rule["expr"].as_str().unwrap().to_string(),
                for_: rule["for"].as_str().unwrap_or("0m").to_string(),
                annotations,
                name,
            });
        }
    }
    out
}

/// The dashboard JSON.
pub fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read("config/monitoring/grafana-dashboard.json")).unwrap()
}

/// Every panel, rows' collapsed panels included.
pub fn panels(dashboard: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        out.push(p.clone());
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter().cloned());
        }
    }
    out
}

/// One query of a panel.
pub struct Query {
    /// `panel title / refId`, for messages.
    pub what: String,
    /// As written in the dashboard.
    pub expr: String,
}

/// Every panel query, in dashboard order.
pub fn queries(dashboard: &serde_json::Value) -> Vec<Query> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                what: format!(
                    "panel {:?} query {}",
                    p["title"].as_str().unwrap_or("?"),
                    t["refId"].as_str().unwrap_or("?")
                ),
                expr: t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {:?}: a target without expr", p["title"]))
                    .to_string(),
            });
        }
    }
    out
}

/// A query as Grafana sends it: `$__rate_interval` a minute (its value for Grafana's
/// default 15 s scrape interval), the node and policy variables at "All". Any other
/// variable is an error: it would reach Prometheus unexpanded.
pub fn expand(expr: &str) -> Result<String, String> {
    let out = expr
        .replace("$__rate_interval", "1m")
        .replace("$node", ".*")
        .replace("$policy", ".*");
    match out.find('$') {
        Some(i) => Err(format!(
            "unknown Grafana variable at {:?} in {expr}",
            &out[i..]
        )),
        None => Ok(out),
    }
}

/// The dashboard's query variables: (name, metric, label) of each
/// `label_values(metric, label)`.
pub fn label_variables(dashboard: &serde_json::Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["definition"].as_str().unwrap();
        let args = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| {
                panic!(
                    "variable {}: not label_values(metric, label): {q}",
                    v["name"]
                )
            });
        let (metric, label) = args.split_once(',').unwrap();
        out.push((
            v["name"].as_str().unwrap().to_string(),
            metric.trim().to_string(),
            label.trim().to_string(),
        ));
    }
    out
}

/// A rule unit test case of `alerts.test.yaml`: one `alert_rule_test` entry.
pub struct Case {
    /// The test's name.
    pub test: String,
    pub alert: String,
    /// Minutes.
    pub eval_minutes: u64,
    /// The expected firing alerts: (labels, annotations) of each.
    pub expected: Vec<(BTreeMap<String, String>, BTreeMap<String, String>)>,
}

/// The rule unit tests file's text.
pub fn rule_tests_text() -> String {
    read("e2e/tests/monitoring/alerts.test.yaml")
}

fn string_map(v: &Yaml) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.as_str().unwrap().to_string(),
                        v.as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `5m`, `1h` (whole minutes; what the tests and rules use).
pub fn minutes(d: &str) -> u64 {
    let (n, unit) = d.split_at(d.len() - 1);
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("not a duration: {d}"));
    match unit {
        "m" => n,
        "h" => n * 60,
        _ => panic!("not whole minutes or hours: {d}"),
    }
}

/// Every case of the rule unit tests.
pub fn rule_cases() -> Vec<Case> {
    let doc: Yaml = serde_yaml::from_str(&rule_tests_text()).unwrap();
    let mut out = Vec::new();
    for test in doc["tests"].as_sequence().unwrap() {
        let name = test["name"].as_str().unwrap_or("?");
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            out.push(Case {
                test: name.to_string(),
                alert: case["alertname"].as_str().unwrap().to_string(),
                eval_minutes: minutes(case["eval_time"].as_str().unwrap()),
                expected: case["exp_alerts"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        (
                            string_map(&a["exp_labels"]),
                            string_map(&a["exp_annotations"]),
                        )
                    })
                    .collect(),
            });
        }
    }
    out
}

/// GitHub's anchor for a Markdown heading: lower case, punctuation but `-` and `_`
/// dropped, spaces to `-`.
pub fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings.
pub fn anchors(markdown: &str) -> Vec<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| github_anchor(l.trim_start_matches('#')))
        .collect()
}

/// The workspace's `repository` (Cargo.toml).
pub fn repository() -> String {
    read("Cargo.toml")
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix("repository")?.trim().strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_string())
        })
        .expect("Cargo.toml has a repository")
}

/// The runbooks' text.
pub fn runbooks() -> String {
    read("docs/operations/runbooks.md")
}
