//! The control plane itself: it serves, kubectl works against it, and stopping it leaves no
//! process behind.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use tessera_e2e::{BinDir, ControlPlane, ControlPlaneOptions};

#[tokio::test]
async fn kubectl_reaches_a_ready_api_server_and_stop_leaves_no_process() {
    let bins = BinDir::for_tests().unwrap();
    let mut cp = ControlPlane::start(ControlPlaneOptions::new(bins))
        .await
        .unwrap();
    let out = std::process::Command::new(cp.bins().path("kubectl"))
        .args(["get", "--raw", "/readyz"])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version = std::process::Command::new(cp.bins().path("kubectl"))
        .args(["version", "-o", "json"])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&version.stdout).unwrap();
    assert_eq!(
        v["serverVersion"]["gitVersion"],
        format!("v{}", cp.bins().version)
    );

    let state = tessera_e2e::controlplane::read_state(cp.dir()).unwrap();
    assert_eq!(
        state.pids.len(),
        4,
        "etcd, apiserver, scheduler, controller-manager"
    );
    cp.stop();
    for pid in state.pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid),
            "process {pid} survived stop()"
        );
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) == Some("Z"))
        .unwrap_or(true)
}
