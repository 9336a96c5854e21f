use super::*;

#[test]
fn only_one_instance_holds_the_node_and_dropping_the_lock_frees_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeDir::new(dir.path().join("gpu.tessera.dev"));
    let first = node.try_lock().unwrap().expect("a free node is taken");
    assert!(
        node.try_lock().unwrap().is_none(),
        "a held node is not taken twice"
    );
    drop(first);
    assert!(node.try_lock().unwrap().is_some());
}

#[tokio::test]
async fn asking_a_node_nobody_serves_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeDir::new(dir.path());
    assert!(matches!(node.ask("b").await, Asked::NoOwner));
}

#[tokio::test]
async fn the_owner_hands_over_when_asked_and_the_new_instance_takes_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeDir::new(dir.path());
    let lock = node.try_lock().unwrap().unwrap();
    let listener = node.listen(&lock).unwrap();

    let taker = {
        let node = node.clone();
        tokio::spawn(async move { node.take("new-pod").await })
    };
    let request = listener.next().await.unwrap();
    assert_eq!(request.from, "new-pod");
    assert!(
        !taker.is_finished(),
        "nothing is taken before the owner lets go"
    );
    drop(listener);
    drop(lock);
    assert!(
        request.released().await,
        "the new instance says it took the node"
    );
    let taken = taker.await.unwrap().unwrap();
    assert!(
        node.try_lock().unwrap().is_none(),
        "the new instance holds it"
    );
    assert!(
        !dir.path().join(HANDOVER_SOCKET).exists(),
        "the old owner's socket is gone"
    );
    drop(taken);
}

#[tokio::test]
async fn an_owner_that_dies_without_replying_frees_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeDir::new(dir.path());
    let lock = node.try_lock().unwrap().unwrap();
    let listener = node.listen(&lock).unwrap();
    let taker = {
        let node = node.clone();
        tokio::spawn(async move { node.take("new-pod").await })
    };
    let request = listener.next().await.unwrap();
    // What the kernel does when the owner's process dies: its descriptors close.
    drop(request);
    drop(listener);
    drop(lock);
    taker.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_malformed_request_is_ignored_and_the_next_good_one_served() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeDir::new(dir.path());
    let lock = node.try_lock().unwrap().unwrap();
    let listener = node.listen(&lock).unwrap();
    let mut bad = UnixStream::connect(listener.path()).await.unwrap();
    bad.write_all(b"give me the node\n").await.unwrap();
    let asker = {
        let node = node.clone();
        tokio::spawn(async move { node.ask("good").await })
    };
    let request = listener.next().await.unwrap();
    assert_eq!(request.from, "good");
    let said = tokio::spawn(request.released());
    assert!(matches!(asker.await.unwrap(), Asked::Released(_)));
    assert!(
        !said.await.unwrap(),
        "an asker that does not take the lock says nothing"
    );
}

#[tokio::test]
async fn a_stale_handover_socket_of_a_dead_owner_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeDir::new(dir.path());
    // A socket file nobody listens on, as a SIGKILLed owner leaves it.
    let stale = std::os::unix::net::UnixListener::bind(dir.path().join(HANDOVER_SOCKET)).unwrap();
    drop(stale);
    let lock = node.try_lock().unwrap().unwrap();
    let listener = node.listen(&lock).unwrap();
    let asker = {
        let node = node.clone();
        tokio::spawn(async move { node.ask("b").await })
    };
    let said = tokio::spawn(listener.next().await.unwrap().released());
    assert!(matches!(asker.await.unwrap(), Asked::Released(_)));
    said.await.unwrap();
}

#[tokio::test]
async fn an_instance_waiting_for_the_node_takes_it_when_the_owner_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeDir::new(dir.path());
    let owner = node.try_lock().unwrap().unwrap();
    let waiter = {
        let node = node.clone();
        tokio::spawn(async move { node.lock().await })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    drop(owner);
    waiter.await.unwrap().unwrap();
}
