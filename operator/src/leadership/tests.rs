use k8s_openapi::{
    api::coordination::v1::LeaseSpec,
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::runtime::watcher;

use super::*;

const MARGIN: Duration = Duration::from_millis(2500);

/// The Lease `tessera-system/op` as `holder` last renewed it at `renewed` for 15 s.
fn lease(holder: &str, renewed: SystemTime) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("op".into()),
            namespace: Some("tessera-system".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::try_from(renewed).unwrap())),
            ..LeaseSpec::default()
        }),
    }
}

/// This replica (`me`), elected as `elected` says, seeing `shown` in its Lease watch.
fn replica(elected: bool, shown: Option<Lease>) -> (Leadership, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(elected);
    let (store, mut writer) = reflector::store();
    if let Some(l) = shown {
        writer.apply_watcher_event(&watcher::Event::Apply(l));
    }
    let l = Leadership::elected(rx, store, "tessera-system", "op", "me", MARGIN);
    (l, tx)
}

#[test]
fn a_leader_stops_writing_once_its_last_renewal_may_have_run_out() {
    let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let at = |secs: f64| renewed + Duration::from_secs_f64(secs);
    // The lease manager still says it leads: it never says otherwise while renewals fail.
    let (l, _tx) = replica(true, Some(lease("me", renewed)));
    assert_eq!(l.writes_for(at(10.0)), Some(Duration::from_millis(2500)));
    assert!(l.leads(at(12.4)));
    assert!(
        !l.leads(at(12.5)),
        "15 s lease less the 2.5 s margin: it may have run out for the others"
    );
    assert!(!l.leads(at(60.0)));
}

#[test]
fn a_leader_writes_only_while_the_lease_it_sees_is_its_own() {
    let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let soon = renewed + Duration::from_secs(1);
    let (taken, _tx) = replica(true, Some(lease("other", renewed)));
    assert!(!taken.leads(soon), "another replica holds the Lease");
    let (unseen, _tx) = replica(true, None);
    assert!(!unseen.leads(soon), "no Lease seen yet");
    let (not_elected, _tx) = replica(false, Some(lease("me", renewed)));
    assert!(!not_elected.leads(soon));
    assert_eq!(
        Leadership::always().writes_for(soon),
        Some(Duration::MAX),
        "without leader election it always writes"
    );
}
