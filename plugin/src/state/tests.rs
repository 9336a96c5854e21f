use tessera_gpu::find_model;

use super::*;

fn h100() -> MigLayout {
    find_model("h100-80gb").unwrap().mig.clone().unwrap()
}

fn instance(layout: &MigLayout, profile: &str, start: u8) -> MigInstance {
    let p = layout.profile_by_name(profile).unwrap();
    MigInstance {
        gpu: 0,
        gpu_instance_id: u32::from(start) + 1,
        profile_id: p.profile_id,
        profile_name: profile.into(),
        start,
        size: p.memory_slices,
        compute_instances: vec![],
    }
}

#[test]
fn instances_that_fit_the_geometry_make_their_occupancy() {
    let layout = h100();
    let layouts = BTreeMap::from([(0, layout.clone())]);
    let live = BTreeMap::from([(0, vec![instance(&layout, "3g.40gb", 0)])]);

    let (occ, rejected) = occupancy_of(&layouts, &live);

    assert!(rejected.is_empty(), "{rejected:?}");
    let free: Vec<u8> = occ[&0].feasible_starts(&layout, 9);
    assert_eq!(free, [4], "the other 3g placement stays free");
}

#[test]
fn instances_the_geometry_rejects_leave_the_gpu_full_and_say_why() {
    // Overlapping instances cannot exist on this geometry: the catalogue is wrong for this
    // GPU or driver, so nothing may be offered on it.
    let layout = h100();
    let layouts = BTreeMap::from([(0, layout.clone())]);
    let live = BTreeMap::from([(
        0,
        vec![
            instance(&layout, "3g.40gb", 0),
            instance(&layout, "1g.10gb", 2),
        ],
    )]);

    let (occ, rejected) = occupancy_of(&layouts, &live);

    assert!(
        occ[&0].feasible_placements(&layout).is_empty(),
        "nothing is free"
    );
    let why = &rejected[&0];
    assert!(why.contains("3g.40gb at 0, 1g.10gb at 2"), "{why}");
    assert!(why.contains("offers no partitions"), "{why}");
}
