//! Runs the built `kubectl-tessera` binary.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn kubectl_tessera(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .args(args)
        .output()
        .expect("run kubectl-tessera");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("utf-8 stdout"),
        String::from_utf8(out.stderr).expect("utf-8 stderr"),
    )
}

#[test]
fn profiles_a100_40gb_json_matches_the_reference_facts() {
    let (ok, stdout, stderr) = kubectl_tessera(&["profiles", "a100-40gb", "-o", "json"]);
    assert!(ok, "{stderr}");
    let got: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let p = |name: &str, id: u32, c: u8, m: u8, mib: u64, max: u8, starts: &[u8]| {
        serde_json::json!({"name": name, "profileId": id, "computeSlices": c, "memorySlices": m,
            "memoryMiB": mib, "maxInstances": max, "placements": starts})
    };
    // A list is always a list, even of one model.
    let want = serde_json::json!([{"model": "a100-40gb", "profiles": [
        p("1g.5gb", 19, 1, 1, 4864, 7, &[0, 1, 2, 3, 4, 5, 6]),
        p("1g.5gb+me", 20, 1, 1, 4864, 1, &[0, 1, 2, 3, 4, 5, 6]),
        p("1g.10gb", 15, 1, 2, 9856, 4, &[0, 2, 4, 6]),
        p("2g.10gb", 14, 2, 2, 9856, 3, &[0, 2, 4]),
        p("3g.20gb", 9, 3, 4, 19968, 2, &[0, 4]),
        p("4g.20gb", 5, 4, 4, 19968, 1, &[0]),
        p("7g.40gb", 0, 7, 8, 40192, 1, &[0]),
    ]}]);
    assert_eq!(got, want);
}

#[test]
fn profiles_accepts_nvml_product_names() {
    let (ok, stdout, _) = kubectl_tessera(&["profiles", "NVIDIA H200", "-o", "json"]);
    assert!(ok);
    assert!(stdout.contains("\"model\": \"h200-141gb\""));
    assert!(stdout.contains("\"name\": \"7g.141gb\""));
}

#[test]
fn an_unknown_model_is_an_error_listing_the_known_ones() {
    let (ok, _, stderr) = kubectl_tessera(&["profiles", "v100"]);
    assert!(!ok);
    for m in ["a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"] {
        assert!(stderr.contains(m), "{stderr}");
    }
}

#[test]
fn the_table_lists_every_profile() {
    let (ok, stdout, _) = kubectl_tessera(&["profiles", "h100-80gb"]);
    assert!(ok);
    for name in [
        "1g.10gb ",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
    ] {
        assert!(stdout.contains(name), "{name} missing:\n{stdout}");
    }
}

#[test]
fn draw_shows_why_a_3g_cannot_start_at_2() {
    let (ok, stdout, _) = kubectl_tessera(&["profiles", "a100-40gb", "--draw"]);
    assert!(ok);
    let section = stdout.split("3g.20gb (id 9)").nth(1).unwrap();
    assert!(
        section.contains("start 0       # # # # . . . ."),
        "{section}"
    );
    assert!(
        section.contains("start 4       . . . . # # # #"),
        "{section}"
    );
    assert!(section.contains("cannot start at 1,2,3,5,6,7"), "{section}");
}

#[test]
fn gpus_from_a_simulated_inventory_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("inv.yaml");
    std::fs::write(
        &inv,
        "gpus: [{model: h100-80gb}, {model: a100-40gb, migEnabled: true}, {model: l4}]",
    )
    .unwrap();
    let (ok, stdout, stderr) = kubectl_tessera(&[
        "local",
        "gpus",
        "--backend",
        "sim",
        "--inventory",
        inv.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let gpus: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(gpus.as_array().unwrap().len(), 3);
    assert_eq!(gpus[1]["productName"], "NVIDIA A100-SXM4-40GB");
    assert_eq!(gpus[1]["migEnabled"], true);
    assert!(gpus[0]["uuid"].as_str().unwrap().starts_with("GPU-"));
}

#[test]
fn gpus_with_the_sim_backend_needs_an_inventory() {
    let (ok, _, stderr) = kubectl_tessera(&["gpus", "--backend", "sim"]);
    assert!(!ok);
    assert!(stderr.contains("--inventory"), "{stderr}");
}

fn scenario(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("scenario.csv");
    std::fs::write(&path, text).expect("write the scenario");
    path.display().to_string()
}

#[test]
fn simulate_compares_policies_on_a_scenario_and_writes_json_and_a_chart() {
    let dir = tempfile::tempdir().unwrap();
    let path = scenario(
        dir.path(),
        "kind,name,cpu_milli,memory_mib,gpus,gpu_milli,arrival,departure\n\
         node,n,64000,262144,2,,,\n\
         pod,small,1000,1024,1,100,0,\npod,big,1000,1024,1,500,1,\npod,whole,1000,1024,1,1000,2,\n",
    );
    let svg = dir.path().join("chart.svg");
    let (ok, stdout, stderr) = kubectl_tessera(&[
        "simulate",
        "--scenario",
        &path,
        "--seeds",
        "2",
        "-o",
        "json",
        "--svg",
        &svg.display().to_string(),
    ]);
    assert!(ok, "{stderr}");
    let got: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let used: Vec<u64> = got["needed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["usage"]["gpusUsed"].as_u64().unwrap())
        .collect();
    // whole; MIG first-fit (its 1g at 0 strands the only 4g placement); MIG Tessera; MPS;
    // MIG+MPS (the 1g takes MIG on GPU 0, the 500 share moves GPU 1 to MPS, so the whole
    // GPU needs a third).
    assert_eq!(used, vec![3, 3, 2, 2, 3]);
    assert_eq!(got["ratio"][0]["seeds"].as_array().unwrap().len(), 2);
    assert!(
        stderr.contains("GPUs needed"),
        "progress goes to stderr: {stderr}"
    );
    assert!(
        std::fs::read_to_string(&svg)
            .unwrap()
            .contains("fractional bound")
    );
}

#[test]
fn simulate_names_the_bad_line_of_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = scenario(
        dir.path(),
        "kind,name,cpu_milli,memory_mib,gpus,gpu_milli,arrival,departure\nnode,n,x,1,1,,,\n",
    );
    let (ok, _, stderr) = kubectl_tessera(&["simulate", "--scenario", &path, "-q"]);
    assert!(!ok);
    assert!(stderr.contains("line 2: cpu_milli = \"x\""), "{stderr}");
    let (ok, _, stderr) = kubectl_tessera(&["simulate", "--scenario", &path, "--from-cluster"]);
    assert!(!ok);
    assert!(
        stderr.contains("'--scenario <FILE>' cannot be used with '--from-cluster'"),
        "{stderr}"
    );
    assert!(!stderr.contains("error: error:"), "{stderr}");
}

#[test]
fn the_old_gpus_name_still_works_and_yaml_and_wide_are_there() {
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("inv.yaml");
    std::fs::write(&inv, "gpus: [{model: h100-80gb}, {model: l4}]").unwrap();
    let inv = inv.to_str().unwrap();
    let (ok, yaml, stderr) =
        kubectl_tessera(&["gpus", "--backend", "sim", "--inventory", inv, "-o", "yaml"]);
    assert!(ok, "{stderr}");
    let gpus: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(gpus.as_array().unwrap().len(), 2);
    let (ok, wide, _) = kubectl_tessera(&[
        "local",
        "gpus",
        "--backend",
        "sim",
        "--inventory",
        inv,
        "-o",
        "wide",
    ]);
    assert!(ok);
    let lines: Vec<&str> = wide.lines().collect();
    assert!(
        lines[0].contains("UUID") && lines[0].contains("PCI"),
        "{wide}"
    );
    // The long product name does not push the next column out of line.
    let col = |l: &str, w: &str| l.find(w).unwrap();
    assert_eq!(col(lines[0], "MODEL"), col(lines[1], "h100-80gb"), "{wide}");
    assert_eq!(col(lines[1], "h100-80gb"), col(lines[2], "l4"), "{wide}");
}

#[test]
fn usage_reads_kubectl_tessera_and_each_command_shows_an_example() {
    let (ok, help, _) = kubectl_tessera(&["--help"]);
    assert!(ok);
    assert!(help.contains("Usage: kubectl tessera <COMMAND>"), "{help}");
    assert!(help.contains("local"), "{help}");
    assert!(
        !help.contains("\n  gpus "),
        "the old name is hidden: {help}"
    );
    let (ok, help, _) = kubectl_tessera(&["why", "--help"]);
    assert!(ok);
    for flag in [
        "--kubeconfig",
        "--context",
        "--namespace",
        "--request-timeout",
        "wide",
        "yaml",
    ] {
        assert!(help.contains(flag), "{flag} missing in\n{help}");
    }
    assert!(
        help.contains("kubectl tessera why trainer-0 -n ml"),
        "{help}"
    );
}

/// Two kubeconfig files, as `KUBECONFIG=a:b` lists them: the second holds the context.
fn two_kubeconfigs(dir: &std::path::Path) -> String {
    let a = dir.join("a");
    let b = dir.join("b");
    std::fs::write(
        &a,
        "apiVersion: v1\nkind: Config\ncurrent-context: first\nclusters: [{name: c1, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: first, context: {cluster: c1, user: u}}]\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c2, cluster: {server: 'https://127.0.0.1:2'}}]\nusers: [{name: u2, user: {token: t}}]\ncontexts: [{name: second, context: {cluster: c2, user: u2, namespace: team-b}}]\n",
    )
    .unwrap();
    std::env::join_paths([a, b])
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn kubeconfig_lists_are_merged_as_kubectl_merges_them() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = two_kubeconfigs(dir.path());
    // The context of the second file is found, and the request goes to its cluster: a
    // port nothing listens on, so the error names that server, not the kubeconfig.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .args(["status", "--context", "second", "--request-timeout", "5s"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("kubeconfig"), "{stderr}");
    assert!(stderr.contains("listing GpuNodes"), "{stderr}");
    // An unknown context is a kubeconfig error that names it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .args(["status", "--context", "third"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("third"), "{stderr}");
}

/// `plugins/tessera.yaml` rendered as krew-release-bot renders it for `tag`, with `sha`
/// for every archive.
fn render_krew_manifest(tag: &str, sha: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/tessera.yaml");
    let template = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    for line in template.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("{{addURIAndSha \"") {
            let indent = &line[..line.len() - line.trim_start().len()];
            let url = rest
                .split('"')
                .next()
                .unwrap()
                .replace("{{ .TagName }}", tag);
            out.push_str(&format!("{indent}uri: {url}\n{indent}sha256: {sha}\n"));
        } else {
            out.push_str(&line.replace("{{ .TagName }}", tag));
            out.push('\n');
        }
    }
    out
}

#[test]
fn the_krew_manifest_renders_to_what_krew_requires() {
    let sha = "0".repeat(64);
    let m: serde_json::Value = serde_yaml::from_str(&render_krew_manifest("v0.1.0", &sha)).unwrap();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    // krew names the plugin after the file and runs kubectl-<name>.
    assert_eq!(m["metadata"]["name"], "tessera");
    assert_eq!(m["spec"]["version"], "v0.1.0");
    assert!(
        m["spec"]["shortDescription"].as_str().unwrap().len() <= 50,
        "krew-index keeps short descriptions short"
    );
    let platforms = m["spec"]["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 2);
    for p in platforms {
        let labels = &p["selector"]["matchLabels"];
        let arch = labels["arch"].as_str().unwrap();
        assert_eq!(labels["os"], "linux");
        assert_eq!(p["bin"], "kubectl-tessera");
        assert_eq!(p["sha256"], sha.as_str());
        assert_eq!(
            p["uri"],
            format!(
                "https://github.com/tessera-gpu/tessera/releases/download/v0.1.0/kubectl-tessera-linux-{arch}.tar.gz"
            )
        );
        let files: Vec<&str> = p["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["from"].as_str().unwrap())
            .collect();
        assert!(files.contains(&"kubectl-tessera") && files.contains(&"LICENSE"));
    }
    // The binary krew installs is the one cargo builds.
    assert!(env!("CARGO_BIN_EXE_kubectl-tessera").ends_with("kubectl-tessera"));
}
