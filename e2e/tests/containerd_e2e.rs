//! Real containers on a containerd node of the test bed (`tessera_e2e::containerd_node`):
//! the node's pods run through containerd and runc with CNI networking, driven by the
//! real kubelet code, and Tessera is installed on it from its image by its chart
//! (`tessera_e2e::release`).
//!
//! - A pod is a real container: its exit code is the process's, `kubectl logs` its output.
//! - The chart's plugin pod registers with the kubelet and publishes the simulated GPUs;
//!   a MIG pod, a whole-GPU pod, an MPS pod and a time-sliced pod each run the CUDA probe
//!   (`tessera-probe`) in a real container, with what containerd applied from Tessera's
//!   CDI spec, and pass; deleting them unprepares and destroys what was made.
//!
//! Not here yet: MPS pods that keep working across a restart of the plugin's container
//! and a `helm upgrade` (issue 35). Today the plugin starts each GPU's MPS control daemon
//! as a child in its own container, so a restart of that container ends the daemon and a
//! running client's next context fails (`CUDA_ERROR_DEVICE_UNAVAILABLE`: the GPU is
//! `EXCLUSIVE_PROCESS` and nothing answers in its pipe directory); the daemons' new
//! lifecycle comes with that test.

// Tests fail loudly on the first unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Command, time::Duration};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaimTemplate, ResourceSlice},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use tessera_e2e::{
    BinDir, ControlPlane, ControlPlaneOptions, cluster,
    containerd_node::{ContainerdNode, NodeConfig},
    node_images::{NodeImages, PAUSE_IN_IMAGE, PROBE_IN_IMAGE},
    release::{self, Helm},
    wait::eventually,
};

const NS: &str = "default";
const POOL: &str = "containerd";
/// An H100 for MIG, and three L4s: one whole, one shared with MPS, one time-sliced.
const INVENTORY: &str =
    "gpus: [{model: h100-80gb}, {model: l4}, {model: l4}, {model: l4}]\nlatencies: zero\n";
const WAIT: Duration = Duration::from_secs(180);

async fn control_plane() -> ControlPlane {
    let mut opts = ControlPlaneOptions::new(BinDir::for_tests().unwrap());
    opts.node_network = true;
    // What runs a chart's workloads in a cluster.
    opts.extra_controllers = [
        "deployment-controller",
        "replicaset-controller",
        "daemonset-controller",
    ]
    .map(String::from)
    .to_vec();
    ControlPlane::start(opts).await.unwrap()
}

/// The GPU node, Tessera installed on it by the chart, and the policies that give each
/// GPU its strategy (what a platform team declares); returns once the plugin published
/// the node's devices in their policies' shapes.
async fn gpu_node_with_tessera(
    cp: &ControlPlane,
    images: &NodeImages,
) -> (ContainerdNode, Helm, tempfile::NamedTempFile) {
    let node = ContainerdNode::start(
        cp,
        NodeConfig {
            name: "gpu-ctr",
            labels: &[
                ("nvidia.com/gpu.present", "true"),
                ("tessera.dev/pool", POOL),
            ],
            inventory: Some(INVENTORY),
        },
        images,
    )
    .await
    .unwrap();
    let helm = Helm::new(cp).unwrap();
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(values.path(), release::test_bed_values(images)).unwrap();
    let started = std::time::Instant::now();
    if let Err(e) = helm.install(values.path(), false, &[]) {
        let pods = kubectl(cp, &["get", "pods", "-A", "-o", "wide"]);
        let events = kubectl(cp, &["get", "events", "-A"]);
        panic!(
            "{e}\n{}{}\nplugin log:\n{}",
            String::from_utf8_lossy(&pods.stdout),
            String::from_utf8_lossy(&events.stdout),
            String::from_utf8_lossy(
                &kubectl(
                    cp,
                    &[
                        "logs",
                        "-n",
                        release::NAMESPACE,
                        "ds/tessera-plugin",
                        "--tail=30"
                    ]
                )
                .stdout
            )
        );
    }
    eprintln!(
        "helm install --wait took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let client = cp.admin_client().await.unwrap();
    let policies = [
        (
            "ctr-mig",
            json!([0]),
            json!({"strategy": "MIG", "mig": {"mode": "Dynamic", "allowedProfiles": ["1g.10gb"]}}),
        ),
        ("ctr-whole", json!([1]), json!({"strategy": "Exclusive"})),
        (
            "ctr-mps",
            json!([2]),
            json!({"strategy": "MPS", "mps": {"maxClients": 4}}),
        ),
        (
            "ctr-timeslice",
            json!([3]),
            json!({"strategy": "TimeSlicing", "timeSlicing": {"maxClients": 4}}),
        ),
    ];
    let discovery = kube::Discovery::new(client.clone()).run().await.unwrap();
    for (name, indices, mut spec) in policies {
        spec["nodeSelector"] = json!({"matchLabels": {"tessera.dev/pool": POOL}});
        spec["gpuSelector"] = json!({"indices": indices});
        let doc = json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": name}, "spec": spec
        });
        cluster::apply_yaml(
            &client,
            &discovery,
            name,
            &serde_yaml::to_string(&doc).unwrap(),
            false,
        )
        .await
        .unwrap();
    }
    // The plugin publishes each GPU in its policy's shape: MIG devices of the H100, MPS
    // shares and time-slices of the L4s.
    let slices: Api<ResourceSlice> = Api::all(client);
    eventually(
        "the plugin to publish the node's devices in their policies' shapes",
        WAIT,
        || {
            let slices = slices.clone();
            async move {
                let list = slices.list(&ListParams::default()).await.ok()?;
                // Each device says what it is in its `type` attribute.
                let types: Vec<String> = list
                    .items
                    .iter()
                    .filter(|s| s.spec.node_name.as_deref() == Some("gpu-ctr"))
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .filter_map(|d| d.attributes.as_ref()?.get("type")?.string.clone())
                    .collect();
                let has = |t: &str| types.iter().any(|n| n == t);
                (has("mig") && has("gpu") && has("mps") && has("timeslice")).then_some(())
            }
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nslices:\n{}",
            String::from_utf8_lossy(&kubectl(cp, &["get", "resourceslices", "-o", "yaml"]).stdout)
        )
    });
    (node, helm, values)
}

/// A pod whose init container runs the probe with the claim (its exit code decides
/// whether the pod goes on) and whose main container holds the claim with `pause`, so
/// the probe can run again later (`kubectl exec`) in the same pod.
async fn probe_pod(client: &Client, images: &NodeImages, name: &str, request: serde_json::Value) {
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), NS);
    let template = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let claim = json!({"claims": [{"name": "gpu"}]});
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "probe", "image": images.probe, "command": [PROBE_IN_IMAGE], "resources": claim}],
            "containers": [{"name": "hold", "image": images.probe, "command": [PAUSE_IN_IMAGE], "resources": claim}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}]
        }
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

/// Waits until the pod's probe has run, and returns its exit code and `kubectl logs`.
async fn probe_result(cp: &ControlPlane, client: &Client, name: &str) -> (i32, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = eventually(&format!("the probe of {name} to end"), WAIT, || {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.ok()?;
            let status = p.status.as_ref()?;
            let probe = status.init_container_statuses.as_ref()?.first()?;
            probe.state.as_ref()?.terminated.as_ref()?;
            Some(p)
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}",
            String::from_utf8_lossy(&kubectl(cp, &["describe", "pod", name]).stdout)
        )
    });
    let code = pod.status.unwrap().init_container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap()
        .exit_code;
    let logs = kubectl(cp, &["logs", name, "-c", "probe"]);
    (code, String::from_utf8_lossy(&logs.stdout).into_owned())
}

fn kubectl(cp: &ControlPlane, args: &[&str]) -> std::process::Output {
    Command::new(cp.bins().path("kubectl"))
        .args(args)
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_is_a_real_container_with_its_exit_code_and_log() {
    let images = NodeImages::for_tests().unwrap();
    let cp = control_plane().await;
    let node = ContainerdNode::start(
        &cp,
        NodeConfig {
            name: "plain",
            labels: &[],
            inventory: None,
        },
        &images,
    )
    .await
    .unwrap();
    let client = cp.admin_client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "no-gpu"},
        "spec": {
            "nodeName": "plain",
            "restartPolicy": "Never",
            "containers": [{"name": "probe", "image": images.probe, "command": [PROBE_IN_IMAGE]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = eventually(
        "the probe container to end",
        Duration::from_secs(90),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("no-gpu").await.ok()?;
                let phase = p.status.as_ref()?.phase.clone()?;
                (phase == "Failed" || phase == "Succeeded").then_some(p)
            }
        },
    )
    .await
    .unwrap();
    let terminated = done.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    let logs = kubectl(&cp, &["logs", "no-gpu"]);
    let log = String::from_utf8_lossy(&logs.stdout);
    eprintln!(
        "kubectl logs no-gpu:\n{log}{}",
        String::from_utf8_lossy(&logs.stderr)
    );
    assert_eq!(terminated.exit_code, 1, "{terminated:?}");
    assert!(log.contains("/dev/nvidiactl"), "{log}");
    let wide = kubectl(&cp, &["get", "node", "plain", "-o", "wide"]);
    let wide = String::from_utf8_lossy(&wide.stdout);
    eprintln!("{wide}");
    assert!(wide.contains("containerd://2."), "{wide}");
    drop(node);
}

/// The pods of the four device kinds: (name, device request).
fn device_pods() -> [(&'static str, serde_json::Value); 4] {
    [
        (
            "mig",
            json!({"deviceClassName": "mig.tessera.dev", "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"}}]}),
        ),
        (
            "whole",
            json!({"deviceClassName": "gpu.tessera.dev", "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.dev'].productName == 'NVIDIA L4'"}}]}),
        ),
        (
            "mps",
            json!({"deviceClassName": "mps.tessera.dev", "capacity": {"requests": {"computePercent": "25", "memory": "4Gi"}}}),
        ),
        (
            "timeslice",
            json!({"deviceClassName": "timeslice.tessera.dev"}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn tessera_from_its_chart_gives_real_containers_their_gpus() {
    let images = NodeImages::for_tests().unwrap();
    let cp = control_plane().await;
    let (node, _helm, _values) = gpu_node_with_tessera(&cp, &images).await;
    let client = cp.admin_client().await.unwrap();

    // The plugin and the operator run in containers of the node, from the image.
    let ps = node.crictl(&["ps", "-o", "json"]).unwrap();
    let ps: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    let running: Vec<(String, String)> = ps["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["image"]["image"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    // The CRI names a container's image by its id: Tessera's, as the node imported it.
    let inspect = node
        .crictl(&["inspecti", "-o", "json", &images.tessera])
        .unwrap();
    let inspect: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let tessera_id = inspect["status"]["id"].as_str().unwrap().to_string();
    for name in ["plugin", "operator"] {
        assert!(
            running.iter().any(|(n, i)| n == name && *i == tessera_id),
            "no {name} container from Tessera's image ({tessera_id}) in {running:?}"
        );
    }

    for (name, request) in device_pods() {
        probe_pod(&client, &images, name, request).await;
    }
    for (name, _) in device_pods() {
        let (code, log) = probe_result(&cp, &client, name).await;
        eprintln!("==== kubectl logs {name} -c probe (exit code {code})\n{log}");
        assert_eq!(code, 0, "{name}: the probe failed in its container:\n{log}");
        assert!(
            log.contains("CUDA sees the claimed device"),
            "{name}: {log}"
        );
        cluster::wait_pod_running(&client, NS, name, WAIT)
            .await
            .unwrap();
    }
    let driver = node.driver().unwrap();
    let state = tessera_gpu::backend::sim::state::load_state(&driver.state())
        .unwrap()
        .unwrap();
    assert_eq!(state.gpus[0].instances.len(), 1, "the MIG pod's instance");
    let specs = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("k8s.gpu.tessera.dev-claim_")
            })
            .count()
    };
    assert_eq!(specs(&node.cdi_dir()), 4, "a CDI spec per claim");

    // Deleting the pods unprepares their claims: the MIG instance is destroyed and the
    // CDI specs are gone.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for (name, _) in device_pods() {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let cdi = node.cdi_dir();
    let state_file = driver.state();
    eventually("the claims to be unprepared", WAIT, || {
        let pods = pods.clone();
        let cdi = cdi.clone();
        let state_file = state_file.clone();
        async move {
            let left = pods.list(&ListParams::default()).await.ok()?.items.len();
            let state = tessera_gpu::backend::sim::state::load_state(&state_file).ok()??;
            (left == 0 && specs(&cdi) == 0 && state.gpus[0].instances.is_empty()).then_some(())
        }
    })
    .await
    .unwrap();
    drop(node);
}
