use tessera_api::{gpunode::GpuConfig, policy::SharingStrategy};

use super::*;

fn meta(uid: &str, version: &str, generation: i64) -> ObjectMeta {
    ObjectMeta {
        name: Some("n".into()),
        uid: Some(uid.into()),
        resource_version: Some(version.into()),
        generation: Some(generation),
        ..ObjectMeta::default()
    }
}

fn mps() -> GpuNodeSpec {
    GpuNodeSpec {
        gpus: vec![GpuConfig {
            index: 0,
            uuid: None,
            strategy: SharingStrategy::Mps,
            policy: Some("ad".into()),
            mig: None,
            mps: None,
            time_slicing: None,
            allow_gpu_reset: false,
            alternatives: Vec::new(),
        }],
    }
}

#[test]
fn a_write_stays_pending_until_its_echo_whatever_unrelated_writes_land_first() {
    let mut w = SpecWrites::default();
    // The cache showed version 10, generation 3; the spec write made version 12,
    // generation 4.
    w.wrote("n", &meta("u", "12", 4), mps());
    assert_eq!(w.pending("n", &meta("u", "10", 3)), Some(&mps()));
    // The plugin's status write landed before ours (version 11, same generation): the
    // cache moved on, but our spec is not in it yet.
    let status_first = meta("u", "11", 3);
    w.forget_echoed(|_| Some(&status_first));
    assert_eq!(
        w.pending("n", &meta("u", "11", 3)),
        Some(&mps()),
        "an unrelated write is not the echo of ours"
    );
    // The echo, and anything after it, holds our spec.
    assert_eq!(w.pending("n", &meta("u", "12", 4)), None);
    assert_eq!(w.pending("n", &meta("u", "13", 4)), None);
    let later = meta("u", "13", 4);
    w.forget_echoed(|_| Some(&later));
    assert_eq!(w.pending("n", &meta("u", "11", 3)), None, "forgotten");
}

#[test]
fn a_write_to_an_object_since_deleted_and_made_again_is_not_pending() {
    let mut w = SpecWrites::default();
    w.wrote("n", &meta("u", "12", 4), mps());
    // Recreated: a new uid, its generation starts at 1.
    assert_eq!(w.pending("n", &meta("v", "20", 1)), None);
    w.forget_echoed(|_| None);
    assert_eq!(w.pending("n", &meta("u", "10", 3)), None, "gone: forgotten");
}
