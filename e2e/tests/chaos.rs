//! A short run of the fault campaign (`cargo xtask chaos` runs long ones): every fault
//! kind at least once on a fixed seed, and no invariant violated.

use tessera_e2e::chaos;

#[tokio::test]
async fn a_short_fault_campaign_breaks_no_invariant() {
    let mut cp = tessera_e2e::start_for_test().await.expect("control plane");
    let report = chaos::run(
        &mut cp,
        &chaos::Options {
            seed: 20261201,
            steps: tessera_e2e::chaos::SCHEDULE.len() as u64,
        },
        &mut |line| eprintln!("{line}"),
    )
    .await
    .expect("the campaign runs");
    eprintln!("{report}");
    for kind in [
        "plugin-kill",
        "plugin-abort",
        "operator-leader-kill",
        "kubelet-restart",
        "node-reboot",
        "gpu-xid",
        "apiserver-restart",
        "etcd-outage",
        "torn-checkpoint",
        "plugin-upgrade",
        "checkpoint-dir",
        "policy-edit",
        "plugin-restart-mid-change",
        "adaptive-move",
        "destroy-refused",
    ] {
        assert!(
            report.faults.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never injected: {report}"
        );
    }
    assert!(report.violations.is_empty(), "{report}");
    // The broken checkpoint directory met a prepare (refused, then run once repaired); a pod
    // that ran on it would be a prepare that wrote no record.
    assert_eq!(
        report.checkpoint_dir_refusals.values().sum::<u64>(),
        report.faults["checkpoint-dir"],
        "{report}"
    );
    // The refused destroy met a half-made instance at the plugin's start-up.
    assert_eq!(report.destroy_refusals_not_reached, 0, "{report}");
    assert!(report.pods_created > 0 && report.checks > report.steps);
    // Faults amid a workload that runs, not amid pods that never start.
    assert!(report.pods_running_max >= 3, "{report}");
}
