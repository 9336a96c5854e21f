use futures::StreamExt;
use tessera_plugin::kubelet::{
    DeviceHealthEntry, DeviceHealthStatus,
    client::{HealthVersion, watch_health},
};

use crate::common::{FakeDriver, Running, WAIT};

fn entry(device: &str, health: DeviceHealthStatus, message: &str) -> DeviceHealthEntry {
    DeviceHealthEntry {
        pool_name: "node-a".to_owned(),
        device_name: device.to_owned(),
        health,
        message: message.to_owned(),
        last_updated: 1_700_000_000,
        health_check_timeout_seconds: 60,
    }
}

#[tokio::test]
async fn the_health_stream_sends_the_current_list_then_each_update() {
    let running = Running::start(FakeDriver::default()).await;
    let initial = vec![
        entry("gpu-0", DeviceHealthStatus::Healthy, ""),
        entry("gpu-1", DeviceHealthStatus::Unknown, ""),
    ];
    running.health.send_replace(initial.clone());

    for version in [HealthVersion::V1alpha1, HealthVersion::V1] {
        let mut stream = watch_health(running.server.dra_socket(), version, WAIT)
            .await
            .unwrap();
        let first = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(first, initial, "{version:?}");

        let update = vec![
            entry(
                "gpu-0",
                DeviceHealthStatus::Unhealthy,
                "XID 79: fell off the bus",
            ),
            entry("gpu-1", DeviceHealthStatus::Healthy, ""),
        ];
        running.health.send_replace(update.clone());
        let next = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(next, update, "{version:?}");
        running.health.send_replace(initial.clone());
    }
    running.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_open_health_streams() {
    let running = Running::start(FakeDriver::default()).await;
    let mut stream = watch_health(running.server.dra_socket(), HealthVersion::V1, WAIT)
        .await
        .unwrap();
    tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // `shutdown` fails the test if the open stream holds up the graceful stop.
    running.shutdown().await;

    let end = tokio::time::timeout(WAIT, stream.next()).await.unwrap();
    assert!(end.as_ref().is_none_or(Result::is_err), "{end:?}");
}

#[test]
fn health_negotiation_prefers_v1() {
    let all = [
        "v1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
        "v1.DRAResourceHealth",
    ]
    .map(String::from);
    assert_eq!(HealthVersion::negotiate(&all), Some(HealthVersion::V1));
    assert_eq!(
        HealthVersion::negotiate(&all[..2]),
        Some(HealthVersion::V1alpha1)
    );
    assert_eq!(HealthVersion::negotiate(&all[..1]), None);
}
