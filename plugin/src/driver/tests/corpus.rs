//! A generated corpus of prepare batches the kubelet (or anything on its socket) could
//! send: good claims mixed with unknown ones, replaced UIDs, claims of another driver or
//! node, device names that name nothing, claims deleted before the call. Each claim gets
//! its own result, a bad one touches no hardware, a good one is prepared, and afterwards
//! unpreparing the whole batch leaves the GPUs as they were and the driver still serves.
//! (Empty fields and duplicate UIDs are refused by the gRPC layer before the driver; its
//! own tests cover them.)

use proptest::prelude::*;

use super::*;

/// One claim of a batch.
#[derive(Clone, Debug)]
enum Entry {
    /// A 1g.10gb at a placement no other good claim of the batch uses.
    Good,
    /// Not in the API.
    Unknown,
    /// In the API under another UID (deleted and recreated).
    Replaced,
    /// Allocated to another driver only.
    Foreign,
    /// Allocated on another node's pool.
    OtherNode,
    /// A device name that names nothing on this node.
    NoSuchDevice(String),
    /// Deleted between the allocation and the call.
    Deleted,
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        4 => Just(Entry::Good),
        1 => Just(Entry::Unknown),
        1 => Just(Entry::Replaced),
        1 => Just(Entry::Foreign),
        1 => Just(Entry::OtherNode),
        1 => "[a-z0-9-]{0,40}".prop_map(Entry::NoSuchDevice),
        1 => Just(Entry::Deleted),
    ]
}

fn allocated(node: &TestNode, uid: &str, driver: &str, pool: &str, device: &str) -> ClaimRef {
    node.allocated(uid, driver, pool, &[device.to_string()])
}

fn total_instances(node: &TestNode) -> usize {
    (0..2).map(|g| node.instances(g).len()).sum()
}

async fn run_batch(entries: Vec<Entry>) -> Result<(), TestCaseError> {
    let node = TestNode::new(2);
    let handle = DriverHandle(node.driver());
    let mut batch = Vec::new();
    let mut good = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let uid = format!("c{i}");
        let placement = good.len();
        let device = mig((placement / 7) as u32, "1g.10gb", (placement % 7) as u8);
        let c = match e {
            Entry::Good => {
                good.push(uid.clone());
                allocated(&node, &uid, DRIVER, NODE, &device)
            }
            Entry::Unknown => ClaimRef {
                namespace: "ns".into(),
                name: format!("claim-{uid}"),
                uid: uid.clone(),
            },
            Entry::Replaced => {
                let mut c = allocated(&node, &format!("{uid}-new"), DRIVER, NODE, &device);
                c.name = format!("claim-{uid}-new");
                c.uid = uid.clone();
                c
            }
            Entry::Foreign => allocated(&node, &uid, "other.example.com", NODE, &device),
            Entry::OtherNode => allocated(&node, &uid, DRIVER, "node-b", &device),
            Entry::NoSuchDevice(name) => allocated(&node, &uid, DRIVER, NODE, name),
            Entry::Deleted => {
                let c = allocated(&node, &uid, DRIVER, NODE, &device);
                node.api.remove("ns", &c.name);
                c
            }
        };
        batch.push(c);
    }
    let results = handle.prepare(batch.clone()).await;
    prop_assert_eq!(results.len(), batch.len(), "one result per claim");
    for (c, e) in batch.iter().zip(&entries) {
        let r = &results[&c.uid];
        match e {
            Entry::Good => prop_assert!(r.is_ok(), "{:?}: {:?}", e, r),
            // A claim with nothing of this driver on this node prepares nothing.
            Entry::Foreign | Entry::OtherNode => prop_assert!(
                r.as_ref().map_or(true, |d| d.is_empty()),
                "{:?}: {:?}",
                e,
                r
            ),
            _ => {
                let msg = r.as_ref().err();
                prop_assert!(msg.is_some_and(|m| !m.is_empty()), "{:?}: {:?}", e, r);
            }
        }
    }
    prop_assert_eq!(
        total_instances(&node),
        good.len(),
        "only good claims touched hardware"
    );

    let undone = handle.unprepare(batch.clone()).await;
    prop_assert_eq!(undone.len(), batch.len());
    for (uid, r) in &undone {
        prop_assert!(r.is_ok(), "unprepare {}: {:?}", uid, r);
    }
    prop_assert_eq!(
        total_instances(&node),
        0,
        "unprepare leaves the GPUs as they were"
    );

    // The driver still serves.
    let after = allocated(&node, "after", DRIVER, NODE, &mig(0, "1g.10gb", 0));
    let r = handle.prepare(vec![after]).await;
    prop_assert!(r["after"].is_ok(), "{:?}", r["after"]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_claim_of_a_malformed_batch_gets_its_own_result_and_bad_ones_touch_nothing(
        entries in prop::collection::vec(entry(), 0..24)
            .prop_filter("at most 14 good claims (two GPUs of seven 1g.10gb)", |v| {
                v.iter().filter(|e| matches!(e, Entry::Good)).count() <= 14
            })
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        rt.block_on(run_batch(entries))?;
    }
}

#[tokio::test]
async fn an_oversized_batch_of_unknown_claims_fails_each_and_touches_nothing() {
    let node = TestNode::new(2);
    let handle = DriverHandle(node.driver());
    let batch: Vec<ClaimRef> = (0..500)
        .map(|i| ClaimRef {
            namespace: "ns".into(),
            name: format!("nobody-{i}"),
            uid: format!("u{i}"),
        })
        .collect();
    let results = handle.prepare(batch).await;
    assert_eq!(results.len(), 500);
    assert!(results.values().all(|r| r.is_err()));
    assert_eq!(total_instances(&node), 0);
}
