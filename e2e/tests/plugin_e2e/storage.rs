use super::*;

/// The FailedPrepareDynamicResources events of pod `pod`, newest last.
async fn prepare_failures(client: &Client, pod: &str) -> Vec<String> {
    use k8s_openapi::api::core::v1::Event;
    let events = Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .unwrap();
    events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
        .filter_map(|e| e.message)
        .collect()
}

/// A checkpoint directory that turns read-only or fills up fails the prepares that need it,
/// each with an error that says so (in the pod's events), and touches no hardware; once
/// it is writable again the kubelet's retry prepares the claim. An unprepare that cannot
/// drop its record fails and succeeds on the retry after the directory recovers.
#[tokio::test]
async fn a_read_only_or_full_checkpoint_directory_fails_prepares_cleanly_until_it_recovers() {
    let (cp, client) = setup().await;
    let node = SimNode::start_with_small_checkpoint_dir(
        &cp,
        "small-disk",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
        1 << 20,
    )
    .await
    .unwrap();
    let mig = |name: &'static str| {
        let client = client.clone();
        async move {
            create_pod(
                &client,
                name,
                "mig.tessera.dev",
                Some(&profile("1g.10gb")),
                None,
            )
            .await;
        }
    };
    mig("first").await;
    wait_running(&client, "first").await;
    let instances = || sim(&node).gpus[0].instances.len();
    assert_eq!(instances(), 1);

    for (fault, pod, says) in [
        ("read-only", "on-read-only", "Read-only file system"),
        ("full", "on-full", "No space left on device"),
    ] {
        let made = instances();
        match fault {
            "read-only" => node.checkpoint_dir_read_only(true).unwrap(),
            _ => node.fill_checkpoint_dir(true).unwrap(),
        }
        mig(pod).await;
        let failures = eventually(
            &format!("the prepare of {pod} to fail on the {fault} checkpoint directory"),
            WAIT,
            || async {
                let f = prepare_failures(&client, pod).await;
                (!f.is_empty()).then_some(f)
            },
        )
        .await;
        let failures = match failures {
            Ok(f) => f,
            Err(e) => {
                let status = Api::<Pod>::namespaced(client.clone(), NS).get(pod).await;
                panic!(
                    "{e}\npod: {:?}\nplugin log:\n{}",
                    status.map(|p| p.status),
                    node.log_tail(40)
                )
            }
        };
        assert!(
            failures
                .iter()
                .all(|m| m.contains(says) && m.contains("checkpoint")),
            "{fault}: {failures:#?}"
        );
        assert_eq!(
            instances(),
            made,
            "{fault}: hardware was touched without a record"
        );
        assert!(
            node.http_get("/healthz").await.unwrap().0 == 200,
            "the plugin stopped serving"
        );
        match fault {
            "read-only" => node.checkpoint_dir_read_only(false).unwrap(),
            _ => node.fill_checkpoint_dir(false).unwrap(),
        }
        wait_running(&client, pod).await;
    }
    assert_eq!(instances(), 3);

    // An unprepare that cannot drop its record fails and is retried by the kubelet; the
    // pod stays until it succeeds.
    node.checkpoint_dir_read_only(true).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("first", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the unprepare of `first` to fail", WAIT, || async {
        node.metric("tessera_plugin_unprepare_duration_seconds_count{result=\"error\"}")
            .await
            .filter(|n| *n >= 1.0)
    })
    .await
    .unwrap();
    assert!(pods.get_opt("first").await.unwrap().is_some());
    node.checkpoint_dir_read_only(false).unwrap();
    delete_pod(&client, "first").await;
    for pod in ["on-read-only", "on-full"] {
        delete_pod(&client, pod).await;
    }
    eventually("every MIG instance to be destroyed", WAIT, || async {
        (instances() == 0).then_some(())
    })
    .await
    .unwrap();
}
