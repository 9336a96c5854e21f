//! The driver on the simulated hardware, with claims from an in-memory API: failures part
//! way through a prepare, crashes (a new driver on the same files and hardware), and the
//! paths of start-up recovery.

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaimStatus,
};
use tessera_gpu::{
    backend::{
        MigInstance, Operation,
        sim::{FailureSpec, Inventory, InventoryGpu, SimBackend, SimConfig, SimLatencies},
    },
    naming,
};

use super::{fake::FakeClaims, *};
use crate::{
    checkpoint::{ClaimPhase, ClaimRecord, DeviceKind},
    ratelimit::RateLimiter,
};

mod corpus;
mod layout;
mod shapes;

const DRIVER: &str = "gpu.tessera.dev";
const NODE: &str = "node-a";

/// A node with H100s in MIG mode, its files in a temporary directory.
struct TestNode {
    dir: tempfile::TempDir,
    sim: Arc<SimBackend>,
    api: Arc<FakeClaims>,
    /// What the node loop's hand-over would have applied (empty: nothing yet).
    applied: crate::fence::AppliedOffers,
    /// The driver's files and device nodes of the node, in memory.
    files: Arc<crate::driver_files::DriverFiles>,
}

/// A GPU of `model` at `index` of a test node.
fn inventory_gpu(model: &str, index: usize, mig_enabled: bool) -> InventoryGpu {
    InventoryGpu {
        model: model.into(),
        uuid: Some(format!("GPU-{index:08x}-0000-4000-8000-000000000000")),
        mig_enabled,
        resettable: true,
        instances: vec![],
    }
}

impl TestNode {
    fn new(gpus: usize) -> Self {
        Self::with(
            (0..gpus)
                .map(|i| inventory_gpu("h100-80gb", i, true))
                .collect(),
        )
    }

    fn with(gpus: Vec<InventoryGpu>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (_, files) = crate::driver_files::tests::node_files_for(gpus.len() as u32);
        let inventory = Inventory {
            gpus,
            latencies: None,
        };
        let sim = SimBackend::new(SimConfig {
            inventory,
            latencies: Some(SimLatencies::zero()),
            caps_root: Some(dir.path().join("caps")),
            ..SimConfig::default()
        })
        .unwrap();
        Self {
            dir,
            sim: Arc::new(sim),
            api: Arc::new(FakeClaims::default()),
            applied: crate::fence::AppliedOffers::default(),
            files,
        }
    }

    fn cdi(&self) -> CdiWriter {
        CdiWriter::new(self.dir.path().join("cdi"), DRIVER, self.files.clone())
    }

    /// A driver on this node's files and hardware: calling it again is a plugin restart.
    fn driver(&self) -> Arc<Driver> {
        self.driver_with_cdi(self.cdi())
    }

    fn driver_with_cdi(&self, cdi: CdiWriter) -> Arc<Driver> {
        let backend: Arc<dyn GpuBackend> = self.sim.clone();
        Driver::new(DriverConfig {
            node: NODE.into(),
            driver_name: DRIVER.into(),
            backend: backend.clone(),
            gpus: NodeGpus::read(backend.as_ref()).unwrap(),
            store: CheckpointStore::new(self.dir.path(), Some("boot-1".into())),
            claims: Arc::new(self.api.clone()),
            cdi,
            mps_root: self.dir.path().join("mps"),
            caps_root: self.dir.path().join("caps"),
            applied: self.applied.clone(),
            metrics: Arc::new(Metrics::new()),
            background: tokio::runtime::Handle::current(),
            status_rate: RateLimiter::new(0.0, 1),
        })
        .unwrap()
    }

    /// A claim allocated `devices` of this node, known to the API.
    fn claim(&self, uid: &str, devices: &[String]) -> ClaimRef {
        self.allocated(uid, DRIVER, NODE, devices)
    }

    /// A claim allocated `devices` of `driver` in `pool`, known to the API.
    fn allocated(&self, uid: &str, driver: &str, pool: &str, devices: &[String]) -> ClaimRef {
        let results = devices
            .iter()
            .enumerate()
            .map(|(i, d)| DeviceRequestAllocationResult {
                driver: driver.into(),
                pool: pool.into(),
                device: d.clone(),
                request: format!("r{i}"),
                ..Default::default()
            })
            .collect();
        let mut claim = ResourceClaim::default();
        claim.metadata.namespace = Some("ns".into());
        claim.metadata.name = Some(format!("claim-{uid}"));
        claim.metadata.uid = Some(uid.into());
        claim.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.api.insert(claim);
        ClaimRef {
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
        }
    }

    fn instances(&self, gpu: u32) -> Vec<MigInstance> {
        self.sim.mig_instances(gpu).unwrap()
    }
}

fn mig(gpu: u32, profile: &str, start: u8) -> String {
    naming::mig_device_name(gpu, profile, start).unwrap()
}

fn uuids(instances: &[MigInstance]) -> Vec<String> {
    instances
        .iter()
        .filter_map(|i| i.uuid().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_failure_between_the_devices_of_a_claim_undoes_the_first() {
    let node = TestNode::new(2);
    let driver = node.driver();
    let c = node.claim("a", &[mig(0, "3g.40gb", 0), mig(1, "3g.40gb", 4)]);
    node.sim.inject(FailureSpec {
        operation: Operation::CreateGpuInstance,
        count: 1,
        gpu: Some(1),
        message: None,
    });

    let err = driver.prepare_claim(&c).await.unwrap_err();

    assert!(matches!(err, ClaimError::Hardware(_)), "{err:?}");
    assert!(node.instances(0).is_empty(), "the first device was undone");
    assert!(node.instances(1).is_empty());
    assert!(
        driver.claims.lock().await.claims.is_empty(),
        "no record left"
    );
    assert!(!node.cdi().exists("a"));

    // The kubelet's retry starts from clean hardware and succeeds.
    let prepared = driver.prepare_claim(&c).await.unwrap();
    assert_eq!(prepared.len(), 2);
    assert_eq!(node.instances(0).len(), 1);
    assert_eq!(node.instances(1).len(), 1);
}

#[tokio::test]
async fn a_failing_cdi_write_fails_the_claim_and_the_retry_remakes_its_instance() {
    let node = TestNode::new(1);
    // A CDI directory that cannot be created: its parent is a file.
    std::fs::write(node.dir.path().join("not-a-dir"), "").unwrap();
    let broken = CdiWriter::new(
        node.dir.path().join("not-a-dir/cdi"),
        DRIVER,
        node.files.clone(),
    );
    let driver = node.driver_with_cdi(broken);
    let c = node.claim("a", &[mig(0, "1g.10gb", 3)]);

    let err = driver.prepare_claim(&c).await.unwrap_err();

    assert!(matches!(err, ClaimError::Cdi(_)), "{err:?}");
    let first = uuids(&node.instances(0));
    assert_eq!(
        first.len(),
        1,
        "the instance stays until the retry or unprepare"
    );
    let rec = driver.claims.lock().await.claims["a"].clone();
    assert_eq!(
        rec.phase,
        ClaimPhase::PrepareStarted,
        "never reported prepared"
    );

    // The plugin restarts with a working directory; the kubelet retries.
    let driver = node.driver();
    let report = driver.recover().await.unwrap();
    assert_eq!(report.rolled_back, ["a"]);
    assert!(
        node.instances(0).is_empty(),
        "recovery destroyed the half-made instance"
    );
    driver.prepare_claim(&c).await.unwrap();
    let second = uuids(&node.instances(0));
    assert_eq!(second.len(), 1);
    assert_ne!(first, second, "a new instance, not the orphan");
    assert!(node.cdi().exists("a"));
}

#[tokio::test]
async fn a_crash_before_the_first_hardware_change_is_rolled_back_without_touching_hardware() {
    let node = TestNode::new(1);
    // Someone else's instance, which must survive the rollback of a record at its
    // placement's neighbour.
    node.sim.create_mig_device(0, 9, 4).unwrap();
    let foreign = uuids(&node.instances(0));
    let driver = node.driver();
    let c = node.claim("a", &[mig(0, "3g.40gb", 0)]);
    let claim = driver.read_claim(&c).await.unwrap();
    let devices = driver.plan(&claim).unwrap();
    // What phase 1 writes before the first hardware call; then the process dies.
    driver
        .save_record(&ClaimRecord {
            namespace: "ns".into(),
            name: "claim-a".into(),
            uid: "a".into(),
            phase: ClaimPhase::PrepareStarted,
            devices,
        })
        .await
        .unwrap();
    drop(driver);

    let driver = node.driver();
    let report = driver.recover().await.unwrap();

    assert_eq!(report.rolled_back, ["a"]);
    assert_eq!(report.foreign_instances, ["0/4/3g.40gb"]);
    assert_eq!(uuids(&node.instances(0)), foreign, "nothing was destroyed");
    assert!(driver.claims.lock().await.claims.is_empty());
    driver.prepare_claim(&c).await.unwrap();
    assert_eq!(node.instances(0).len(), 2);
}

#[tokio::test]
async fn recovery_forgets_a_prepared_claim_whose_instance_is_gone() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let c = node.claim("a", &[mig(0, "2g.20gb", 2)]);
    driver.prepare_claim(&c).await.unwrap();
    // Someone (an admin, a GPU reset) destroyed it while the plugin was down.
    let gi = node.instances(0)[0].gpu_instance_id;
    node.sim.destroy_mig_device(0, gi).unwrap();

    let driver = node.driver();
    let report = driver.recover().await.unwrap();

    assert_eq!(report.forgotten, ["a"]);
    assert!(driver.claims.lock().await.claims.is_empty());
    assert!(!node.cdi().exists("a"), "its CDI spec went with it");
    // The kubelet's next prepare makes it again instead of returning a stale device.
    driver.prepare_claim(&c).await.unwrap();
    assert_eq!(node.instances(0).len(), 1);
}

#[tokio::test]
async fn recovery_releases_a_prepared_claim_whose_resource_claim_is_gone() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let kept = node.claim("kept", &[mig(0, "1g.10gb", 0)]);
    let gone = node.claim("gone", &[mig(0, "1g.10gb", 1)]);
    driver.prepare_claim(&kept).await.unwrap();
    driver.prepare_claim(&gone).await.unwrap();
    node.api.remove("ns", "claim-gone");

    let driver = node.driver();
    let report = driver.recover().await.unwrap();

    assert_eq!(report.released, ["gone"]);
    let left = node.instances(0);
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].start, 0,
        "the claim that still exists keeps its instance"
    );
    assert!(node.cdi().exists("kept"));
    assert!(!node.cdi().exists("gone"));
}

#[tokio::test]
async fn recovery_keeps_a_claim_when_the_api_cannot_say_whether_it_exists() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let c = node.claim("a", &[mig(0, "1g.10gb", 0)]);
    driver.prepare_claim(&c).await.unwrap();
    *node.api.fail_with.lock().unwrap() = Some(503);

    let driver = node.driver();
    let report = driver.recover().await.unwrap();

    assert!(report.released.is_empty(), "{report:?}");
    assert_eq!(node.instances(0).len(), 1);
    assert!(driver.claims.lock().await.claims.contains_key("a"));
}

#[tokio::test]
async fn a_bad_claim_fails_alone_in_a_batch() {
    let node = TestNode::new(1);
    let handle = DriverHandle(node.driver());
    let good = node.claim("good", &[mig(0, "1g.10gb", 0)]);
    let bad_start = node.claim("bad-start", &[mig(0, "3g.40gb", 1)]);
    let bad_gpu = node.claim("bad-gpu", &[mig(7, "1g.10gb", 0)]);
    let missing = ClaimRef {
        namespace: "ns".into(),
        name: "nobody".into(),
        uid: "nobody".into(),
    };

    let results = handle
        .prepare(vec![good, bad_start, bad_gpu, missing])
        .await;

    assert!(results["good"].is_ok(), "{:?}", results["good"]);
    let msg = |uid: &str| results[uid].clone().unwrap_err();
    assert!(
        msg("bad-start").contains("cannot start at memory slice 1"),
        "{}",
        msg("bad-start")
    );
    assert!(
        msg("bad-gpu").contains("GPU 7, which this node does not have"),
        "{}",
        msg("bad-gpu")
    );
    assert!(
        msg("nobody").contains("ResourceClaim ns/nobody does not exist"),
        "{}",
        msg("nobody")
    );
    assert_eq!(node.instances(0).len(), 1);
}

#[tokio::test]
async fn a_replaced_claim_is_refused_with_both_uids() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let mut c = node.claim("new-uid", &[mig(0, "1g.10gb", 0)]);
    c.uid = "old-uid".into();

    let err = driver.prepare_claim(&c).await.unwrap_err();

    let text = crate::error_chain(&err);
    assert!(
        text.contains("has UID new-uid, the kubelet asked for old-uid"),
        "{text}"
    );
    assert!(node.instances(0).is_empty());
}

#[tokio::test]
async fn an_error_chain_names_each_layer_once() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let c = node.claim("a", &["gpu-0-mig-9g-99gb-0".to_string()]);

    let err = driver.prepare_claim(&c).await.unwrap_err();

    let text = crate::error_chain(&err);
    assert!(
        text.starts_with("device gpu-0-mig-9g-99gb-0: its MIG profile is not one of the GPU's: "),
        "{text}"
    );
    let parts: Vec<&str> = text.split(": ").collect();
    let mut unique = parts.clone();
    unique.dedup();
    assert_eq!(parts, unique, "no layer repeats the one below: {text}");
}

#[tokio::test]
async fn unprepare_destroys_exactly_the_instance_it_made() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let c = node.claim("a", &[mig(0, "1g.10gb", 0)]);
    driver.prepare_claim(&c).await.unwrap();
    let made = driver.claims.lock().await.claims["a"].devices[0]
        .kind
        .clone();
    let DeviceKind::Mig {
        created: Some(made),
        ..
    } = made
    else {
        panic!("{made:?}")
    };
    assert_eq!(uuids(&node.instances(0)), [made.uuid]);

    driver.unprepare_claim(&c).await.unwrap();
    driver.unprepare_claim(&c).await.unwrap();

    assert!(node.instances(0).is_empty());
    assert!(!node.cdi().exists("a"));
    assert!(driver.claims.lock().await.claims.is_empty());
}

#[tokio::test]
async fn a_rollback_that_fails_at_start_up_keeps_its_record_and_the_other_gpus_serve() {
    let node = TestNode::new(2);
    let driver = node.driver();
    let stuck = node.claim("stuck", &[mig(0, "3g.40gb", 0)]);
    let fine = node.claim("fine", &[mig(1, "3g.40gb", 0)]);
    driver.prepare_claim(&stuck).await.unwrap();
    driver.prepare_claim(&fine).await.unwrap();
    // Both claims are gone while the plugin is down, and the driver refuses to destroy
    // GPU 0's instance: a process still uses it.
    node.api.remove("ns", "claim-stuck");
    node.api.remove("ns", "claim-fine");
    node.sim.inject(FailureSpec {
        operation: Operation::DestroyComputeInstance,
        count: 1,
        gpu: Some(0),
        message: Some("In use by another client".into()),
    });

    let driver = node.driver();
    let report = driver.recover().await.unwrap();

    assert_eq!(report.released, ["fine"], "the other GPU was settled");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert!(report.failed[0].starts_with("stuck: "), "{report:?}");
    assert!(node.instances(1).is_empty());
    assert_eq!(node.instances(0).len(), 1, "nothing forced");
    assert!(
        driver.claims.lock().await.claims.contains_key("stuck"),
        "the record stays: its instance is still there"
    );
    let holding = driver
        .keeper()
        .hold(&std::collections::BTreeMap::new())
        .await;
    assert!(
        holding.incomplete[&0].contains("claim ns/claim-stuck"),
        "{holding:?}"
    );
    // GPU 1 serves.
    driver
        .prepare_claim(&node.claim("next", &[mig(1, "1g.10gb", 0)]))
        .await
        .unwrap();
    // The kubelet's unprepare of the stuck claim settles it once the instance is free.
    driver.unprepare_claim(&stuck).await.unwrap();
    assert!(node.instances(0).is_empty());
    assert!(
        !driver
            .keeper()
            .hold(&std::collections::BTreeMap::new())
            .await
            .incomplete
            .contains_key(&0)
    );
}
