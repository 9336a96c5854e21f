use std::collections::HashMap;

use tessera_plugin::kubelet::{
    NO_RESULT, PreparedDevice,
    client::{DraClient, DraVersion},
};

use crate::common::{FakeDriver, Running, WAIT, claim, device_for};

async fn client(running: &Running, version: DraVersion) -> DraClient {
    DraClient::connect(running.server.dra_socket(), version, WAIT)
        .await
        .unwrap()
}

fn failing(uid: &str, error: &str) -> FakeDriver {
    FakeDriver {
        fail: HashMap::from([(uid.to_owned(), error.to_owned())]),
        ..Default::default()
    }
}

#[tokio::test]
async fn prepare_over_v1_returns_per_claim_devices_and_errors() {
    let running = Running::start(failing("uid-b", "no such GPU")).await;
    let dra = client(&running, DraVersion::V1).await;

    let results = dra
        .prepare(vec![claim("ns", "uid-a", "a"), claim("ns", "uid-b", "b")])
        .await
        .unwrap();

    assert_eq!(results.len(), 2);
    assert_eq!(
        results["uid-a"],
        Ok(vec![device_for("uid-a")]),
        "v1 carries share_id"
    );
    assert_eq!(results["uid-b"], Err("no such GPU".to_owned()));
    running.shutdown().await;
}

#[tokio::test]
async fn prepare_over_v1beta1_returns_per_claim_devices_without_share_id() {
    let running = Running::start(failing("uid-b", "no such GPU")).await;
    let dra = client(&running, DraVersion::V1beta1).await;

    let results = dra
        .prepare(vec![claim("ns", "uid-a", "a"), claim("ns", "uid-b", "b")])
        .await
        .unwrap();

    let expected = PreparedDevice {
        share_id: None,
        ..device_for("uid-a")
    };
    assert_eq!(results["uid-a"], Ok(vec![expected]));
    assert_eq!(results["uid-b"], Err("no such GPU".to_owned()));
    running.shutdown().await;
}

#[tokio::test]
async fn a_claim_with_an_empty_field_fails_alone_and_never_reaches_the_driver() {
    let running = Running::start(FakeDriver::default()).await;
    let dra = client(&running, DraVersion::V1).await;

    let results = dra
        .prepare(vec![
            claim("ns", "", "no-uid"),
            claim("ns", "uid-a", "a"),
            claim("", "uid-c", "no-namespace"),
        ])
        .await
        .unwrap();

    assert_eq!(results.len(), 3);
    assert_eq!(results["uid-a"], Ok(vec![device_for("uid-a")]));
    // Without a UID the entry is keyed by namespace/name.
    assert_eq!(
        results["ns/no-uid"],
        Err("invalid claim: empty uid".to_owned())
    );
    assert_eq!(
        results["uid-c"],
        Err("invalid claim: empty namespace".to_owned())
    );
    assert_eq!(
        *running.driver.prepared.lock().unwrap(),
        [vec![claim("ns", "uid-a", "a")]]
    );
    running.shutdown().await;
}

#[tokio::test]
async fn a_claim_the_driver_forgot_gets_an_internal_error() {
    let driver = FakeDriver {
        forget: ["uid-b".to_owned()].into(),
        ..Default::default()
    };
    let running = Running::start(driver).await;
    let dra = client(&running, DraVersion::V1).await;

    let claims = vec![claim("ns", "uid-a", "a"), claim("ns", "uid-b", "b")];
    let prepared = dra.prepare(claims.clone()).await.unwrap();
    let unprepared = dra.unprepare(claims).await.unwrap();

    assert_eq!(prepared["uid-a"], Ok(vec![device_for("uid-a")]));
    assert_eq!(prepared["uid-b"], Err(NO_RESULT.to_owned()));
    assert_eq!(unprepared["uid-a"], Ok(()));
    assert_eq!(unprepared["uid-b"], Err(NO_RESULT.to_owned()));
    running.shutdown().await;
}

#[tokio::test]
async fn duplicate_claims_reach_the_driver_once() {
    let running = Running::start(FakeDriver::default()).await;
    let dra = client(&running, DraVersion::V1).await;

    let a = claim("ns", "uid-a", "a");
    let results = dra.prepare(vec![a.clone(), a.clone()]).await.unwrap();

    assert_eq!(results.len(), 1);
    assert_eq!(*running.driver.prepared.lock().unwrap(), [vec![a]]);
    running.shutdown().await;
}

#[tokio::test]
async fn unprepare_of_an_unknown_claim_has_an_entry_in_both_versions() {
    let running = Running::start(FakeDriver::default()).await;
    for version in [DraVersion::V1, DraVersion::V1beta1] {
        let dra = client(&running, version).await;
        let results = dra
            .unprepare(vec![claim("ns", "never-prepared", "gone")])
            .await
            .unwrap();
        assert_eq!(
            results,
            HashMap::from([("never-prepared".to_owned(), Ok(()))]),
            "{version:?}"
        );
    }
    assert_eq!(running.driver.unprepared.lock().unwrap().len(), 2);
    running.shutdown().await;
}

#[tokio::test]
async fn an_empty_request_succeeds_without_calling_the_driver() {
    let running = Running::start(FakeDriver::default()).await;
    let dra = client(&running, DraVersion::V1).await;

    assert!(dra.prepare(Vec::new()).await.unwrap().is_empty());
    assert!(dra.unprepare(Vec::new()).await.unwrap().is_empty());
    assert!(running.driver.prepared.lock().unwrap().is_empty());
    assert!(running.driver.unprepared.lock().unwrap().is_empty());
    running.shutdown().await;
}

#[tokio::test]
async fn a_device_without_a_pool_name_fails_its_claim() {
    let driver = FakeDriver {
        broken_device: ["uid-a".to_owned()].into(),
        ..Default::default()
    };
    let running = Running::start(driver).await;
    let dra = client(&running, DraVersion::V1).await;

    let results = dra
        .prepare(vec![claim("ns", "uid-a", "a"), claim("ns", "uid-b", "b")])
        .await
        .unwrap();

    let error = results["uid-a"].as_ref().unwrap_err();
    assert!(error.starts_with("internal:"), "{error}");
    assert_eq!(results["uid-b"], Ok(vec![device_for("uid-b")]));
    running.shutdown().await;
}
