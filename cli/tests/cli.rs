//! Runs the built `kubectl-tessera` binary.

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
    let want = serde_json::json!({"model": "a100-40gb", "profiles": [
        p("1g.5gb", 19, 1, 1, 4864, 7, &[0, 1, 2, 3, 4, 5, 6]),
        p("1g.5gb+me", 20, 1, 1, 4864, 1, &[0, 1, 2, 3, 4, 5, 6]),
        p("1g.10gb", 15, 1, 2, 9856, 4, &[0, 2, 4, 6]),
        p("2g.10gb", 14, 2, 2, 9856, 3, &[0, 2, 4]),
        p("3g.20gb", 9, 3, 4, 19968, 2, &[0, 4]),
        p("4g.20gb", 5, 4, 4, 19968, 1, &[0]),
        p("7g.40gb", 0, 7, 8, 40192, 1, &[0]),
    ]});
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
