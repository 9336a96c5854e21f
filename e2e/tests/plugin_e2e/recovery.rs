//! Crashes and reboots: the checkpoint, start-up recovery and the kubelet preparing again.

use super::*;

#[tokio::test]
async fn a_plugin_killed_between_the_checkpoint_phases_recovers_and_nothing_leaks() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "crashy",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    // The plugin dies right after the MIG instance exists, before it records it.
    std::fs::write(
        node.faults_path(),
        r#"{"abortAfter":[{"operation":"create-compute-instance"}]}"#,
    )
    .unwrap();
    create_pod(
        &client,
        "victim",
        "mig.tessera.dev",
        Some(&profile("3g.40gb")),
        None,
    )
    .await;
    eventually("the plugin to abort", WAIT, || {
        let running = node.plugin_running();
        async move { (!running).then_some(()) }
    })
    .await
    .unwrap();
    let orphans = sim(&node).gpus[0].instances.clone();
    assert_eq!(
        orphans.len(),
        1,
        "the instance outlived the plugin, as on hardware"
    );
    let orphan = orphans[0].compute_instances[0].uuid.clone();
    node.restart().await.unwrap();
    // The kubelet's retry succeeds on the recovered plugin.
    let pod = wait_running(&client, "victim").await;
    let state = sim(&node);
    assert_eq!(
        state.gpus[0].instances.len(),
        1,
        "no leaked instance: {:?}",
        state.gpus[0].instances
    );
    let remade = state.gpus[0].instances[0].compute_instances[0].uuid.clone();
    assert_ne!(
        remade, orphan,
        "recovery destroyed the orphan and the retry made a new instance"
    );
    let claim = claim_of(&client, &pod).await;
    let (_, device) = allocated(&claim);
    assert!(device.starts_with("gpu-0-mig-3g-40gb-"));
    let spec = std::fs::read_to_string(node.cdi_dir().join(format!(
        "k8s.gpu.tessera.dev-claim_{}.json",
        claim.uid().unwrap()
    )))
    .unwrap();
    assert!(
        spec.contains(&format!("TESSERA_DEVICE_UUID={remade}")) && !spec.contains(&orphan),
        "the container gets the new instance: {spec}"
    );

    // A plain restart keeps the prepared claim; unprepare still works afterwards.
    node.restart().await.unwrap();
    assert_eq!(
        sim(&node).gpus[0].instances.len(),
        1,
        "a restart never destroys a prepared claim's instance"
    );
    delete_pod(&client, "victim").await;
    assert!(sim(&node).gpus[0].instances.is_empty());
}

/// The plugin aborted at each of its own crash points, between two file writes (the
/// checkpoint record, the CDI spec) with no hardware step between them: after the
/// restart the pod runs (or is gone), and nothing is left behind: no record, no spec, no
/// instance.
#[tokio::test]
async fn a_plugin_aborted_between_two_file_writes_recovers_and_nothing_leaks() {
    use tessera_plugin::crash_points;
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "crash-points",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    operator_sets_gpus(
        &client,
        "crash-points",
        json!([{"index": 0, "strategy": "Exclusive"}, {"index": 1, "strategy": "MIG", "mig": {"mode": "Dynamic"}}]),
    )
    .await;
    let files_left = |node: &SimNode| -> Vec<String> {
        let list = |dir: std::path::PathBuf| -> Vec<String> {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.contains("claim") || n.ends_with(".json"))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut left = list(node.checkpoint_dir().join("claims"));
        left.extend(list(node.cdi_dir()));
        left
    };
    for (k, point) in crash_points::ALL.iter().enumerate() {
        // Whole GPUs (no hardware step at all) and MIG devices (whose instance must
        // survive a crash after it is recorded) take turns.
        let (class, selector) = if k % 2 == 0 {
            ("gpu.tessera.dev", None)
        } else {
            ("mig.tessera.dev", Some(profile("1g.10gb")))
        };
        let name = format!("at-{k}");
        let preparing =
            point.starts_with("claim-recorded") || *point == crash_points::CDI_SPEC_WRITTEN;
        if !preparing {
            create_pod(&client, &name, class, selector.as_deref(), None).await;
            wait_running(&client, &name).await;
        }
        std::fs::write(
            node.crash_points_path(),
            json!({"abortAfter": [point]}).to_string(),
        )
        .unwrap();
        if preparing {
            create_pod(&client, &name, class, selector.as_deref(), None).await;
        } else {
            let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
            pods.delete(&name, &DeleteParams::default()).await.unwrap();
        }
        eventually(&format!("the plugin to abort at {point}"), WAIT, || {
            let running = node.plugin_running();
            async move { (!running).then_some(()) }
        })
        .await
        .unwrap();
        node.restart().await.unwrap();
        if preparing {
            let pod = wait_running(&client, &name).await;
            let state = sim(&node);
            let instances: usize = state.gpus.iter().map(|g| g.instances.len()).sum();
            assert_eq!(
                instances,
                usize::from(k % 2 == 1),
                "{point}: one instance for the MIG claim, none otherwise: {:?}",
                state.gpus
            );
            let claim = claim_of(&client, &pod).await;
            assert!(
                node.cdi_dir()
                    .join(format!(
                        "k8s.gpu.tessera.dev-claim_{}.json",
                        claim.uid().unwrap()
                    ))
                    .exists(),
                "{point}: the pod's CDI spec"
            );
            delete_pod(&client, &name).await;
        } else {
            let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
            eventually(
                &format!("pod {name} to be gone after {point}"),
                WAIT,
                || async { pods.get_opt(&name).await.ok()?.is_none().then_some(()) },
            )
            .await
            .unwrap();
        }
        let state = sim(&node);
        assert!(
            state.gpus.iter().all(|g| g.instances.is_empty()),
            "{point}: an instance outlived its claim: {:?}",
            state.gpus
        );
        assert!(
            files_left(&node).is_empty(),
            "{point}: files outlived the claim: {:?}",
            files_left(&node)
        );
    }
}

#[tokio::test]
async fn after_a_node_reboot_stale_records_are_forgotten_and_claims_are_prepared_afresh() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "rebooty",
        "gpus: [{model: h100-80gb}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    create_pod(
        &client,
        "mig",
        "mig.tessera.dev",
        Some(&profile("3g.40gb")),
        None,
    )
    .await;
    create_pod(
        &client,
        "whole",
        "gpu.tessera.dev",
        Some("device.attributes['gpu.tessera.dev'].productName == 'NVIDIA L4'"),
        None,
    )
    .await;
    let mut pods = Vec::new();
    for pod in ["mig", "whole"] {
        pods.push(wait_running(&client, pod).await);
    }
    let before = sim(&node).gpus[0].instances.clone();
    assert_eq!(before.len(), 1);
    let cdi_dir = node.cdi_dir();
    let spec_count = || std::fs::read_dir(&cdi_dir).unwrap().count();
    assert_eq!(spec_count(), 2, "one CDI spec per prepared claim");
    let handed: Vec<_> = pods
        .iter()
        .map(|p| node.kubelet.cdi_device_sets(&p.uid().unwrap()))
        .collect();

    node.reboot(&cp).await.unwrap();

    // The records described hardware and CDI specs the reboot wiped: recovery voids them.
    assert!(
        node.log_tail(400).contains("the node rebooted"),
        "recovery says what it did:\n{}",
        node.log_tail(40)
    );
    // The restarted kubelet prepares the pods' claims again (its checkpoint survives the
    // reboot, but it re-prepares every claim after a restart); the plugin makes everything
    // anew instead of answering with devices that no longer exist.
    let after = eventually("the MIG instance to be made again", WAIT, || async {
        let inst = sim(&node).gpus[0].instances.clone();
        (inst.len() == 1 && spec_count() == 2).then_some(inst)
    })
    .await
    .unwrap();
    assert_eq!(
        after[0].start, before[0].start,
        "made again at the allocated placement"
    );
    assert_ne!(
        after[0].compute_instances[0].uuid, before[0].compute_instances[0].uuid,
        "a new instance, not a stale answer"
    );
    // The pods' containers were created again with the same CDI ids.
    for (pod, ids) in pods.iter().zip(&handed) {
        let uid = pod.uid().unwrap();
        let what = format!("{} to be recreated after the reboot", pod.name_any());
        eventually(&what, WAIT, || async {
            let created = node
                .kubelet
                .containers()
                .iter()
                .filter(|r| r.pod_uid == uid)
                .count();
            (created >= 2).then_some(())
        })
        .await
        .unwrap();
        assert_eq!(&node.kubelet.cdi_device_sets(&uid), ids);
    }

    for pod in ["mig", "whole"] {
        delete_pod(&client, pod).await;
    }
    assert!(sim(&node).gpus[0].instances.is_empty());
    assert_eq!(spec_count(), 0);
}
