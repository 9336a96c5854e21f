use std::collections::BTreeSet;

use tessera_api::gpunode::{GpuConfig, GpuState};

use super::*;
use crate::resolve::NodeView;

fn spec(strategy: SharingStrategy) -> BTreeMap<String, GpuNodeSpec> {
    BTreeMap::from([(
        "n".to_string(),
        GpuNodeSpec {
            gpus: vec![GpuConfig {
                index: 0,
                uuid: None,
                strategy,
                policy: Some("ad".into()),
                mig: None,
                mps: None,
                time_slicing: None,
                allow_gpu_reset: false,
                alternatives: Vec::new(),
            }],
        },
    )])
}

fn snapshot(reported: Option<SharingStrategy>) -> Snapshot {
    Snapshot {
        nodes: BTreeMap::from([(
            "n".to_string(),
            NodeView {
                gpus: vec![GpuState {
                    index: 0,
                    strategy: reported,
                    ..GpuState::default()
                }],
                users: BTreeMap::from([(0, BTreeSet::new())]),
                ..NodeView::default()
            },
        )]),
        ..Snapshot::default()
    }
}

fn moving(t0: Instant) -> Transitions {
    let mut t = Transitions::default();
    t.start(
        ("n".into(), 0),
        Transition {
            policy: "ad".into(),
            from: SharingStrategy::Mig,
            to: SharingStrategy::Mps,
            started: t0,
        },
    );
    t
}

fn none(_: &GpuKey) -> Vec<(String, String)> {
    Vec::new()
}

#[test]
fn a_move_is_applied_when_the_plugin_reports_the_new_strategy_and_not_before() {
    let t0 = Instant::now();
    let mut t = moving(t0);
    let specs = spec(SharingStrategy::Mps);
    let later = t0 + Duration::from_millis(1500);
    assert!(
        t.observe(&snapshot(Some(SharingStrategy::Mig)), &specs, none, later)
            .is_empty()
    );
    assert_eq!(t.len(), 1);
    let ended = t.observe(&snapshot(Some(SharingStrategy::Mps)), &specs, none, later);
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].2, Outcome::Applied(Duration::from_millis(1500)));
    assert!(t.is_empty(), "an ended move is no longer followed");
}

#[test]
fn a_claim_on_the_new_shape_means_applied_even_before_the_status_says_so() {
    let t0 = Instant::now();
    let mut t = moving(t0);
    let ended = t.observe(
        &snapshot(Some(SharingStrategy::Mig)),
        &spec(SharingStrategy::Mps),
        |_| vec![("ns/share".into(), "gpu-0-mps".into())],
        t0,
    );
    assert_eq!(ended[0].2.label(), "applied");
}

#[test]
fn a_claim_on_the_old_shape_holds_the_move_back_and_names_the_claims() {
    let t0 = Instant::now();
    let mut t = moving(t0);
    let ended = t.observe(
        &snapshot(Some(SharingStrategy::Mig)),
        &spec(SharingStrategy::Mps),
        |_| {
            vec![
                ("ns/b".into(), "gpu-0-mig-1g10gb-3".into()),
                ("ns/a".into(), "gpu-0-mig-1g10gb-0".into()),
                ("ns/a".into(), "gpu-0-mig-1g10gb-1".into()),
            ]
        },
        t0,
    );
    assert_eq!(
        ended[0].2,
        Outcome::HeldBack(vec!["ns/a".into(), "ns/b".into()])
    );
}

#[test]
fn between_whole_and_time_sliced_only_the_status_tells_a_held_back_move() {
    let t0 = Instant::now();
    let mut t = Transitions::default();
    t.start(
        ("n".into(), 0),
        Transition {
            policy: "ad".into(),
            from: SharingStrategy::Exclusive,
            to: SharingStrategy::TimeSlicing,
            started: t0,
        },
    );
    let claim = |_: &GpuKey| vec![("ns/c".to_string(), "gpu-0".to_string())];
    let ended = t.observe(
        &snapshot(Some(SharingStrategy::Exclusive)),
        &spec(SharingStrategy::TimeSlicing),
        claim,
        t0,
    );
    assert_eq!(ended[0].2.label(), "held_back");
}

#[test]
fn a_move_the_spec_no_longer_asks_for_is_superseded() {
    let t0 = Instant::now();
    let mut t = moving(t0);
    let ended = t.observe(
        &snapshot(Some(SharingStrategy::Mig)),
        &spec(SharingStrategy::Mig),
        none,
        t0,
    );
    assert_eq!(ended[0].2, Outcome::Superseded);
    let mut t = moving(t0);
    let ended = t.observe(&Snapshot::default(), &BTreeMap::new(), none, t0);
    assert_eq!(ended[0].2, Outcome::Superseded, "the GPU is gone");
}

#[test]
fn a_move_that_never_lands_times_out() {
    let t0 = Instant::now();
    let mut t = moving(t0);
    let specs = spec(SharingStrategy::Mps);
    let stuck = snapshot(Some(SharingStrategy::Mig));
    assert_eq!(t.next_timeout(t0), Some(TIMEOUT));
    let just_before = t0 + TIMEOUT - Duration::from_secs(1);
    assert!(t.observe(&stuck, &specs, none, just_before).is_empty());
    assert_eq!(t.next_timeout(just_before), Some(Duration::from_secs(1)));
    let ended = t.observe(&stuck, &specs, none, t0 + TIMEOUT);
    assert_eq!(ended[0].2, Outcome::TimedOut);
    assert_eq!(t.next_timeout(t0), None);
}
