use super::*;

/// A plugin upgrade as the chart's DaemonSet rolls it (`maxSurge: 1`): the new pod starts
/// next to the old one, registers, takes the node over, and the old one is stopped. A
/// pod that arrives while the old instance is still finishing (held here with SIGSTOP)
/// waits in the new one instead of failing, and nothing the old one prepared is lost.
#[tokio::test]
async fn a_rolling_update_hands_the_node_over_without_a_gap() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Event;
    use kube::runtime::watcher;

    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "rolling",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    create_pod(
        &client,
        "before",
        "mig.tessera.dev",
        Some(&profile("3g.40gb")),
        None,
    )
    .await;
    wait_running(&client, "before").await;
    let made_before = sim(&node).gpus[0].instances.len();

    // Every deletion of the node's slices while the plugin rolls: the kubelet wipes them
    // when no instance of the driver is registered.
    let cfg = watcher::Config::default().fields("spec.nodeName=rolling");
    let mut slices = watcher(Api::<ResourceSlice>::all(client.clone()), cfg).boxed();
    while !matches!(slices.next().await, Some(Ok(watcher::Event::InitDone))) {}

    // The old instance is held before it can answer the handover request.
    node.pause_plugin(true).unwrap();
    let next = node.start_successor().unwrap();
    eventually("the kubelet to register the new instance", WAIT, || async {
        next.metric("tessera_plugin_kubelet_registrations_total")
            .await
            .filter(|r| *r >= 1.0)
    })
    .await
    .unwrap();
    assert_eq!(next.metric("tessera_plugin_owns_node").await, Some(0.0));
    // From now on the kubelet sends its calls to the new instance.
    create_pod(
        &client,
        "during",
        "mig.tessera.dev",
        Some(&profile("1g.10gb")),
        None,
    )
    .await;
    eventually(
        "the new instance to hold the kubelet's call",
        WAIT,
        || async {
            next.metric("tessera_plugin_calls_waiting_for_node")
                .await
                .filter(|w| *w >= 1.0)
        },
    )
    .await
    .unwrap();
    node.pause_plugin(false).unwrap();
    let took = node.finish_roll(next).await.unwrap();
    eprintln!("the new plugin instance was ready {took:?} after its start");
    wait_running(&client, "during").await;
    assert_eq!(
        node.metric("tessera_plugin_calls_waiting_for_node").await,
        Some(0.0)
    );
    assert_eq!(node.metric("tessera_plugin_owns_node").await, Some(1.0));

    // What the old instance prepared, the new one unprepares.
    delete_pod(&client, "before").await;
    let left = made_before;
    eventually("the MIG instance of `before` to be destroyed", WAIT, || {
        let state = sim(&node);
        async move { (state.gpus[0].instances.len() == left).then_some(()) }
    })
    .await
    .unwrap();
    // A second roll: the new instance hands over in its turn.
    node.roll_plugin().await.unwrap();
    create_pod(
        &client,
        "after",
        "mig.tessera.dev",
        Some(&profile("1g.10gb")),
        None,
    )
    .await;
    wait_running(&client, "after").await;

    let mut deleted = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(100), slices.next()).await {
        if let Ok(watcher::Event::Delete(s)) = ev {
            deleted.push(s.name_any());
        }
    }
    assert!(
        deleted.is_empty(),
        "slices wiped during the roll: {deleted:?}"
    );
    let events = Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    let failed: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
        .map(|e| {
            format!(
                "{}: {}",
                e.involved_object.name.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "prepares failed during the roll: {failed:#?}\n{}",
        node.log_tail(40)
    );
}

/// An upgrade from a version that kept its checkpoint in the state directory (before
/// `--checkpoint-dir`): the new plugin moves the records it finds there into its
/// checkpoint directory before it loads them, so the claims its predecessor prepared stay
/// its own and their instances are destroyed when the pods end. Here the records are put
/// where that version wrote them while the plugin is stopped.
#[tokio::test]
async fn an_upgrade_takes_over_the_records_an_earlier_version_kept_in_the_state_directory() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "upgraded",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    create_pod(
        &client,
        "kept",
        "mig.tessera.dev",
        Some(&profile("3g.40gb")),
        None,
    )
    .await;
    wait_running(&client, "kept").await;
    assert_eq!(sim(&node).gpus[0].instances.len(), 1);

    let records = |dir: std::path::PathBuf| -> Vec<String> {
        let mut names: Vec<String> = match std::fs::read_dir(dir.join("claims")) {
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    };
    node.terminate().await.unwrap();
    let current = records(node.checkpoint_dir());
    assert_eq!(current.len(), 1, "one record for the pod's claim");
    let old = node.state_dir().join("claims");
    std::fs::create_dir_all(&old).unwrap();
    for name in &current {
        // The two directories are on different file systems, as on a node.
        let from = node.checkpoint_dir().join("claims").join(name);
        std::fs::copy(&from, old.join(name)).unwrap();
        std::fs::remove_file(from).unwrap();
    }

    node.restart().await.unwrap();
    assert_eq!(records(node.checkpoint_dir()), current);
    assert!(records(node.state_dir()).is_empty());
    assert!(
        node.log_tail(200)
            .contains("moved the checkpoint records an earlier version kept"),
        "{}",
        node.log_tail(40)
    );
    // The plugin knows the instance is the claim's: the pod's end destroys it.
    delete_pod(&client, "kept").await;
    eventually("the MIG instance of `kept` to be destroyed", WAIT, || {
        let state = sim(&node);
        async move { state.gpus[0].instances.is_empty().then_some(()) }
    })
    .await
    .unwrap();
    assert!(records(node.checkpoint_dir()).is_empty());
}
