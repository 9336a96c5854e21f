//! The slice publisher against a real API server, when the world is not what it last
//! wrote: a slice deleted or edited behind its back must be written again, not lost to a
//! stale resourceVersion, and the pool must stay whole under one generation.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;
use tessera_api::constants::DRIVER_NAME;
use tessera_e2e::{cluster, start_for_test};
use tessera_plugin::slices::{DesiredPool, publish::Publisher};

const NODE: &str = "publisher-node";

/// One device slice per GPU, each device carrying `version` as an attribute, so a new
/// version of one GPU changes exactly that GPU's slice.
fn pool(versions: &[i64]) -> DesiredPool {
    DesiredPool {
        counter_slices: vec![],
        device_slices: versions
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let gpu = u32::try_from(i).unwrap();
                let device = Device {
                    name: format!("gpu-{gpu}"),
                    attributes: Some(
                        [(
                            "version".to_string(),
                            DeviceAttribute {
                                int: Some(*v),
                                ..DeviceAttribute::default()
                            },
                        )]
                        .into(),
                    ),
                    ..Device::default()
                };
                (gpu, vec![device])
            })
            .collect(),
    }
}

/// The pool as stored: (slice name, generation, slice count, device versions).
async fn stored(client: &Client) -> Vec<(String, i64, i64, Vec<i64>)> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let mut out: Vec<_> = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let versions = s
                .spec
                .devices
                .iter()
                .flatten()
                .map(|d| d.attributes.as_ref().unwrap()["version"].int.unwrap())
                .collect();
            (
                s.name_any(),
                s.spec.pool.generation,
                s.spec.pool.resource_slice_count,
                versions,
            )
        })
        .collect();
    out.sort();
    out
}

fn slice_name(i: usize) -> String {
    format!("{NODE}-{DRIVER_NAME}-{i:02}")
}

#[tokio::test]
async fn slices_deleted_or_edited_behind_the_publishers_back_are_written_again() {
    let cp = start_for_test().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let node = cluster::create_node(&client, NODE, &[]).await.unwrap();
    let mut publisher = Publisher::new(client.clone(), NODE, &node.uid().unwrap(), DRIVER_NAME);
    let slices: Api<ResourceSlice> = Api::all(client.clone());

    let first = publisher.publish(&pool(&[1, 1])).await.unwrap();
    assert!(first.changed && first.dropped_fields.is_empty());
    let g = first.generation;
    assert_eq!(
        stored(&client).await,
        vec![
            (slice_name(0), g, 2, vec![1]),
            (slice_name(1), g, 2, vec![1])
        ]
    );

    // Deleted behind its back: the update of that one slice finds it gone and creates it.
    slices
        .delete(&slice_name(1), &DeleteParams::default())
        .await
        .unwrap();
    let out = publisher.publish(&pool(&[1, 2])).await.unwrap();
    assert!(out.changed);
    assert_eq!(out.generation, g, "a one-slice change keeps the generation");
    assert_eq!(
        stored(&client).await,
        vec![
            (slice_name(0), g, 2, vec![1]),
            (slice_name(1), g, 2, vec![2])
        ]
    );

    // Edited behind its back: the update with the old resourceVersion conflicts, and the
    // publisher re-reads the slice and writes ours over it.
    slices
        .patch(
            &slice_name(0),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"edited": "by-hand"}}})),
        )
        .await
        .unwrap();
    let out = publisher.publish(&pool(&[3, 2])).await.unwrap();
    assert!(out.changed);
    assert_eq!(
        stored(&client).await,
        vec![
            (slice_name(0), g, 2, vec![3]),
            (slice_name(1), g, 2, vec![2])
        ]
    );

    // Nothing new: nothing written.
    let out = publisher.publish(&pool(&[3, 2])).await.unwrap();
    assert!(!out.changed);

    // A GPU more changes the slice count: every slice is written under a new generation.
    let out = publisher.publish(&pool(&[3, 2, 1])).await.unwrap();
    assert!(out.changed);
    assert!(out.generation > g);
    let g2 = out.generation;
    assert_eq!(
        stored(&client).await,
        vec![
            (slice_name(0), g2, 3, vec![3]),
            (slice_name(1), g2, 3, vec![2]),
            (slice_name(2), g2, 3, vec![1]),
        ]
    );

    // And a GPU fewer deletes the slice that is no longer part of the pool.
    let out = publisher.publish(&pool(&[3, 2])).await.unwrap();
    let g3 = out.generation;
    assert!(g3 > g2);
    assert_eq!(
        stored(&client).await,
        vec![
            (slice_name(0), g3, 2, vec![3]),
            (slice_name(1), g3, 2, vec![2])
        ]
    );
}
