//! The catalogue's H200 entry against what `kubectl tessera profiles --from-nvml -o json`
//! read from a real H200 (driver 580.159.04) on 2026-11-29 through the NVML backend.

use tessera_gpu::find_model;

#[test]
fn the_h200_catalogue_matches_the_nvml_capture_field_by_field() {
    let text = include_str!("data/h200-nvml-profiles-2026-11-29.json");
    let captured: serde_json::Value = serde_json::from_str(text).expect("capture is JSON");
    let layout = find_model("NVIDIA H200")
        .expect("H200 known")
        .mig
        .as_ref()
        .expect("MIG");
    let profiles = captured["profiles"].as_array().expect("profiles");
    assert_eq!(profiles.len(), layout.profiles.len());
    for c in profiles {
        let id = c["profileId"].as_u64().expect("id") as u32;
        let p = layout.profile(id).expect("profile id in catalogue");
        assert_eq!(c["name"], p.name.as_str());
        assert_eq!(c["computeSlices"], p.compute_slices);
        assert_eq!(c["memorySlices"], p.memory_slices);
        assert_eq!(c["memoryMiB"], p.memory_mib);
        assert_eq!(c["maxInstances"], p.max_instances);
        let starts: Vec<u8> = p.starts.iter().collect();
        assert_eq!(c["placements"], serde_json::json!(starts));
    }
}
