//! GPU faults: taints, status, metrics, the health stream, and a fault that outlives a restart.

use super::*;

#[tokio::test]
async fn a_gpu_fault_taints_its_devices_and_shows_in_status_and_metrics() {
    let (cp, client) = setup().await;
    let node = SimNode::start(
        &cp,
        "faulty",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields("spec.nodeName=faulty");
    // Ready once registered and published.
    eventually("the plugin to be ready", WAIT, || async {
        (node.http_get("/readyz").await.ok()?.0 == 200).then_some(())
    })
    .await
    .unwrap();
    // The driver reports an XID 79 (GPU fell off the bus) on GPU 1.
    std::fs::write(
        node.faults_path(),
        r#"{"healthEvents":[{"gpu":1,"kind":{"type":"xid","code":79,"fatal":true}}]}"#,
    )
    .unwrap();
    let tainted = eventually("a device to be tainted", WAIT, || async {
        let tainted: Vec<_> = slices
            .list(&lp)
            .await
            .ok()?
            .items
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .filter_map(|d| Some((d.name.clone(), d.taints.clone().filter(|t| !t.is_empty())?)))
            .collect();
        (!tainted.is_empty()).then_some(tainted)
    })
    .await
    .unwrap();
    assert!(
        tainted.iter().all(|(name, _)| name.starts_with("gpu-1")),
        "only GPU 1's devices: {tainted:?}"
    );
    assert_eq!(tainted.len(), 26, "every device of the faulty H100");
    let taint = &tainted[0].1[0];
    assert_eq!(
        (taint.key.as_str(), taint.effect.as_str()),
        ("gpu.tessera.dev/unhealthy", "NoSchedule")
    );
    assert_eq!(taint.value.as_deref(), Some("xid-79"));
    // The kubelet's health stream says so, for every device of GPU 1 and only those (read
    // directly: the kubelet keeps what it receives to itself, except for devices pods use;
    // `allocated_resources_status_follows_device_health` checks that side).
    let info = node.plugin_info().await.unwrap();
    let version =
        tessera_plugin::kubelet::client::HealthVersion::negotiate(&info.supported_versions)
            .unwrap();
    let mut stream = tessera_plugin::kubelet::client::watch_health(
        std::path::Path::new(&info.endpoint),
        version,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let entries = futures::StreamExt::next(&mut stream)
        .await
        .unwrap()
        .unwrap();
    let unhealthy: Vec<_> = entries
        .iter()
        .filter(|e| e.health == tessera_plugin::kubelet::DeviceHealthStatus::Unhealthy)
        .map(|e| e.device_name.clone())
        .collect();
    assert_eq!(unhealthy.len(), 26, "{unhealthy:?}");
    assert!(unhealthy.iter().all(|d| d.starts_with("gpu-1")));
    assert_eq!(entries.len(), 52);
    // The GpuNode says so.
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    let gn = cluster::wait_for(
        &gpunodes,
        "faulty",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.gpus
                    .iter()
                    .any(|g| g.health == tessera_api::gpunode::GpuHealth::Unhealthy)
            })
        },
        "GpuNode to report the fault",
        WAIT,
    )
    .await
    .unwrap();
    let st = gn.status.unwrap();
    assert_eq!(st.gpu_count, 2);
    assert_eq!(st.gpus[1].health_message.as_deref(), Some("xid-79"));
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "GpuUnhealthy")
    );
    // A MIG pod still runs, on the healthy GPU.
    create_pod(
        &client,
        "survivor",
        "mig.tessera.dev",
        Some(&profile("1g.10gb")),
        None,
    )
    .await;
    let pod = wait_running(&client, "survivor").await;
    let (_, device) = allocated(&claim_of(&client, &pod).await);
    assert!(device.starts_with("gpu-0-"), "{device}");
    // Metrics count what was published and prepared.
    // Metrics count what was published and prepared (the gauges follow the node loop's
    // next pass after the prepare, so wait for them).
    let wanted = [
        "tessera_plugin_devices_published{type=\"mig\"} 50",
        "tessera_plugin_devices_prepared{type=\"mig\"} 1",
        "tessera_plugin_prepare_duration_seconds_count{result=\"ok\"} 1",
    ];
    eventually(&format!("the metrics to show {wanted:?}"), WAIT, || async {
        let (code, metrics) = node.http_get("/metrics").await.ok()?;
        (code == 200 && wanted.iter().all(|w| metrics.contains(w))).then_some(())
    })
    .await
    .unwrap();
    // A restart does not forget the fault (the XID was a one-off event): GPU 1 stays
    // tainted until there is evidence it recovered (a reboot, a replaced GPU).
    let mut node = node;
    node.restart().await.unwrap();
    eventually("the restarted plugin to be ready", WAIT, || async {
        (node.http_get("/readyz").await.ok()?.0 == 200).then_some(())
    })
    .await
    .unwrap();
    let still: Vec<String> = slices
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
        .map(|d| d.name)
        .collect();
    assert_eq!(
        still.len(),
        26,
        "GPU 1 is tainted after the restart: {still:?}"
    );
    assert!(still.iter().all(|n| n.starts_with("gpu-1")));
    // SIGTERM: the plugin leaves, removing its sockets so the kubelet deregisters it.
    node.terminate().await.unwrap();
    assert!(
        !std::path::Path::new(&info.endpoint).exists(),
        "DRA socket left behind"
    );
    assert_eq!(
        std::fs::read_dir(node.registry_dir()).unwrap().count(),
        0,
        "registration socket left behind"
    );
}
