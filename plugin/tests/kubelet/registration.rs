use tessera_plugin::kubelet::{
    RegistrationState,
    client::{ClientError, DraClient, DraVersion},
    supported_versions,
};

use crate::common::{DRIVER, FakeDriver, Running, WAIT};

#[tokio::test]
async fn get_info_announces_the_dra_plugin_its_endpoint_and_all_versions() {
    let running = Running::start(FakeDriver::default()).await;
    let info = running
        .registration_client()
        .await
        .get_info()
        .await
        .unwrap();

    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    let endpoint = running
        .dir
        .path()
        .join("plugins")
        .join(DRIVER)
        .join("dra.sock");
    assert_eq!(info.endpoint, endpoint.to_str().unwrap());
    assert_eq!(running.server.dra_socket(), endpoint);
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
            "v1.DRAResourceHealth"
        ]
    );
    running.shutdown().await;
}

#[tokio::test]
async fn get_info_is_answered_again_and_again() {
    let running = Running::start(FakeDriver::default()).await;
    let client = running.registration_client().await;
    let first = client.get_info().await.unwrap();
    client.notify(true, "").await.unwrap();
    // A restarted kubelet opens a new connection and asks again.
    let again = running
        .registration_client()
        .await
        .get_info()
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(first, client.get_info().await.unwrap());
    running.shutdown().await;
}

#[test]
fn health_services_are_advertised_only_when_served() {
    assert_eq!(
        supported_versions(false),
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(supported_versions(true).len(), 4);
}

#[tokio::test]
async fn accepted_registration_is_reported_as_registered() {
    let running = Running::start(FakeDriver::default()).await;
    let mut state = running.server.registration_state();
    assert_eq!(*state.borrow(), RegistrationState::Pending);

    running
        .registration_client()
        .await
        .notify(true, "")
        .await
        .unwrap();

    let seen = tokio::time::timeout(WAIT, state.wait_for(RegistrationState::is_registered))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert_eq!(seen.to_string(), "registered");
    running.shutdown().await;
}

#[tokio::test]
async fn rejected_registration_returns_an_error_and_reports_the_failure() {
    let running = Running::start(FakeDriver::default()).await;
    let mut state = running.server.registration_state();

    let client = running.registration_client().await;
    let err = client.notify(false, "driver name taken").await.unwrap_err();

    let ClientError::Status { status, .. } = &err else {
        panic!("expected a status, got {err}")
    };
    assert!(status.message().contains("driver name taken"), "{status}");
    let failed = |s: &RegistrationState| matches!(s, RegistrationState::Failed(_));
    let seen = tokio::time::timeout(WAIT, state.wait_for(failed))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert_eq!(seen.to_string(), "registration failed: driver name taken");
    running.shutdown().await;
}

#[tokio::test]
async fn dra_client_connects_to_the_announced_endpoint_with_v1() {
    let running = Running::start(FakeDriver::default()).await;
    let info = running
        .registration_client()
        .await
        .get_info()
        .await
        .unwrap();
    let dra = DraClient::from_info(&info, WAIT).await.unwrap();
    assert_eq!(dra.version(), DraVersion::V1);
    assert!(dra.prepare(Vec::new()).await.unwrap().is_empty());
    running.shutdown().await;
}

#[test]
fn version_negotiation_takes_the_first_known_dra_service_in_the_plugins_list() {
    let list = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        DraVersion::negotiate(&list(&["v1beta1.DRAPlugin"])),
        Some(DraVersion::V1beta1)
    );
    assert_eq!(
        DraVersion::negotiate(&list(&[
            "v1alpha4.Node",
            "v1beta1.DRAPlugin",
            "v1.DRAPlugin"
        ])),
        Some(DraVersion::V1beta1)
    );
    assert_eq!(
        DraVersion::negotiate(&list(&["v1alpha1.DRAResourceHealth"])),
        None
    );
}
