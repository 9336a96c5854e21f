use std::{os::unix::fs::FileTypeExt, sync::Arc};

use tessera_plugin::kubelet::{
    KubeletServerConfig, RegistrationState, ServeError,
    client::RegistrationClient,
    sockets::{self, SocketError},
    start,
};
use tokio::sync::watch;

use crate::common::{FakeDriver, Running, WAIT, config};

async fn start_err(cfg: KubeletServerConfig) -> ServeError {
    let (_health, rx) = watch::channel(Vec::new());
    match start(cfg, Arc::new(FakeDriver::default()), rx).await {
        Ok(_) => panic!("start should have failed"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn a_stale_socket_is_removed_before_bind() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    // A socket file left behind by a crashed run: bound, then the listener dropped.
    for path in [cfg.dra_socket(), cfg.registration_socket()] {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
    }
    let (_health, rx) = watch::channel(Vec::new());

    let server = start(cfg, Arc::new(FakeDriver::default()), rx)
        .await
        .unwrap();

    let client = RegistrationClient::connect(server.registration_socket(), WAIT)
        .await
        .unwrap();
    client.get_info().await.unwrap();
    server.serve_until(async {}).await.unwrap();
}

#[tokio::test]
async fn a_regular_file_at_the_socket_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let path = cfg.registration_socket();
    std::fs::create_dir_all(&cfg.registry_dir).unwrap();
    std::fs::write(&path, "not a socket").unwrap();

    let err = start_err(cfg.clone()).await;

    assert!(
        matches!(err, ServeError::Socket(SocketError::NotASocket { .. })),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(path.to_str().unwrap()) && message.contains("regular file"),
        "{message}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
    // The DRA socket, bound first, does not outlive the failed start.
    assert!(!cfg.dra_socket().exists());
}

#[tokio::test]
async fn a_path_over_the_af_unix_limit_is_refused_before_anything_is_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    cfg.registry_dir = dir.path().join("r".repeat(120));
    let path = cfg.registration_socket();

    let err = start_err(cfg.clone()).await;

    let message = err.to_string();
    let len = path.as_os_str().len().to_string();
    assert!(message.contains(path.to_str().unwrap()), "{message}");
    assert!(
        message.contains(&len) && message.contains("choose shorter directories"),
        "{message}"
    );
    assert!(!cfg.dra_socket().exists());
}

#[test]
fn the_longest_path_that_fits_sun_path_is_accepted() {
    let fits = format!("/{}", "a".repeat(106));
    assert_eq!(fits.len(), 107);
    sockets::check_path(fits.as_ref()).unwrap();
    let too_long = format!("/{}", "a".repeat(107));
    assert!(matches!(
        sockets::check_path(too_long.as_ref()),
        Err(SocketError::PathTooLong { len: 108, .. })
    ));
}

#[tokio::test]
async fn both_sockets_are_removed_after_shutdown() {
    let running = Running::start(FakeDriver::default()).await;
    let paths = [
        running.server.dra_socket().to_owned(),
        running.server.registration_socket().to_owned(),
    ];
    for path in &paths {
        assert!(
            std::fs::symlink_metadata(path)
                .unwrap()
                .file_type()
                .is_socket()
        );
    }
    // An open kubelet connection must not hold up the shutdown.
    let _kubelet = running.registration_client().await;

    let _dir = running.shutdown().await;

    for path in &paths {
        assert!(!path.exists(), "{} left behind", path.display());
    }
}

#[tokio::test]
async fn the_registration_socket_is_recreated_after_deletion() {
    let running = Running::start(FakeDriver::default()).await;
    let mut state = running.server.registration_state();
    let old = running.registration_client().await;
    old.notify(true, "").await.unwrap();
    tokio::time::timeout(WAIT, state.wait_for(RegistrationState::is_registered))
        .await
        .unwrap()
        .unwrap();

    // What a kubelet that wipes its registry directory on restart does.
    std::fs::remove_dir_all(running.server.registration_socket().parent().unwrap()).unwrap();

    // The state drops back to Pending once the new socket listens.
    let pending = |s: &RegistrationState| *s == RegistrationState::Pending;
    tokio::time::timeout(WAIT, state.wait_for(pending))
        .await
        .unwrap()
        .unwrap();
    let info = running
        .registration_client()
        .await
        .get_info()
        .await
        .unwrap();
    assert_eq!(info.endpoint, running.server.dra_socket().to_str().unwrap());
    running
        .registration_client()
        .await
        .notify(true, "")
        .await
        .unwrap();
    tokio::time::timeout(WAIT, state.wait_for(RegistrationState::is_registered))
        .await
        .unwrap()
        .unwrap();
    running.shutdown().await;
}

#[test]
fn instance_sockets_carry_the_pod_uid_like_the_go_library_names_them() {
    let dir = std::path::Path::new("/var/lib/kubelet/plugins_registry");
    let uid = "0f6a2c3e-6b1d-4c55-9d5e-7d6a0c2b1a90";
    assert_eq!(
        sockets::instance_registration_socket_path(dir, "gpu.tessera.dev", uid),
        dir.join(format!("gpu.tessera.dev-{uid}-reg.sock"))
    );
    assert_eq!(
        sockets::instance_dra_socket_path(
            "/var/lib/kubelet/plugins".as_ref(),
            "gpu.tessera.dev",
            uid
        ),
        std::path::PathBuf::from(format!(
            "/var/lib/kubelet/plugins/gpu.tessera.dev/dra-{uid}.sock"
        ))
    );
}

#[test]
fn an_instance_socket_that_would_not_fit_falls_back_to_hashed_names_that_do() {
    let uid = "0f6a2c3e-6b1d-4c55-9d5e-7d6a0c2b1a90";
    // Long enough that the UID does not fit, short enough that the 8-byte hash does.
    let dir = std::path::PathBuf::from(format!("/{}", "d".repeat(50)));
    let hashed = sockets::instance_registration_socket_path(&dir, "gpu.tessera.dev", uid);
    let name = hashed.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("gpu.tessera.dev-") && name.ends_with("-reg.sock"),
        "{name}"
    );
    assert_eq!(name.len(), "gpu.tessera.dev--reg.sock".len() + 11, "{name}");
    sockets::check_path(&hashed).unwrap();
    // Too long for the driver name as well: the shortest form.
    let dir = std::path::PathBuf::from(format!("/{}", "d".repeat(70)));
    let shortest = sockets::instance_registration_socket_path(&dir, "gpu.tessera.dev", uid);
    let name = shortest.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("dra-") && name.ends_with("-reg.sock"),
        "{name}"
    );
    sockets::check_path(&shortest).unwrap();
    // Another pod gets another name.
    assert_ne!(
        shortest,
        sockets::instance_registration_socket_path(&dir, "gpu.tessera.dev", "another-pod")
    );
}

#[tokio::test]
async fn two_instances_listen_side_by_side_and_stopping_one_leaves_the_others_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let instance = |uid: &str| KubeletServerConfig {
        instance: Some(uid.to_string()),
        ..config(&dir)
    };
    let (_h1, rx1) = watch::channel(Vec::new());
    let (_h2, rx2) = watch::channel(Vec::new());
    let old = start(instance("old-pod"), Arc::new(FakeDriver::default()), rx1)
        .await
        .unwrap();
    let new = start(instance("new-pod"), Arc::new(FakeDriver::default()), rx2)
        .await
        .unwrap();
    assert_ne!(old.registration_socket(), new.registration_socket());
    assert_ne!(old.dra_socket(), new.dra_socket());
    let new_paths = [
        new.registration_socket().to_owned(),
        new.dra_socket().to_owned(),
    ];
    let old_paths = [
        old.registration_socket().to_owned(),
        old.dra_socket().to_owned(),
    ];

    old.serve_until(std::future::ready(())).await.unwrap();

    for p in &old_paths {
        assert!(!p.exists(), "{} left behind", p.display());
    }
    for p in &new_paths {
        assert!(p.exists(), "{} removed by the other instance", p.display());
    }
    let client = RegistrationClient::connect(&new_paths[0], WAIT)
        .await
        .unwrap();
    client.get_info().await.unwrap();
    new.serve_until(std::future::ready(())).await.unwrap();
}

#[tokio::test]
async fn a_socket_another_instance_bound_at_our_path_is_not_removed_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (_h1, rx1) = watch::channel(Vec::new());
    let (_h2, rx2) = watch::channel(Vec::new());
    // Without pod UIDs both instances use the same paths: the second replaces the first's.
    let first = start(config(&dir), Arc::new(FakeDriver::default()), rx1)
        .await
        .unwrap();
    let second = start(config(&dir), Arc::new(FakeDriver::default()), rx2)
        .await
        .unwrap();
    let dra = second.dra_socket().to_owned();

    first.serve_until(std::future::ready(())).await.unwrap();

    assert!(
        dra.exists(),
        "the first instance removed the second's DRA socket"
    );
    second.serve_until(std::future::ready(())).await.unwrap();
    assert!(!dra.exists());
}
