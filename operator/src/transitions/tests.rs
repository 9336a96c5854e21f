use std::collections::BTreeSet;

use tessera_api::gpunode::{GpuConfig, GpuState};

use super::*;
use crate::{resolve::NodeView, usage::Allocated};

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

fn none() -> BTreeMap<GpuKey, Vec<Allocated>> {
    BTreeMap::new()
}

/// Claims allocated on GPU 0 of node `n`: (claim, device, a share of a shared device).
fn on_gpu(claims: &[(&str, &str, bool)]) -> BTreeMap<GpuKey, Vec<Allocated>> {
    BTreeMap::from([(
        ("n".to_string(), 0),
        claims
            .iter()
            .map(|(claim, device, shared)| Allocated {
                claim: (*claim).into(),
                pool: "n".into(),
                device: (*device).into(),
                compute_percent: None,
                memory_mib: None,
                consumed: BTreeMap::new(),
                latent: false,
                shared: *shared,
            })
            .collect(),
    )])
}

#[test]
fn a_move_is_applied_when_the_plugin_reports_the_new_strategy_and_not_before() {
    let t0 = Instant::now();
    let mut t = moving(t0);
    let specs = spec(SharingStrategy::Mps);
    let later = t0 + Duration::from_millis(1500);
    assert!(
        t.observe(
            &snapshot(Some(SharingStrategy::Mig)),
            &specs,
            &none(),
            later
        )
        .is_empty()
    );
    assert_eq!(t.len(), 1);
    let ended = t.observe(
        &snapshot(Some(SharingStrategy::Mps)),
        &specs,
        &none(),
        later,
    );
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
        &on_gpu(&[("ns/share", "gpu-0-mps", true)]),
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
        &on_gpu(&[
            ("ns/b", "gpu-0-mig-1g10gb-3", false),
            ("ns/a", "gpu-0-mig-1g10gb-0", false),
            ("ns/a", "gpu-0-mig-1g10gb-1", false),
        ]),
        t0,
    );
    assert_eq!(
        ended[0].2,
        Outcome::HeldBack(vec!["ns/a".into(), "ns/b".into()])
    );
}

/// A move of GPU 0 of `n` between a whole and a time-sliced GPU, which both publish
/// `gpu-0`.
fn whole_and_sliced(from: SharingStrategy, to: SharingStrategy, t0: Instant) -> Transitions {
    let mut t = Transitions::default();
    t.start(
        ("n".into(), 0),
        Transition {
            policy: "ad".into(),
            from,
            to,
            started: t0,
        },
    );
    t
}

#[test]
fn between_whole_and_time_sliced_the_allocation_tells_which_shape_it_came_from() {
    let (ex, ts) = (SharingStrategy::Exclusive, SharingStrategy::TimeSlicing);
    let t0 = Instant::now();
    let observe = |from, to, shared| {
        whole_and_sliced(from, to, t0).observe(
            &snapshot(Some(from)),
            &spec(to),
            &on_gpu(&[("ns/c", "gpu-0", shared)]),
            t0,
        )[0]
        .2
        .clone()
    };
    // The status still says whole; a share of the time-sliced gpu-0 is the new shape.
    assert_eq!(observe(ex, ts, true), Outcome::Applied(Duration::ZERO));
    assert_eq!(
        observe(ex, ts, false),
        Outcome::HeldBack(vec!["ns/c".into()])
    );
    assert_eq!(observe(ts, ex, false), Outcome::Applied(Duration::ZERO));
    assert_eq!(
        observe(ts, ex, true),
        Outcome::HeldBack(vec!["ns/c".into()])
    );
}

#[test]
fn a_move_the_spec_no_longer_asks_for_is_superseded() {
    let t0 = Instant::now();
    let mut t = moving(t0);
    let ended = t.observe(
        &snapshot(Some(SharingStrategy::Mig)),
        &spec(SharingStrategy::Mig),
        &none(),
        t0,
    );
    assert_eq!(ended[0].2, Outcome::Superseded);
    let mut t = moving(t0);
    let ended = t.observe(&Snapshot::default(), &BTreeMap::new(), &none(), t0);
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
    assert!(t.observe(&stuck, &specs, &none(), just_before).is_empty());
    assert_eq!(t.next_timeout(just_before), Some(Duration::from_secs(1)));
    let ended = t.observe(&stuck, &specs, &none(), t0 + TIMEOUT);
    assert_eq!(ended[0].2, Outcome::TimedOut);
    assert_eq!(t.next_timeout(t0), None);
}
