//! The shipped alerts and Grafana dashboard, checked by the Prometheus users run: Prometheus
//! 3 and promtool built from the Go module proxy (`cargo xtask test` builds them and sets
//! `TESSERA_PROMETHEUS_BIN_DIR`; `tessera_e2e::prometheus`).
//!
//! - promtool checks the rules and runs their unit tests (`alerts.test.yaml` here):
//!   every alert fires on the series that should fire it, after its `for`, with the labels
//!   and annotations a person reads, and stays silent on a healthy cluster.
//! - A real Prometheus scrapes a test cluster's plugin and operator (in both exposition
//!   formats), loads the rules and evaluates every dashboard query and alert expression;
//!   a plugin or operator that dies raises its alert, naming the node.

// Test fixtures panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

mod shipped;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
    time::Duration,
};

use serde_json::{Value, json};
use tessera_e2e::{
    cluster,
    operator::OperatorProcess,
    plugin::SimNode,
    prometheus::{Prometheus, PrometheusBins},
    wait::eventually,
};

use shipped::{Case, minutes};

const NS: &str = "workloads";
const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "h100-1";

// === the shipped files, as files ===

#[test]
fn every_alert_says_what_broke_where_and_links_its_runbook() {
    let alerts = shipped::alerts();
    let runbook = format!(
        "{}/blob/main/docs/operations/runbooks.md#",
        shipped::repository()
    );
    let anchors = shipped::anchors(&shipped::runbooks());
    let mut problems = Vec::new();
    for a in &alerts {
        for key in ["summary", "description", "runbook_url"] {
            if a.annotations.get(key).is_none_or(|v| v.trim().is_empty()) {
                problems.push(format!("{}: no {key}", a.name));
            }
        }
        if a.annotations
            .values()
            .any(|v| v.contains("$labels.instance"))
        {
            problems.push(format!(
                "{}: names the pod's address ($labels.instance), not the node",
                a.name
            ));
        }
        match a.annotations.get("runbook_url").and_then(|u| u.strip_prefix(&runbook)) {
            Some(anchor) if anchor == a.name.to_lowercase() && anchors.iter().any(|h| h == anchor) => {}
            _ => problems.push(format!(
                "{}: runbook_url {:?} is not {runbook}{} with a `## {}` heading in docs/operations/runbooks.md",
                a.name,
                a.annotations.get("runbook_url"),
                a.name.to_lowercase(),
                a.name
            )),
        }
    }
    // An alert whose series name a node says it in its summary (as rendered by promtool
    // in the unit tests below).
    for case in shipped::rule_cases() {
        for (labels, annotations) in &case.expected {
            if let Some(node) = labels.get("node")
                && !annotations
                    .get("summary")
                    .is_some_and(|s| s.contains(node.as_str()))
            {
                problems.push(format!(
                    "{} ({}): the summary does not name node {node}",
                    case.alert, case.test
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let names: BTreeSet<&str> = alerts.iter().map(|a| a.name.as_str()).collect();
    for absent in [
        "TesseraPluginDown",
        "TesseraPluginsAbsent",
        "TesseraOperatorDown",
    ] {
        assert!(
            names.contains(absent),
            "no {absent}: a binary that never starts raises nothing"
        );
    }
}

#[test]
fn every_dashboard_panel_queries_the_chosen_prometheus() {
    let dashboard = shipped::dashboard();
    let ds = json!({"type": "prometheus", "uid": "${datasource}"});
    let vars = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "the dashboard has no Prometheus data source variable: {vars:?}"
    );
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    for p in shipped::panels(&dashboard) {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        if !ids.insert(p["id"].as_u64().unwrap()) {
            problems.push(format!("{title}: duplicate id {}", p["id"]));
        }
        if p["type"] == "row" {
            continue;
        }
        if p["datasource"] != ds {
            problems.push(format!(
                "{title}: data source {} is not {ds}",
                p["datasource"]
            ));
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("{title}: no query"));
        }
        for t in targets {
            if t["datasource"] != ds {
                problems.push(format!(
                    "{title} {}: data source {}",
                    t["refId"], t["datasource"]
                ));
            }
        }
    }
    for q in shipped::queries(&dashboard) {
        if let Err(e) = shipped::expand(&q.expr) {
            problems.push(format!("{}: {e}", q.what));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // What `kubectl tessera status` shows, per node and per policy.
    let exprs: Vec<String> = shipped::queries(&dashboard)
        .into_iter()
        .map(|q| q.expr)
        .collect();
    for (what, needle) in [
        ("health per node", "max by (node) (tessera_plugin_ready"),
        (
            "unhealthy GPUs per node",
            "max by (node) (tessera_plugin_unhealthy_gpus",
        ),
        (
            "allocation per node",
            "sum by (node, type) (tessera_plugin_devices_prepared",
        ),
        (
            "shapes per policy",
            "max by (policy, strategy) (tessera_operator_gpus",
        ),
        ("pending demand", "tessera_operator_unmet_devices"),
        ("moves", "tessera_operator_adaptive_changes_total"),
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(needle)),
            "no panel shows {what} ({needle})"
        );
    }
}

// === promtool ===

/// A directory with the rule file promtool and Prometheus read, and the unit tests.
fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("tessera-rules-")
        .tempdir()
        .unwrap();
    std::fs::write(
        dir.path().join("prometheus-rules.yaml"),
        shipped::rule_file(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("alerts.test.yaml"),
        shipped::rule_tests_text(),
    )
    .unwrap();
    dir
}

fn promtool(bins: &PrometheusBins, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bins.promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bins.promtool().display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let bins = PrometheusBins::for_tests().unwrap();
    let dir = rules_dir();
    let alerts = shipped::alerts();
    let (ok, out) = promtool(
        &bins,
        dir.path(),
        &["check", "rules", "prometheus-rules.yaml"],
    );
    assert!(ok, "promtool check rules:\n{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{out}"
    );
    let (ok, out) = promtool(&bins, dir.path(), &["test", "rules", "alerts.test.yaml"]);
    assert!(ok, "promtool test rules:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_unit_tests_cover_every_alert_firing_after_its_for_and_silent() {
    let cases = shipped::rule_cases();
    let mut problems = Vec::new();
    for a in shipped::alerts() {
        let of: Vec<&Case> = cases.iter().filter(|c| c.alert == a.name).collect();
        let firing: Vec<&&Case> = of.iter().filter(|c| !c.expected.is_empty()).collect();
        if firing.is_empty() {
            problems.push(format!("{}: no case where it fires", a.name));
        }
        if !of
            .iter()
            .any(|c| c.expected.is_empty() && c.test.contains("healthy"))
        {
            problems.push(format!(
                "{}: not silent in the healthy cluster test",
                a.name
            ));
        }
        // Silent just before its `for` has passed, firing once it has: some test has a
        // silent case earlier than a firing one.
        let for_ = minutes(&a.for_);
        let timed = firing.iter().any(|f| {
            f.eval_minutes >= for_
                && of.iter().any(|s| {
                    s.test == f.test && s.expected.is_empty() && s.eval_minutes < f.eval_minutes
                })
        });
        if !timed {
            problems.push(format!(
                "{}: no test shows it silent and then firing after its `for` ({})",
                a.name, a.for_
            ));
        }
        for f in &firing {
            for (labels, annotations) in &f.expected {
                if labels.get("severity").is_none() || annotations.len() != a.annotations.len() {
                    problems.push(format!(
                        "{} ({}): expect its severity and all its annotations",
                        a.name, f.test
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn promtool_fails_a_unit_test_whose_annotation_is_not_what_prometheus_renders() {
    // The check above is only worth something if promtool compares what a person reads.
    let bins = PrometheusBins::for_tests().unwrap();
    let dir = rules_dir();
    let text = shipped::rule_tests_text();
    let wrong = text.replacen(
        "summary: \"The Tessera plugin on node gpu-a does not answer\"",
        "summary: \"The Tessera plugin on node gpu-b does not answer\"",
        1,
    );
    assert_ne!(
        wrong, text,
        "the unit tests changed: pick another annotation to break"
    );
    std::fs::write(dir.path().join("alerts.test.yaml"), wrong).unwrap();
    let (ok, out) = promtool(&bins, dir.path(), &["test", "rules", "alerts.test.yaml"]);
    assert!(!ok, "promtool passed a wrong summary:\n{out}");
    assert!(out.contains("TesseraPluginDown"), "{out}");
}

// === a real Prometheus on a test cluster ===

/// The scrape configuration the ServiceMonitor amounts to, with static targets: jobs named
/// after the Services' app.kubernetes.io/name, a `node` label on every series. Each binary
/// is scraped a second time asking only for the text format 0.0.4 (what older scrapers
/// speak); those samples are dropped after parsing, so only `up` and the scrape's own
/// series show that Prometheus' parser of that format read them.
fn scrape_config(plugin: u16, operator: u16) -> String {
    format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [prometheus-rules.yaml]
scrape_configs:
  - job_name: tessera-plugin
    static_configs:
      - targets: ["127.0.0.1:{plugin}"]
        labels: {{node: {NODE}, pod: tessera-plugin-test}}
  - job_name: tessera-operator
    static_configs:
      - targets: ["127.0.0.1:{operator}"]
        labels: {{node: control-plane, pod: tessera-operator-test}}
  - job_name: text-format
    scrape_protocols: [PrometheusText0.0.4]
    static_configs:
      - targets: ["127.0.0.1:{plugin}", "127.0.0.1:{operator}"]
    metric_relabel_configs:
      - action: drop
        source_labels: [__name__]
        regex: ".+"
"#
    )
}

/// The targets that are not up, with Prometheus' reason; empty once every one of the
/// `want` targets is.
async fn targets_down(prom: &Prometheus, want: usize) -> Vec<String> {
    let Ok(data) = prom.api("targets", &[("state", "active")]).await else {
        return vec!["the targets API does not answer".into()];
    };
    let targets = data["activeTargets"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut down: Vec<String> = targets
        .iter()
        .filter(|t| t["health"] != "up")
        .map(|t| {
            format!(
                "{} {}: {} {}",
                t["labels"]["job"], t["scrapeUrl"], t["health"], t["lastError"]
            )
        })
        .collect();
    if targets.len() != want {
        down.push(format!("{} targets, not {want}", targets.len()));
    }
    down
}

/// The queries that return nothing or fail, each named.
async fn empty_queries(prom: &Prometheus, queries: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (what, expr) in queries {
        match prom.query(expr).await {
            Ok(r) if !r.is_empty() => {}
            Ok(_) => out.push(format!("{what}: no result for {expr}")),
            Err(e) => out.push(format!("{what}: {e} in {expr}")),
        }
    }
    out
}

/// Active alerts (pending or firing): (name, state, labels, annotations).
async fn active_alerts(prom: &Prometheus) -> Vec<(String, String, Value, Value)> {
    let data = prom.api("alerts", &[]).await.unwrap();
    data["alerts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap_or("?").to_string(),
                a["state"].as_str().unwrap_or("?").to_string(),
                a["labels"].clone(),
                a["annotations"].clone(),
            )
        })
        .collect()
}

/// Waits until `alert` is active (with `label` = value, if given); its annotations.
async fn wait_alert(prom: &Prometheus, alert: &str, label: Option<(&str, &str)>) -> Value {
    let found = eventually(&format!("{alert} to be active"), WAIT, || async {
        active_alerts(prom)
            .await
            .into_iter()
            .find_map(|(name, _, labels, ann)| {
                (name == alert && label.is_none_or(|(k, v)| labels[k] == v)).then_some(ann)
            })
    })
    .await;
    match found {
        Ok(ann) => ann,
        Err(e) => panic!("{e}; active: {:?}", active_alerts(prom).await),
    }
}

#[tokio::test]
async fn a_real_prometheus_scrapes_both_binaries_and_evaluates_every_query_and_alert() {
    let bins = PrometheusBins::for_tests().unwrap();
    let (cp, client) = tessera_e2e::start_for_workloads(NS).await.unwrap();
    let mut node = SimNode::start(
        &cp,
        NODE,
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let mut op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    let prom = Prometheus::start(
        &bins,
        &scrape_config(node.metrics_port(), op.metrics_port()),
        &[("prometheus-rules.yaml", shipped::rule_file())],
    )
    .await
    .unwrap();
    let down = eventually("every target to be up", WAIT, || async {
        targets_down(&prom, 4).await.is_empty().then_some(())
    })
    .await;
    assert!(
        down.is_ok(),
        "targets a real Prometheus does not scrape:\n{}",
        targets_down(&prom, 4).await.join("\n")
    );
    // Both formats parsed: the text-format scrapes read samples (and dropped them).
    for (port, who) in [
        (node.metrics_port(), "plugin"),
        (op.metrics_port(), "operator"),
    ] {
        let samples = prom
            .query(&format!(
                "scrape_samples_scraped{{job=\"text-format\", instance=\"127.0.0.1:{port}\"}}"
            ))
            .await
            .unwrap();
        let n: f64 = samples[0]["value"][1].as_str().unwrap().parse().unwrap();
        assert!(n > 10.0, "the {who}'s text format 0.0.4: {samples:?}");
    }

    // What the dashboard shows needs something to have happened: an Adaptive policy, a MIG
    // claim prepared on one GPU, two MPS shares that wait until the idle GPU moves to MPS.
    apply_adaptive(&client).await;
    run_pod(
        &client,
        "inference",
        cluster::GpuRequest {
            class: "mig.tessera.dev",
            selector: Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
            capacity: None,
        },
    )
    .await;
    for name in ["share-a", "share-b"] {
        cluster::create_claim_pod(
            &client,
            NS,
            name,
            cluster::GpuRequest {
                class: "mps.tessera.dev",
                selector: None,
                capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
            },
        )
        .await
        .unwrap();
    }
    for name in ["share-a", "share-b"] {
        cluster::wait_pod_running(&client, NS, name, WAIT)
            .await
            .unwrap();
    }

    // Every dashboard query returns something, every variable has values.
    let dashboard = shipped::dashboard();
    let queries: Vec<(String, String)> = shipped::queries(&dashboard)
        .into_iter()
        .map(|q| (q.what, shipped::expand(&q.expr).unwrap()))
        .collect();
    assert!(queries.len() >= 20, "{}", queries.len());
    let answered = eventually("every dashboard query to return a result", WAIT, || async {
        empty_queries(&prom, &queries)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(
        answered.is_ok(),
        "dashboard queries a real Prometheus answers with nothing:\n{}",
        empty_queries(&prom, &queries).await.join("\n")
    );
    for (name, metric, label) in shipped::label_variables(&dashboard) {
        let values = prom
            .api(
                &format!("label/{label}/values"),
                &[("match[]", metric.as_str())],
            )
            .await
            .unwrap();
        assert!(
            values.as_array().is_some_and(|v| !v.is_empty()),
            "dashboard variable ${name} (label_values({metric}, {label})) has no value"
        );
    }

    // Every alert expression evaluates; Prometheus loaded every rule and evaluates each
    // without error.
    let alerts = shipped::alerts();
    for a in &alerts {
        if let Err(e) = prom.query(&a.expr).await {
            panic!("alert {}: {e} in {}", a.name, a.expr);
        }
    }
    let evaluated = eventually("Prometheus to evaluate every rule", WAIT, || async {
        let data = prom.api("rules", &[("type", "alert")]).await.ok()?;
        let rules: Vec<Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let done = rules.len() == alerts.len()
            && rules.iter().all(|r| {
                r["lastEvaluation"]
                    .as_str()
                    .is_some_and(|t| !t.starts_with("0001"))
            });
        done.then_some(rules)
    })
    .await
    .unwrap();
    let unhealthy: Vec<String> = evaluated
        .iter()
        .filter(|r| r["health"] != "ok")
        .map(|r| format!("{}: {} {}", r["name"], r["health"], r["lastError"]))
        .collect();
    assert!(
        unhealthy.is_empty(),
        "rules Prometheus cannot evaluate:\n{}",
        unhealthy.join("\n")
    );
    let loaded: BTreeSet<&str> = evaluated
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    let shipped_names: BTreeSet<&str> = alerts.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(loaded, shipped_names);

    // A healthy cluster raises nothing (an alert pending while the shares waited ends).
    let quiet = eventually(
        "no alert to be active on the healthy cluster",
        WAIT,
        || async { active_alerts(&prom).await.is_empty().then_some(()) },
    )
    .await;
    assert!(
        quiet.is_ok(),
        "active on a healthy cluster: {:?}",
        active_alerts(&prom).await
    );

    // Both binaries say what they were built from.
    let info = prom
        .query("count by (job, version, revision) (tessera_build_info)")
        .await
        .unwrap();
    let jobs: BTreeMap<String, (String, String)> = info
        .iter()
        .map(|s| {
            let m = &s["metric"];
            (
                m["job"].as_str().unwrap().to_string(),
                (
                    m["version"].as_str().unwrap().to_string(),
                    m["revision"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    assert_eq!(
        jobs.keys().map(String::as_str).collect::<Vec<_>>(),
        ["tessera-operator", "tessera-plugin"],
        "{info:?}"
    );
    for (job, (version, revision)) in &jobs {
        assert_eq!(version, env!("CARGO_PKG_VERSION"), "{job}");
        assert!(
            revision == "unknown"
                || (revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit())),
            "{job}: revision {revision}"
        );
    }

    // A plugin that dies: its alert, naming the node (pending: `for` has not passed).
    node.kill();
    let ann = wait_alert(&prom, "TesseraPluginDown", Some(("node", NODE))).await;
    assert!(
        ann["summary"].as_str().is_some_and(|s| s.contains(NODE)),
        "{ann}"
    );
    // The operator too.
    op.kill();
    let ann = wait_alert(&prom, "TesseraOperatorDown", None).await;
    assert_eq!(
        ann["summary"], "No Tessera operator replica answers",
        "{ann}"
    );
    drop(prom);
    drop(node);
    drop(cp);
}

/// Applies the policy `adaptive`: Adaptive between dynamic MIG and MPS.
async fn apply_adaptive(client: &kube::Client) {
    use kube::api::{Api, Patch, PatchParams};
    use tessera_api::GpuSharingPolicy;
    let p: GpuSharingPolicy = serde_yaml::from_str(
        "apiVersion: tessera.dev/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: adaptive}\nspec:\n  nodeSelector: {}\n  strategy: Adaptive\n  mig: {mode: Dynamic}\n  adaptive: {strategies: [MIG, MPS]}\n  mps: {maxClients: 4}\n",
    )
    .unwrap();
    Api::<GpuSharingPolicy>::all(client.clone())
        .patch(
            "adaptive",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&p),
        )
        .await
        .unwrap();
}

async fn run_pod(client: &kube::Client, name: &str, request: cluster::GpuRequest<'_>) {
    cluster::create_claim_pod(client, NS, name, request)
        .await
        .unwrap();
    cluster::wait_pod_running(client, NS, name, WAIT)
        .await
        .unwrap();
}
