//! A GPU changing shape: the MIG mode every shape needs, set by prepare and by the keeper
//! from the offer the hand-over applied (never the spec's next shape), and devices of a
//! shape the GPU has left refused.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_gpu::backend::GpuBackend;

use super::*;
use crate::{slices::GpuOffer, state::NodeGpus};

const A100: &str = "a100-40gb";

impl TestNode {
    /// A claim allocated a share of `device` (a time-sliced GPU, or an MPS share when
    /// `capacity` names what it consumes).
    fn share(&self, uid: &str, device: &str, capacity: &[(&str, &str)]) -> ClaimRef {
        let c = self.claim(uid, &[device.to_string()]);
        let mut claims = self.api.claims.lock().unwrap();
        let claim = claims.get_mut(&format!("ns/claim-{uid}")).unwrap();
        let result = &mut claim
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()[0];
        result.share_id = Some(format!("share-{uid}"));
        if !capacity.is_empty() {
            result.consumed_capacity = Some(
                capacity
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), Quantity((*v).to_string())))
                    .collect(),
            );
        }
        c
    }

    fn mig_enabled(&self, gpu: u32) -> bool {
        self.sim.state().gpus[gpu as usize].mig_enabled
    }

    /// What the keeper wants for each GPU given these applied offers and no spec.
    fn wants(
        &self,
        offers: &[GpuOffer],
        spec: Option<&tessera_api::GpuNodeSpec>,
        allocated: &BTreeMap<u32, Vec<String>>,
    ) -> BTreeMap<u32, GpuWant> {
        let gpus = NodeGpus::read(self.sim.as_ref() as &dyn GpuBackend).unwrap();
        crate::driver::wants(&gpus, offers, spec, allocated)
    }
}

fn mps_share(node: &TestNode, uid: &str) -> ClaimRef {
    node.share(
        uid,
        "gpu-0-mps",
        &[("computePercent", "25"), ("memory", "4Gi")],
    )
}

#[tokio::test]
async fn an_mps_share_on_a_hopper_gpu_left_in_mig_mode_turns_mig_mode_off() {
    // The H100 served partitions, whose claims are gone; MIG mode is still on.
    let node = TestNode::new(1);
    assert!(node.mig_enabled(0));
    let driver = node.driver();

    driver.prepare_claim(&mps_share(&node, "a")).await.unwrap();

    assert!(!node.mig_enabled(0), "CUDA sees no whole GPU with MIG on");
    assert!(node.sim.state().gpus[0].mps.is_some());
}

#[tokio::test]
async fn a_time_sliced_claim_on_a_hopper_gpu_left_in_mig_mode_turns_mig_mode_off() {
    let node = TestNode::new(1);
    let driver = node.driver();

    driver
        .prepare_claim(&node.share("a", "gpu-0", &[]))
        .await
        .unwrap();

    assert!(!node.mig_enabled(0));
}

#[tokio::test]
async fn no_shape_but_a_partition_is_made_while_partitions_are_there() {
    let node = TestNode::new(1);
    let driver = node.driver();
    driver
        .prepare_claim(&node.claim("mig", &[mig(0, "1g.10gb", 0)]))
        .await
        .unwrap();

    let err = driver
        .prepare_claim(&mps_share(&node, "mps"))
        .await
        .unwrap_err();

    assert!(matches!(err, ClaimError::InUse { .. }), "{err:?}");
    assert!(node.mig_enabled(0));
    assert!(node.sim.state().gpus[0].mps.is_none());
}

#[tokio::test]
async fn the_keeper_turns_mig_mode_off_on_a_hopper_gpu_that_left_mig() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let mps = GpuOffer::Mps {
        max_clients: 8,
        default_thread_percentage: 12,
        default_memory_mib: 1024,
    };

    let report = driver
        .keeper()
        .hold(&node.wants(&[mps], None, &BTreeMap::new()))
        .await;

    assert_eq!(report, HoldReport::default());
    assert!(!node.mig_enabled(0));
}

#[tokio::test]
async fn a_hopper_gpu_offering_partitions_leaves_mig_mode_once_nothing_uses_it() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let dynamic = [GpuOffer::DynamicMig {
        allowed_profile_ids: vec![],
    }];
    let c = node.claim("a", &[mig(0, "3g.40gb", 0)]);
    driver.prepare_claim(&c).await.unwrap();
    driver
        .keeper()
        .hold(&node.wants(&dynamic, None, &BTreeMap::new()))
        .await;
    assert!(node.mig_enabled(0), "its partition is in use");

    driver.unprepare_claim(&c).await.unwrap();
    // Another partition is allocated and about to be prepared: the GPU is not idle.
    let allocated = BTreeMap::from([(0, vec!["ns/claim-b".to_string()])]);
    let report = driver
        .keeper()
        .hold(&node.wants(&dynamic, None, &allocated))
        .await;
    assert_eq!(report, HoldReport::default(), "waiting quietly");
    assert!(node.mig_enabled(0));

    driver
        .keeper()
        .hold(&node.wants(&dynamic, None, &BTreeMap::new()))
        .await;
    assert!(
        !node.mig_enabled(0),
        "idle: back to the mode every shape needs"
    );
    // The next partition turns it on again.
    driver
        .prepare_claim(&node.claim("c", &[mig(0, "1g.10gb", 0)]))
        .await
        .unwrap();
    assert!(node.mig_enabled(0));
}

/// An A100 governed by a spec entry of `strategy` that allows a reset.
fn a100_spec(strategy: tessera_api::policy::SharingStrategy) -> tessera_api::GpuNodeSpec {
    use tessera_api::gpunode::{GpuConfig, GpuMigConfig};
    tessera_api::GpuNodeSpec {
        gpus: vec![GpuConfig {
            index: 0,
            uuid: None,
            strategy,
            policy: Some("p".into()),
            mig: (strategy == tessera_api::policy::SharingStrategy::Mig)
                .then(GpuMigConfig::default),
            mps: None,
            time_slicing: None,
            allow_gpu_reset: true,
            alternatives: Vec::new(),
        }],
    }
}

#[tokio::test]
async fn an_a100_keeps_the_mig_mode_of_the_offer_the_hand_over_kept() {
    use tessera_api::policy::SharingStrategy;
    let node = TestNode::with(vec![inventory_gpu(A100, 0, true)]);
    let driver = node.driver();
    // The spec says Exclusive, but the fence still stands: the GPU offers partitions,
    // and one may be allocated from them any moment.
    let spec = a100_spec(SharingStrategy::Exclusive);
    let fenced = [GpuOffer::DynamicMig {
        allowed_profile_ids: vec![],
    }];

    let report = driver
        .keeper()
        .hold(&node.wants(&fenced, Some(&spec), &BTreeMap::new()))
        .await;

    assert_eq!(report, HoldReport::default());
    assert!(
        node.mig_enabled(0),
        "no reset before the hand-over switched"
    );
    // A partition allocated from the old offer is prepared.
    driver
        .prepare_claim(&node.claim("late", &[mig(0, "1g.5gb", 0)]))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_a100_is_not_reset_under_a_claim_allocated_and_not_prepared_yet() {
    use tessera_api::policy::SharingStrategy;
    let node = TestNode::with(vec![inventory_gpu(A100, 0, true)]);
    let driver = node.driver();
    let spec = a100_spec(SharingStrategy::Exclusive);
    let allocated = BTreeMap::from([(0, vec!["ns/claim-next".to_string()])]);

    let report = driver
        .keeper()
        .hold(&node.wants(&[GpuOffer::Exclusive], Some(&spec), &allocated))
        .await;

    assert!(node.mig_enabled(0), "not reset");
    assert!(
        report.incomplete[&0].contains("ns/claim-next"),
        "{report:?}"
    );
    // Once the claim is gone, the idle GPU is reset into the offer's mode.
    driver
        .keeper()
        .hold(&node.wants(&[GpuOffer::Exclusive], Some(&spec), &BTreeMap::new()))
        .await;
    assert!(!node.mig_enabled(0));
}

#[tokio::test]
async fn a_device_of_a_shape_the_gpu_has_left_is_refused() {
    let node = TestNode::new(1);
    node.applied.set(
        0,
        GpuOffer::Mps {
            max_clients: 8,
            default_thread_percentage: 12,
            default_memory_mib: 1024,
        },
    );
    let driver = node.driver();

    let err = driver
        .prepare_claim(&node.claim("late", &[mig(0, "3g.40gb", 0)]))
        .await
        .unwrap_err();

    let text = crate::error_chain(&err);
    assert!(matches!(err, ClaimError::NotOffered { .. }), "{text}");
    assert!(text.contains("offers MPS now"), "{text}");
    assert!(node.instances(0).is_empty());
    assert!(driver.claims.lock().await.claims.is_empty());
    driver
        .prepare_claim(&mps_share(&node, "now"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_whole_gpu_and_a_time_sliced_one_are_told_apart_by_the_share() {
    let node = TestNode::with(vec![inventory_gpu("l4", 0, false)]);
    node.applied.set(
        0,
        GpuOffer::TimeSlicing {
            max_clients: 4,
            interval: tessera_gpu::backend::TimeSlice::Default,
        },
    );
    let driver = node.driver();

    let err = driver
        .prepare_claim(&node.claim("whole", &["gpu-0".to_string()]))
        .await
        .unwrap_err();
    assert!(matches!(err, ClaimError::NotOffered { .. }), "{err:?}");
    driver
        .prepare_claim(&node.share("sliced", "gpu-0", &[]))
        .await
        .unwrap();

    node.applied.set(0, GpuOffer::Exclusive);
    let err = driver
        .prepare_claim(&node.share("sliced-late", "gpu-0", &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, ClaimError::NotOffered { .. }), "{err:?}");
}

#[tokio::test]
async fn shared_devices_never_join_a_gpu_held_whole() {
    // No applied offer to check against (hand-written allocations, or a first start):
    // the last line still holds.
    let node = TestNode::with(vec![inventory_gpu("l4", 0, false)]);
    let driver = node.driver();
    driver
        .prepare_claim(&node.claim("whole", &["gpu-0".to_string()]))
        .await
        .unwrap();

    for c in [node.share("sliced", "gpu-0", &[]), mps_share(&node, "mps")] {
        let err = driver.prepare_claim(&c).await.unwrap_err();
        assert!(matches!(err, ClaimError::InUse { .. }), "{err:?}");
    }
    assert!(node.sim.state().gpus[0].mps.is_none());
}
