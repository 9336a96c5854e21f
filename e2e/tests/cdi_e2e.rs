//! Tessera's CDI specs against NVIDIA's own generator and the reference CDI library.
//!
//! One simulated node, a pod per device kind (a whole GPU, a MIG device, an MPS share, a
//! time-sliced GPU) prepared through the real kubelet code. Then NVIDIA's `nvidia-ctk cdi
//! generate` runs against the node's driver root, through the simulated `libnvidia-ml`,
//! and for each pod the reference CDI library (what containerd and CRI-O run) injects the
//! CDI id the kubelet handed the runtime, from Tessera's spec, and the same device by
//! UUID from NVIDIA's spec, each into an empty OCI spec. Every device node, mount, library
//! link, loader directory and hook NVIDIA gives the device, Tessera's container must have
//! too, but for the differences `tessera_e2e::cdi_compare::DOCUMENTED` lists with reasons
//! (docs/reference/cdi.md). MPS shares and time-sliced GPUs are whole GPUs in NVIDIA's
//! terms.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::time::Duration;

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tessera_e2e::{
    cdi_compare::{DOCUMENTED, Edits, extra, missing},
    cdi_tools::{self, CdiTools},
    cluster,
    plugin::SimNode,
    runc,
};

const NS: &str = "workloads";
const WAIT: Duration = Duration::from_secs(90);

/// The pods: (name, class, selector, capacity).
const PODS: [(&str, &str, Option<&str>, bool); 4] = [
    (
        "mig",
        "mig.tessera.dev",
        Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
        false,
    ),
    (
        "whole",
        "gpu.tessera.dev",
        Some("device.attributes['gpu.tessera.dev'].productName == 'NVIDIA L4'"),
        false,
    ),
    ("mps", "mps.tessera.dev", None, true),
    ("timeslice", "timeslice.tessera.dev", None, false),
];

#[tokio::test]
async fn every_device_kind_gets_what_nvidias_generator_gives_it() {
    let tools = CdiTools::for_tests().unwrap();
    let (cp, client) = tessera_e2e::start_for_workloads(NS).await.unwrap();
    let node = SimNode::start(
        &cp,
        "cdi-node",
        "gpus: [{model: h100-80gb}, {model: l4}, {model: l4}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    // The operator's job, by hand: GPU 2 shares with MPS, GPU 3 is time-sliced.
    Api::<tessera_api::GpuNode>::all(client.clone())
        .patch(
            "cdi-node",
            &PatchParams::apply("tessera-operator").force(),
            &Patch::Apply(json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": "cdi-node"},
                "spec": {"gpus": [
                    {"index": 2, "strategy": "MPS", "mps": {"maxClients": 4}},
                    {"index": 3, "strategy": "TimeSlicing"}
                ]}
            })),
        )
        .await
        .unwrap();
    for (name, class, selector, capacity) in PODS {
        let req = cluster::GpuRequest {
            class,
            selector,
            capacity: capacity.then(|| json!({"computePercent": "25", "memory": "4Gi"})),
        };
        cluster::create_claim_pod(&client, NS, name, req)
            .await
            .unwrap();
    }
    let mut prepared = Vec::new();
    for (name, ..) in PODS {
        let pod: Pod = cluster::wait_pod_running(&client, NS, name, WAIT)
            .await
            .unwrap();
        let ids = node.kubelet.cdi_devices(&pod.uid().unwrap())["main"].clone();
        assert_eq!(ids.len(), 1, "{name}: {ids:?}");
        prepared.push((name, ids[0].clone()));
    }

    // NVIDIA's spec of the node as it is now (the MIG instance exists).
    let work = tempfile::tempdir().unwrap();
    let nvidia_dir = work.path().join("nvidia");
    std::fs::create_dir_all(&nvidia_dir).unwrap();
    let started = std::time::Instant::now();
    cdi_tools::generate(
        &tools.nvidia_ctk,
        node.driver().path(),
        &nvidia_dir.join("nvidia.yaml"),
    )
    .unwrap();
    eprintln!(
        "nvidia-ctk cdi generate took {} ms",
        started.elapsed().as_millis()
    );

    let mut gaps = Vec::new();
    for (name, id) in &prepared {
        let ours = cdi_tools::inject(&tools.inject, &node.cdi_dir(), None, &[id]).unwrap();
        let ours = Edits::of(&ours);
        // The device's UUID, as the claim's spec names it.
        let uuid = ours
            .env
            .get("TESSERA_DEVICE_UUID")
            .unwrap_or_else(|| panic!("{name}: no TESSERA_DEVICE_UUID in {ours:?}"))
            .clone();
        let theirs = cdi_tools::inject(
            &tools.inject,
            &nvidia_dir,
            None,
            &[&format!("nvidia.com/gpu={uuid}")],
        )
        .unwrap();
        let theirs = Edits::of(&theirs);
        // Non-trivial on both sides: the device's own node and the driver's library.
        for e in [&ours, &theirs] {
            assert!(
                e.devices.keys().any(|p| p.starts_with("/dev/nvidia"))
                    && e.mounts.keys().any(|m| m.contains("libcuda.so.")),
                "{name}: {e:?}"
            );
        }
        eprintln!(
            "{name} ({uuid}): NVIDIA gives {} nodes, {} mounts, {} links; Tessera adds {:?}",
            theirs.devices.len(),
            theirs.mounts.len(),
            theirs.links.len(),
            extra(&theirs, &ours)
        );
        gaps.extend(
            missing(&theirs, &ours)
                .into_iter()
                .map(|g| format!("{name}: {g}")),
        );
    }
    assert!(
        gaps.is_empty(),
        "NVIDIA's generator gives these and Tessera does not (documented differences: {:?}):\n{}",
        DOCUMENTED.iter().map(|(d, _)| *d).collect::<Vec<_>>(),
        gaps.join("\n")
    );

    // The same CDI ids in real containers: runc applies the edits the reference library
    // made of Tessera's specs (nodes, mounts, the hook's links and loader cache) and the
    // probe checks, from inside, what CUDA needs.
    let probe = runc::probe_binary().unwrap();
    let driver_lib = node.driver().lib_dir().join(format!(
        "libcuda.so.{}",
        tessera_gpu::backend::sim::DRIVER_VERSION
    ));
    // `change` edits the OCI spec the runtime got, as a tenant's own pod spec could.
    let container_with = |name: &str, ids: &[&str], change: &dyn Fn(&mut serde_json::Value)| {
        let bundle = work.path().join(format!("bundle-{name}"));
        std::fs::create_dir_all(&bundle).unwrap();
        runc::make_rootfs(&bundle.join("rootfs"), &probe, &driver_lib).unwrap();
        let base = runc::base_config(&tools.runc, &bundle, &node.driver().kernel()).unwrap();
        let base_file = bundle.join("base.json");
        std::fs::write(&base_file, serde_json::to_vec(&base).unwrap()).unwrap();
        let mut config = if ids.is_empty() {
            base
        } else {
            cdi_tools::inject(&tools.inject, &node.cdi_dir(), Some(&base_file), ids).unwrap()
        };
        change(&mut config);
        runc::run(
            &tools.runc,
            &bundle,
            &format!("tessera-cdi-{name}"),
            &config,
        )
        .unwrap()
    };
    let container = |name: &str, ids: &[&str]| container_with(name, ids, &|_| {});
    for (name, id) in &prepared {
        let out = container(name, &[id]);
        eprintln!("==== probe in the {name} container\n{}", out.output);
        assert_eq!(out.code, 0, "{name}: the probe failed:\n{}", out.output);
        assert!(
            out.output.contains("CUDA sees the claimed device"),
            "{name}: {}",
            out.output
        );
        let cache = std::fs::read(out.rootfs.join("etc/ld.so.cache")).unwrap();
        let lib = b"/usr/lib/x86_64-linux-gnu/libcuda.so.1";
        assert!(
            cache.windows(lib.len()).any(|w| w == lib),
            "{name}: the hook's ldconfig run lists libcuda.so.1"
        );
    }
    // MPS: the claim asked for 25 % and 4 GiB of the L4, and its server holds it there.
    let mps_id = prepared
        .iter()
        .find(|(n, _)| *n == "mps")
        .map(|(_, id)| id.clone())
        .unwrap();
    let share = "4096 MiB free of 4096 MiB, 15 SMs";
    let out = container_with("mps-greedy", &[&mps_id], &|c| {
        // A tenant that asks its own process for the whole GPU only lowers, never raises.
        let env = c["process"]["env"].as_array_mut().unwrap();
        env.push(json!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"));
        env.push(json!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=22000M"));
    });
    assert_eq!(out.code, 0, "{}", out.output);
    assert!(
        out.output.contains(share),
        "the server's limits hold:\n{}",
        out.output
    );
    let out = container_with("mps-modest", &[&mps_id], &|c| {
        let env = c["process"]["env"].as_array_mut().unwrap();
        env.push(json!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M"));
    });
    assert!(
        out.output.contains("1024 MiB free of 1024 MiB, 15 SMs"),
        "a client's own lower limit applies:\n{}",
        out.output
    );
    // Without the daemon's shared memory at /dev/shm, the client cannot reach its server.
    let out = container_with("mps-no-shm", &[&mps_id], &|c| {
        c["mounts"]
            .as_array_mut()
            .unwrap()
            .retain(|m| m["destination"] != "/dev/shm");
    });
    assert_ne!(out.code, 0, "{}", out.output);
    assert!(out.output.contains("CUresult 805"), "{}", out.output);

    // Without a device the same container has no GPU, and the probe says why.
    let bare = container("none", &[]);
    assert_ne!(bare.code, 0, "{}", bare.output);
    assert!(bare.output.contains("/dev/nvidiactl"), "{}", bare.output);

    // MIG: both name the GPU instance's and compute instance's capability nodes.
    let mig_claim = claim_of(&client, "mig").await;
    let spec = std::fs::read_to_string(node.cdi_dir().join(format!(
        "k8s.gpu.tessera.dev-claim_{}.json",
        mig_claim.uid().unwrap()
    )))
    .unwrap();
    assert!(spec.contains("/dev/nvidia-caps/nvidia-cap"), "{spec}");
}

async fn claim_of(client: &kube::Client, pod: &str) -> ResourceClaim {
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .get(pod)
        .await
        .unwrap();
    let name = pod
        .status
        .and_then(|s| s.resource_claim_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.resource_claim_name)
        .unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(&name)
        .await
        .unwrap()
}
