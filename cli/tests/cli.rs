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
