//! Bad input and older clusters: per-claim errors, the last line of defence against double preparation, fields the API server drops.

use super::*;

#[tokio::test]
async fn bad_claims_get_per_claim_errors_and_do_not_fail_the_good_one() {
    let (cp, client) = setup().await;
    let node = SimNode::start(
        &cp,
        "strict",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    // Claims allocated by hand (as the scheduler would) to exercise the plugin's checks.
    let make = async |name: &str, driver: &str, device: &str| {
        let c = claims.create(&PostParams::default(), &from_json(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.tessera.dev"}}]}}
        }))).await.unwrap();
        let mut c2 = c.clone();
        c2.status = Some(from_json(json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": "strict", "device": device}]}}})));
        claims
            .replace_status(name, &PostParams::default(), &c2)
            .await
            .unwrap();
        tessera_plugin::kubelet::ClaimRef {
            namespace: NS.into(),
            uid: c.uid().unwrap(),
            name: name.into(),
        }
    };
    let good = make("good", "gpu.tessera.dev", "gpu-0-mig-1g-10gb-6").await;
    let foreign = make("foreign", "other.example.com", "gpu-0").await;
    let unknown = make("unknown", "gpu.tessera.dev", "gpu-0-mig-9g-99gb-0").await;
    let mut stale = make("stale", "gpu.tessera.dev", "gpu-0-mig-1g-10gb-0").await;
    stale.uid = "00000000-0000-0000-0000-000000000000".into();

    // Malformed and conflicting requests the kubelet never sends: call the plugin directly.
    let info = node.plugin_info().await.unwrap();
    let dra = tessera_plugin::kubelet::client::DraClient::from_info(&info, Duration::from_secs(45))
        .await
        .unwrap();
    let res = dra
        .prepare(vec![
            good.clone(),
            foreign.clone(),
            unknown.clone(),
            stale.clone(),
        ])
        .await
        .unwrap();
    assert_eq!(res.len(), 4, "{res:?}");
    let devices = res[&good.uid].as_ref().expect("the good claim is prepared");
    assert_eq!(devices[0].device_name, "gpu-0-mig-1g-10gb-6");
    let err = |r: &tessera_plugin::kubelet::ClaimRef| res[&r.uid].clone().unwrap_err();
    assert!(
        err(&foreign).contains("no device of driver gpu.tessera.dev"),
        "{}",
        err(&foreign)
    );
    assert!(
        err(&unknown).contains("gpu-0-mig-9g-99gb-0"),
        "{}",
        err(&unknown)
    );
    assert!(err(&stale).contains("replaced"), "{}", err(&stale));
    assert_eq!(
        sim(&node).gpus[0].instances.len(),
        1,
        "only the good claim made an instance"
    );
    // The last line of defence behind the scheduler: a device prepared for one claim is
    // refused to another.
    let twin = make("twin", "gpu.tessera.dev", "gpu-0-mig-1g-10gb-6").await;
    let res_twin = dra.prepare(vec![twin.clone()]).await.unwrap();
    let twin_err = res_twin[&twin.uid].clone().unwrap_err();
    assert!(
        twin_err.contains("already prepared for claim workloads/good"),
        "{twin_err}"
    );
    // Also under another name: the whole GPU holds the memory slices of the 1g.
    let whole = make("whole", "gpu.tessera.dev", "gpu-0").await;
    let res_whole = dra.prepare(vec![whole.clone()]).await.unwrap();
    let whole_err = res_whole[&whole.uid].clone().unwrap_err();
    assert!(
        whole_err.contains("already prepared for claim workloads/good (as gpu-0-mig-1g-10gb-6)"),
        "{whole_err}"
    );
    // Repeating the call returns the same answer without touching the hardware again.
    let again = dra.prepare(vec![good.clone()]).await.unwrap();
    assert_eq!(again[&good.uid].as_ref().unwrap(), devices);
    assert_eq!(sim(&node).gpus[0].instances.len(), 1);
    // Unprepare of the good one cleans up; of an unknown claim is fine.
    let un = dra
        .unprepare(vec![good.clone(), stale.clone()])
        .await
        .unwrap();
    assert!(un.values().all(Result::is_ok), "{un:?}");
    assert!(sim(&node).gpus[0].instances.is_empty());
}

#[tokio::test]
async fn dropped_slice_fields_are_reported_in_status_instead_of_republished_forever() {
    // A cluster without consumable capacity: the API server drops allowMultipleAllocations
    // and the capacity request policies of the MPS device.
    let cp = tessera_e2e::start_for_test_with_gates(&["DRAConsumableCapacity=false"])
        .await
        .unwrap();
    let client = cp.admin_client().await.unwrap();
    let node = SimNode::start(&cp, "old-cluster", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    operator_sets_gpus(
        &client,
        "old-cluster",
        json!([{"index": 0, "strategy": "MPS"}]),
    )
    .await;
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    let gn = cluster::wait_for(
        &gpunodes,
        "old-cluster",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == "ApiServerDroppedFields")
            })
        },
        "the dropped fields to be reported",
        WAIT,
    )
    .await
    .unwrap();
    let ready = gn
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("allowMultipleAllocations"),
        "{}",
        ready.message
    );
    // No publish loop: three node passes (spec changes that leave the offer as it is) write
    // the slices not once, although what the API server stored still differs from what
    // the plugin sent.
    let before = slice_generation(&client, "old-cluster").await;
    let passes = async {
        for policy in ["a", "b", "c"] {
            operator_sets_gpus(
                &client,
                "old-cluster",
                json!([{"index": 0, "strategy": "MPS", "policy": policy}]),
            )
            .await;
            let generation = gpunodes
                .get("old-cluster")
                .await
                .unwrap()
                .metadata
                .generation;
            cluster::wait_for(
                &gpunodes,
                "old-cluster",
                |g: Option<&tessera_api::GpuNode>| {
                    g.and_then(|g| g.status.as_ref())
                        .is_some_and(|s| s.observed_generation >= generation)
                },
                "the plugin to act on the spec change",
                WAIT,
            )
            .await
            .unwrap();
        }
    };
    let writes = slice_writes_during(&client, "old-cluster", passes, Duration::from_secs(1)).await;
    assert_eq!(writes, 0, "the plugin keeps republishing");
    assert_eq!(slice_generation(&client, "old-cluster").await, before);
    let (code, body) = node.http_get("/readyz").await.unwrap();
    assert_eq!(code, 200, "{body}");
}

/// `GpuNode` specs written by hand, wrong in ways the schema cannot see: an index the
/// node does not have, the UUID of another GPU, a static layout that overlaps itself.
/// Each is named in the `Applied` condition; only what fits is made on the hardware; and
/// the plugin settles instead of rewriting its slices or status over and over.
#[tokio::test]
async fn hand_written_gpunode_specs_that_cannot_apply_are_reported_and_touch_nothing_else() {
    let (cp, client) = setup().await;
    let node = SimNode::start(
        &cp,
        "hand-written",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let wrong_uuid = "GPU-00000000-0000-4000-8000-000000000000";
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    gpunodes
        .patch(
            "hand-written",
            &PatchParams::apply("an-admin").force(),
            &Patch::Apply(json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": "hand-written"},
                "spec": {"gpus": [
                    {"index": 0, "uuid": wrong_uuid, "strategy": "Exclusive"},
                    {"index": 1, "strategy": "MIG", "mig": {"mode": "Static", "instances": [
                        {"profile": "4g.40gb", "start": 0},
                        {"profile": "3g.40gb", "start": 0},
                        {"profile": "3g.40gb", "start": 4}
                    ]}},
                    {"index": 5, "strategy": "MPS"}
                ]}
            })),
        )
        .await
        .unwrap();
    let generation = gpunodes
        .get("hand-written")
        .await
        .unwrap()
        .metadata
        .generation;
    let applied = |g: &tessera_api::GpuNode| {
        g.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Applied").cloned())
    };
    let gn = cluster::wait_for(
        &gpunodes,
        "hand-written",
        |g: Option<&tessera_api::GpuNode>| {
            g.is_some_and(|g| {
                g.status
                    .as_ref()
                    .is_some_and(|s| s.observed_generation >= generation)
                    && applied(g).is_some_and(|c| c.reason == "ConfigNotApplicable")
            })
        },
        "the plugin to report the spec it cannot apply",
        WAIT,
    )
    .await
    .unwrap();
    let condition = applied(&gn).unwrap();
    assert_eq!(condition.status, "False");
    for says in [
        "GPU 5, which this node does not have",
        wrong_uuid,
        "3g.40gb at 0 is left out",
    ] {
        assert!(
            condition.message.contains(says),
            "{says}: {}",
            condition.message
        );
    }
    // The layout's instances that fit are held; the GPU named by a wrong UUID keeps the
    // default, which makes nothing ahead of claims.
    eventually("the static layout's instances that fit", WAIT, || async {
        let state = sim(&node);
        // NVML profile ids on an H100: 5 is 4g.40gb, 9 is 3g.40gb.
        let mut made: Vec<(u32, u8)> = state.gpus[1]
            .instances
            .iter()
            .map(|i| (i.profile_id, i.start))
            .collect();
        made.sort();
        (made == [(5, 0), (9, 4)]).then_some(())
    })
    .await
    .unwrap();
    assert!(sim(&node).gpus[0].instances.is_empty());

    // Settled (the status, written after the slices in each pass, shows the instances):
    // nothing is rewritten while nothing changes.
    cluster::wait_for(
        &gpunodes,
        "hand-written",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref())
                .is_some_and(|s| s.mig_instances == 2)
        },
        "the status to show the layout's instances",
        WAIT,
    )
    .await
    .unwrap();
    let version = gpunodes
        .get("hand-written")
        .await
        .unwrap()
        .metadata
        .resource_version;
    let writes = slice_writes_during(
        &client,
        "hand-written",
        std::future::ready(()),
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(writes, 0, "the plugin keeps republishing");
    let after = gpunodes
        .get("hand-written")
        .await
        .unwrap()
        .metadata
        .resource_version;
    assert_eq!(after, version, "the plugin keeps rewriting the GpuNode");
    let (code, body) = node.http_get("/readyz").await.unwrap();
    assert_eq!(code, 200, "{body}");
}
