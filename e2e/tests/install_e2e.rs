//! Installing Tessera as a platform team would: the Helm chart (`charts/tessera`) and the
//! kustomize base (`config/default`) render the same objects, `helm lint` is clean, a bad
//! value is refused (that every value is documented is `cargo xtask docs --check`'s), and
//! on the real control plane with real kubelets `helm install` creates everything, the
//! plugin's DaemonSets land on the GPU nodes and the operator on the others, `helm
//! upgrade` rolls the pods, and `helm uninstall` leaves nothing behind but the CRDs (kept
//! on purpose) and the namespace.
//!
//! Helm is built from the Go module proxy with the control plane (`cargo xtask
//! controlplane build`); kustomize is the one inside the suite's kubectl.

// Tests fail loudly on the first unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams},
    discovery::{Discovery, verbs},
};
use serde_json::{Value, json};
use tessera_e2e::{
    BinDir, ControlPlane, ControlPlaneOptions, kubelet::HollowKubelet, repo_root, wait::eventually,
};

const NS: &str = "tessera-system";
const RELEASE: &str = "tessera";
const GPU_LABEL: &str = "nvidia.com/gpu.present";

fn chart() -> PathBuf {
    repo_root().join("charts/tessera")
}

/// Helm with its own config, cache and data directories, so tests neither read a user's
/// Helm setup nor race each other on it.
struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    fn new(kubeconfig: Option<&Path>) -> Self {
        Self {
            bin: tessera_e2e::helm::for_tests().unwrap_or_else(|e| panic!("{e}")),
            home: tempfile::tempdir().unwrap(),
            kubeconfig: kubeconfig.map(Path::to_path_buf),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .env("HELM_CONFIG_HOME", self.home.path().join("config"))
            .env("HELM_CACHE_HOME", self.home.path().join("cache"))
            .env("HELM_DATA_HOME", self.home.path().join("data"));
        match &self.kubeconfig {
            Some(k) => cmd.env("KUBECONFIG", k),
            None => cmd.env_remove("KUBECONFIG"),
        };
        cmd.output().unwrap()
    }

    /// Runs and returns stdout; panics with stderr on failure.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "helm {} failed:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn kubectl(bins: &BinDir, args: &[&str]) -> String {
    let out = Command::new(bins.path("kubectl"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Labels only one of the two tools adds; everything else must be equal.
const TOOL_LABELS: [&str; 3] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
];

/// Whole floats as integers: crds/ says `maximum: 63.0`, kustomize writes it back as
/// `63`; the API server reads both as the same number.
fn integral_numbers(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && n.is_f64()) {
                *v = json!(f as i64);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(integral_numbers),
        Value::Object(o) => o.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

/// The objects of a multi-document YAML stream, by `kind namespace/name`, normalised: the
/// labels of [`TOOL_LABELS`] removed (an emptied label map too), whole floats as integers.
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let mut v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if v.is_null() {
            continue;
        }
        integral_numbers(&mut v);
        if let Some(labels) = v["metadata"]["labels"].as_object_mut() {
            for l in TOOL_LABELS {
                labels.remove(l);
            }
            if labels.is_empty() {
                v["metadata"].as_object_mut().unwrap().remove("labels");
            }
        }
        let key = format!(
            "{} {}/{}",
            v["kind"].as_str().unwrap(),
            v["metadata"]["namespace"].as_str().unwrap_or(""),
            v["metadata"]["name"].as_str().unwrap()
        );
        assert!(out.insert(key.clone(), v).is_none(), "{key} twice");
    }
    out
}

fn assert_same_objects(helm: &BTreeMap<String, Value>, kustomize: &BTreeMap<String, Value>) {
    let h: BTreeSet<&String> = helm.keys().collect();
    let k: BTreeSet<&String> = kustomize.keys().collect();
    assert_eq!(
        h,
        k,
        "the chart and config/default render different objects (only in the chart: {:?}; only in kustomize: {:?})",
        h.difference(&k).collect::<Vec<_>>(),
        k.difference(&h).collect::<Vec<_>>()
    );
    for (key, obj) in helm {
        assert!(
            obj == &kustomize[key],
            "{key} differs:\n--- chart\n{}\n--- kustomize\n{}",
            serde_yaml::to_string(obj).unwrap(),
            serde_yaml::to_string(&kustomize[key]).unwrap()
        );
    }
}

/// kustomize of `resources` (paths relative to the repo) through a scratch overlay inside
/// the repository's target dir (kustomize takes no absolute or out-of-tree bases).
fn kustomize(bins: &BinDir, name: &str, resources: &[&str]) -> BTreeMap<String, Value> {
    let dir = repo_root().join("target").join("kustomize-test").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let list: String = resources
        .iter()
        .map(|r| format!("  - ../../../{r}\n"))
        .collect();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("resources:\n{list}"),
    )
    .unwrap();
    let mut objs = objects(&kubectl(bins, &["kustomize", dir.to_str().unwrap()]));
    // Helm makes the namespace (`--create-namespace`) rather than owning it, so a chart
    // does not render it; the kustomize base has to.
    let ns = objs.remove(&format!("Namespace /{NS}"));
    assert!(ns.is_some(), "config/default lacks the {NS} Namespace");
    objs
}

#[test]
fn the_chart_and_the_kustomize_base_render_the_same_objects() {
    let bins = BinDir::for_tests().unwrap();
    let helm = Helm::new(None);
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let render = |extra: &[&str]| {
        let mut args = vec!["template", RELEASE, chart, "-n", NS, "--include-crds"];
        args.extend_from_slice(extra);
        objects(&helm.ok(&args))
    };
    let defaults = render(&[]);
    // Everything the issue asks for is there.
    for want in [
        "CustomResourceDefinition /gpusharingpolicies.tessera.dev",
        "CustomResourceDefinition /gpunodes.tessera.dev",
        "DeviceClass /mig.tessera.dev",
        "ClusterRole /tessera-plugin",
        "ClusterRole /tessera-operator",
        "Role tessera-system/tessera-operator-leader-election",
        "Deployment tessera-system/tessera-operator",
        "DaemonSet tessera-system/tessera-plugin-amd64",
        "DaemonSet tessera-system/tessera-plugin-arm64",
        "Service tessera-system/tessera-operator-metrics",
        "Service tessera-system/tessera-plugin-metrics",
        "ValidatingAdmissionPolicy /tessera-plugin-node-restriction",
        "ValidatingAdmissionPolicyBinding /tessera-plugin-node-restriction",
    ] {
        assert!(defaults.contains_key(want), "the chart renders no {want}");
    }
    assert_same_objects(&defaults, &kustomize(&bins, "default", &["config/default"]));
    let monitoring = render(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.dashboard.enabled=true",
    ]);
    assert_eq!(monitoring.len(), defaults.len() + 3);
    assert_same_objects(
        &monitoring,
        &kustomize(
            &bins,
            "monitoring",
            &["config/default", "config/monitoring"],
        ),
    );
}

/// The host path and the container path of a plugin DaemonSet's volume `name`.
fn driver_file(ds: &Value, name: &str) -> (String, String) {
    let spec = &ds["spec"]["template"]["spec"];
    let host = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))["hostPath"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no mount {name}"))["mountPath"]
        .as_str()
        .unwrap()
        .to_string();
    (host, mount)
}

#[test]
fn each_architecture_gets_a_daemonset_with_its_driver_paths() {
    let helm = Helm::new(None);
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let render = |extra: &[&str]| {
        let mut args = vec!["template", RELEASE, chart, "-n", NS];
        args.extend_from_slice(extra);
        objects(&helm.ok(&args))
    };
    let defaults = render(&[]);
    for (arch, dir) in [
        ("amd64", "/usr/lib/x86_64-linux-gnu"),
        ("arm64", "/usr/lib/aarch64-linux-gnu"),
    ] {
        let ds = &defaults[&format!("DaemonSet {NS}/tessera-plugin-{arch}")];
        let spec = &ds["spec"]["template"]["spec"];
        assert_eq!(spec["nodeSelector"]["kubernetes.io/arch"], arch, "{ds}");
        assert_eq!(spec["nodeSelector"][GPU_LABEL], "true", "{ds}");
        // The metrics Service and the alerts select every architecture's pods by name.
        assert_eq!(
            ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
            "tessera-plugin"
        );
        for lib in ["nvml", "libcuda"] {
            let (host, mount) = driver_file(ds, lib);
            assert!(host.starts_with(&format!("{dir}/")), "{arch} {lib}: {host}");
            assert!(
                mount.starts_with(&format!("{dir}/")),
                "{arch} {lib}: {mount}"
            );
        }
    }
    // An explicit directory (RHEL-like hosts) applies to every architecture on the host
    // side; inside the image the loader's directory stays the architecture's.
    let rhel = render(&[
        "--set",
        "plugin.driver.libDir=/usr/lib64",
        "--set",
        "plugin.driver.root=/run/nvidia/driver",
        "--set",
        "plugin.architectures={arm64}",
    ]);
    assert!(!rhel.contains_key(&format!("DaemonSet {NS}/tessera-plugin-amd64")));
    let (host, mount) = driver_file(
        &rhel[&format!("DaemonSet {NS}/tessera-plugin-arm64")],
        "nvml",
    );
    assert_eq!(host, "/run/nvidia/driver/usr/lib64/libnvidia-ml.so.1");
    assert_eq!(mount, "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1");
}

#[test]
fn the_node_restriction_policy_is_the_one_config_rbac_ships() {
    // The chart's copy is generated; this checks the chart really renders it with the
    // release's namespace in the ServiceAccount the policy matches.
    let helm = Helm::new(None);
    let chart = chart();
    let rendered = objects(&helm.ok(&[
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "-n",
        "gpu-sharing",
    ]));
    let source = objects(
        &std::fs::read_to_string(repo_root().join("config/rbac/plugin-node-restriction.yaml"))
            .unwrap()
            .replace("tessera-system", "gpu-sharing"),
    );
    for (key, obj) in &source {
        assert_eq!(&rendered[key], obj, "{key}");
    }
    let policy = &rendered["ValidatingAdmissionPolicy /tessera-plugin-node-restriction"];
    assert!(
        policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:gpu-sharing:tessera-plugin"),
        "{policy}"
    );
}

#[test]
fn helm_lint_is_clean() {
    let helm = Helm::new(None);
    let chart = chart();
    let out = helm.run(&["lint", "--strict", chart.to_str().unwrap()]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{text}"
    );
    assert!(
        !text.contains("[WARNING]") && !text.contains("[ERROR]"),
        "{text}"
    );
}

#[test]
fn a_bad_value_is_refused_with_a_message_naming_it() {
    let helm = Helm::new(None);
    let chart = chart();
    for (set, names) in [
        ("plugin.defaultStrategy=mig", "defaultStrategy"),
        ("operator.logFormat=xml", "logFormat"),
        ("operator.replicas=-1", "replicas"),
        ("plugin.kubeletDir=var/lib/kubelet", "kubeletDir"),
        ("plugin.nodeSelecter.gpu=true", "nodeSelecter"),
        ("plugin.architectures={ppc64le}", "architectures"),
        ("plugin.driver.libDir=usr/lib64", "libDir"),
    ] {
        let out = helm.run(&["template", RELEASE, chart.to_str().unwrap(), "--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(err.contains(names), "{set}: {err}");
    }
}

// === on the real control plane ===

/// Every object name of every listable kind, as `group/kind namespace/name` (Events and
/// the kubelets' heartbeat Leases aside: they record what happened and come and go on
/// their own).
async fn inventory(client: &Client) -> BTreeSet<String> {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut out = BTreeSet::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::LIST) || ar.kind == "Event" {
                continue;
            }
            // All namespaces at once for namespaced kinds too.
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let list = api
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("listing {}: {e}", ar.plural));
            for o in list {
                if ar.kind == "Lease" && o.namespace().as_deref() == Some("kube-node-lease") {
                    continue;
                }
                out.insert(format!(
                    "{}/{} {}/{}",
                    ar.group,
                    ar.kind,
                    o.namespace().unwrap_or_default(),
                    o.name_any()
                ));
            }
        }
    }
    out
}

fn pods_by_node(pods: &[Pod]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in pods {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        *out.entry(node).or_default() += 1;
    }
    out
}

async fn running_pods(client: &Client, app: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .collect()
}

fn args_of(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default()
}

#[tokio::test]
async fn helm_install_upgrade_and_uninstall_on_real_kubelets() {
    let bins = BinDir::for_tests().unwrap();
    let mut opts = ControlPlaneOptions::new(bins);
    // What runs a chart's workloads in a cluster; the test bed leaves them out otherwise.
    opts.extra_controllers = [
        "deployment-controller",
        "replicaset-controller",
        "daemonset-controller",
    ]
    .map(String::from)
    .to_vec();
    let cp = ControlPlane::start(opts).await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let roots = tempfile::Builder::new()
        .prefix("tessera-install-")
        .tempdir_in("/tmp")
        .unwrap();
    let mut kubelets = Vec::new();
    for (node, gpu) in [
        ("gpu-a", true),
        ("gpu-b", true),
        ("cpu-a", false),
        ("cpu-b", false),
    ] {
        let labels: &[(&str, &str)] = if gpu { &[(GPU_LABEL, "true")] } else { &[] };
        kubelets.push(
            HollowKubelet::start(&cp, node, &roots.path().join(node), labels)
                .await
                .unwrap(),
        );
    }
    // A GPU node tainted as GPU node pools usually are: the plugin tolerates it (the
    // chart's default toleration), the operator does not.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "gpu-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();

    let before = inventory(&client).await;
    let helm = Helm::new(Some(cp.kubeconfig_path()));
    let chart = chart();
    let chart = chart.to_str().unwrap();
    // The fake container runtime reports every pod at 192.168.192.168, so the kubelet's
    // HTTP probes would go to an address off this machine (and fail): the test installs
    // without them. Their rendering is covered by the kustomize comparison above.
    let no_probes = [
        "--set",
        "operator.livenessProbe=null",
        "--set",
        "operator.readinessProbe=null",
        "--set",
        "plugin.livenessProbe=null",
        "--set",
        "plugin.readinessProbe=null",
    ];
    let mut install = vec![
        "install",
        RELEASE,
        chart,
        "-n",
        NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "3m",
    ];
    install.extend_from_slice(&no_probes);
    let started = std::time::Instant::now();
    let notes = helm.ok(&install);
    println!(
        "helm install --wait took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // templates/NOTES.txt: what was installed and how to check it, with this release's
    // namespace.
    for want in [
        "rollout status deployment/tessera-operator",
        "rollout status daemonset/tessera-plugin-amd64",
        "kubectl get gpunodes",
        "plugin.defaultStrategy=dynamic-mig",
        "getting-started/gpu-operator.md",
    ] {
        assert!(notes.contains(want), "NOTES lack {want:?}:\n{notes}");
    }

    // Everything of the release exists, and the CRDs are served.
    let manifest = objects(&helm.ok(&["get", "manifest", RELEASE, "-n", NS]));
    let after_install = inventory(&client).await;
    for obj in manifest.values() {
        let api_version = obj["apiVersion"].as_str().unwrap();
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        let key = format!(
            "{group}/{} {}/{}",
            obj["kind"].as_str().unwrap(),
            obj["metadata"]["namespace"].as_str().unwrap_or(""),
            obj["metadata"]["name"].as_str().unwrap()
        );
        assert!(after_install.contains(&key), "{key} was not created");
    }
    assert!(manifest.len() >= 16, "{:?}", manifest.keys());
    for crd in ["gpusharingpolicies.tessera.dev", "gpunodes.tessera.dev"] {
        let key = format!("apiextensions.k8s.io/CustomResourceDefinition /{crd}");
        assert!(after_install.contains(&key), "{key} was not created");
    }
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    gpunodes.list(&ListParams::default()).await.unwrap();

    // The plugin on each GPU node (the tainted one too), the operator on the others.
    let (plugins, operators) = eventually(
        "a plugin pod on each GPU node and both operator replicas to run",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let plugins = running_pods(&client, "tessera-plugin").await;
                let operators = running_pods(&client, "tessera-operator").await;
                (plugins.len() == 2 && operators.len() == 2).then_some((plugins, operators))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        pods_by_node(&plugins),
        BTreeMap::from([("gpu-a".to_string(), 1), ("gpu-b".to_string(), 1)]),
        "plugin pods"
    );
    let placement = pods_by_node(&operators);
    assert!(
        placement.keys().all(|n| n.starts_with("cpu-")),
        "operator pods on GPU nodes: {placement:?}"
    );
    for p in &plugins {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert!(args_of(p).contains(&"--log-format=json".to_string()));
        // The pod UID names its kubelet sockets, so the DaemonSet can surge.
        let pod_uid = spec.containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "POD_UID")
            .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
            .map(|f| f.field_path.clone());
        assert_eq!(pod_uid.as_deref(), Some("metadata.uid"));
    }

    // An upgrade rolls the DaemonSet's and the Deployment's pods onto the new settings.
    let mut upgrade = vec![
        "upgrade",
        RELEASE,
        chart,
        "-n",
        NS,
        "--wait",
        "--timeout",
        "3m",
        "--set",
        "plugin.logFormat=text",
        "--set",
        "operator.logFormat=text",
    ];
    upgrade.extend_from_slice(&no_probes);
    helm.ok(&upgrade);
    let text = "--log-format=text".to_string();
    let rolled = eventually(
        "every Tessera pod to run with the upgraded flags",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            let text = text.clone();
            async move {
                let plugins = running_pods(&client, "tessera-plugin").await;
                let operators = running_pods(&client, "tessera-operator").await;
                (plugins.len() == 2
                    && operators.len() == 2
                    && plugins
                        .iter()
                        .chain(&operators)
                        .all(|p| args_of(p).contains(&text)))
                .then_some((plugins, operators))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(pods_by_node(&rolled.0).len(), 2);
    let status = helm.ok(&["status", RELEASE, "-n", NS, "-o", "json"]);
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["version"], 2, "{status}");

    // Uninstall leaves what was there before, the namespace Helm created (Helm never
    // deletes namespaces) and the CRDs (kept, so that uninstalling the chart cannot
    // delete every GpuSharingPolicy).
    helm.ok(&["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "3m"]);
    let expected_left: BTreeSet<String> = [
        format!("/Namespace /{NS}"),
        // Made by the serviceaccount controller in every namespace.
        format!("/ServiceAccount {NS}/default"),
        "apiextensions.k8s.io/CustomResourceDefinition /gpusharingpolicies.tessera.dev".into(),
        "apiextensions.k8s.io/CustomResourceDefinition /gpunodes.tessera.dev".into(),
        // The API server's own registration of the CRDs' group, there as long as they are.
        "apiregistration.k8s.io/APIService /v1alpha1.tessera.dev".into(),
    ]
    .into();
    let left = eventually(
        "everything of the release to be gone (pods deleted by the garbage collector)",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            let before = before.clone();
            let expected_left = expected_left.clone();
            async move {
                let now = inventory(&client).await;
                let new: BTreeSet<String> = now.difference(&before).cloned().collect();
                (new == expected_left).then_some(new)
            }
        },
    )
    .await;
    if left.is_err() {
        let now = inventory(&client).await;
        let new: Vec<&String> = now.difference(&before).collect();
        panic!("helm uninstall left behind more than the CRDs and the namespace: {new:?}");
    }
    drop(kubelets);
}

#[test]
fn the_chart_and_the_kustomize_base_install_this_release() {
    let version = env!("CARGO_PKG_VERSION");
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(version),
        "charts/tessera/Chart.yaml appVersion (the image tag it installs) must follow the workspace version"
    );
    let kustomization: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("config/default/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        kustomization["images"][0]["newTag"].as_str(),
        Some(version),
        "config/default/kustomization.yaml must set the image tag to the workspace version"
    );
}
