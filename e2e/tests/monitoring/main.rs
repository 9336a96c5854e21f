//! The shipped Grafana dashboard and Prometheus alerts query only metrics the binaries
//! really expose: a renamed metric fails here, not on a platform team's pager.

// Test fixtures panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use tessera_e2e::repo_root;

/// Every series name the plugin and the operator expose (a counter `x` is exposed as
/// `x_total`, a histogram as `x_bucket`, `x_sum`, `x_count`). A labelled family shows
/// only once it has a series, so each recorder is called once first.
fn exposed() -> BTreeSet<String> {
    use std::{collections::BTreeMap, time::Duration};

    let plugin = tessera_plugin::metrics::Metrics::new();
    plugin.observe_prepare(Duration::from_millis(1), false);
    plugin.observe_unprepare(Duration::from_millis(1), true);
    plugin.observe_hardware("mig_create", Duration::from_millis(1));
    plugin.observe_publish(true);
    let one = BTreeMap::from([("mig".to_string(), 1)]);
    plugin.set_published(&one);
    plugin.set_prepared(&one);
    let operator = tessera_operator::metrics::Metrics::new();
    operator.observe_pass(Duration::from_millis(1), true);
    operator.error("spec_write");
    operator.wrote("gpunode_spec");
    operator.set_gpus(&BTreeMap::from([(("p".to_string(), "MIG".to_string()), 1)]));
    operator.adaptive_change("MIG", "MPS", "applied", Some(Duration::from_secs(1)));
    let mut demand = tessera_operator::demand::Demand::default();
    demand.pending.insert(
        "ns/c".into(),
        tessera_operator::demand::PendingClaim {
            claim: "ns/c".into(),
            pods: BTreeSet::new(),
            requests: vec![tessera_operator::demand::RequestDemand {
                name: "gpu".into(),
                alternatives: vec![(tessera_operator::demand::Shape::Whole, 1)],
            }],
        },
    );
    operator.set_unmet(&demand);
    let text = plugin.render() + &operator.render();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The `tessera_…` metric names a query text mentions.
fn queried(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("tessera_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_dashboard_and_the_alerts_query_only_exposed_metrics() {
    let exposed = exposed();
    assert!(exposed.contains("tessera_plugin_ready"), "{exposed:?}");
    let dir = repo_root().join("config/monitoring");

    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("grafana-dashboard.json")).unwrap())
            .unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");

    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("prometheus-rules.yaml")).unwrap())
            .unwrap();
    let mut alerts = Vec::new();
    for group in rules["spec"]["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            assert!(
                rule["labels"]["severity"].as_str().is_some()
                    && rule["annotations"]["summary"].as_str().is_some()
                    && rule["annotations"]["description"].as_str().is_some(),
                "alert {name} needs a severity, a summary and a description"
            );
            alerts.push((name.to_string(), rule["expr"].as_str().unwrap().to_string()));
        }
    }
    assert!(alerts.len() >= 8, "{alerts:?}");

    let mut missing = Vec::new();
    for (what, expr) in exprs
        .iter()
        .map(|e| ("dashboard", e.as_str()))
        .chain(alerts.iter().map(|(n, e)| (n.as_str(), e.as_str())))
    {
        let names = queried(expr);
        assert!(
            !names.is_empty(),
            "{what}: {expr} queries no Tessera metric"
        );
        for n in names {
            if !exposed.contains(&n) {
                missing.push(format!("{what}: {n}"));
            }
        }
    }
    assert!(missing.is_empty(), "not exposed by any binary: {missing:?}");
}

#[test]
fn a_metric_no_binary_exposes_is_caught() {
    let exposed = exposed();
    let names = queried("rate(tessera_plugin_prepare_errors_total[5m]) > 0");
    assert_eq!(names.len(), 1);
    assert!(names.iter().all(|n| !exposed.contains(n)));
}
