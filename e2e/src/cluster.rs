//! Helpers for tests on a real control plane: Nodes without kubelets, clients for
//! ServiceAccounts, manifests applied as a user would, and condition waits (never sleeps).

use std::{collections::BTreeMap, path::Path, time::Duration};

use k8s_openapi::{
    api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::{Namespace, Node, NodeCondition, NodeStatus, ServiceAccount},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
    discovery::{ApiCapabilities, Discovery, Scope},
    runtime::wait::{Condition, await_condition, conditions},
};
use serde::de::DeserializeOwned;

use crate::ControlPlane;

/// A cluster helper failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{action}")]
    Kube {
        /// What was being done.
        action: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// A wait timed out.
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// Timeout.
        seconds: u64,
    },
    /// A manifest is not valid YAML or names an unknown kind.
    #[error("manifest {source_name}: {detail}")]
    Manifest {
        /// File or description.
        source_name: String,
        /// What is wrong.
        detail: String,
    },
    /// The control plane failed.
    #[error(transparent)]
    ControlPlane(#[from] crate::controlplane::Error),
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// The API server's own `/metrics` (Prometheus text), read with `client`'s credentials.
pub async fn apiserver_metrics(client: &Client) -> Result<String> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Error::Manifest {
            source_name: "/metrics".into(),
            detail: e.to_string(),
        })?;
    client
        .request_text(req)
        .await
        .map_err(kube_err("reading the API server's /metrics"))
}

/// Creates a ready, untainted Node with room for pods, as a kubelet would report it.
pub async fn create_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = Node::default();
    node.metadata.name = Some(name.to_string());
    node.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .chain([("kubernetes.io/hostname".to_string(), name.to_string())])
            .collect(),
    );
    let created = nodes
        .create(&PostParams::default(), &node)
        .await
        .map_err(kube_err(format!("creating Node {name}")))?;
    let resources: BTreeMap<String, Quantity> =
        [("cpu", "16"), ("memory", "64Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect();
    let status = NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("TesseraTestBed".into()),
            message: Some("node object created by the Tessera test bed (no kubelet)".into()),
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    };
    let patch = serde_json::json!({ "status": status });
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!("setting status of Node {name}")))?;
    Ok(created)
}

/// What a test pod asks for: one request named `gpu` of `class`.
#[derive(Clone, Debug, Default)]
pub struct GpuRequest<'a> {
    /// DeviceClass.
    pub class: &'a str,
    /// Optional CEL selector.
    pub selector: Option<&'a str>,
    /// Optional capacity requests, e.g. `{"computePercent": "25", "memory": "4Gi"}`.
    pub capacity: Option<serde_json::Value>,
}

/// Creates a ResourceClaimTemplate `name` with one request and a Pod `name` whose one
/// container uses the claim made from it, as a user's manifest would.
pub async fn create_claim_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    req: GpuRequest<'_>,
) -> Result<()> {
    create_claim_pod_on(client, namespace, name, req, None).await
}

/// [`create_claim_pod`], with the pod held to `node` by a node selector when given.
pub async fn create_claim_pod_on(
    client: &Client,
    namespace: &str,
    name: &str,
    req: GpuRequest<'_>,
    node: Option<&str>,
) -> Result<()> {
    let mut exactly = serde_json::json!({"deviceClassName": req.class});
    if let Some(sel) = req.selector {
        exactly["selectors"] = serde_json::json!([{"cel": {"expression": sel}}]);
    }
    if let Some(cap) = req.capacity {
        exactly["capacity"] = serde_json::json!({"requests": cap});
    }
    let objects = [
        serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
        }),
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}]
            }
        }),
    ];
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(client.clone(), namespace);
    let template = serde_json::from_value(objects[0].clone()).map_err(|e| Error::Manifest {
        source_name: name.into(),
        detail: e.to_string(),
    })?;
    templates
        .create(&PostParams::default(), &template)
        .await
        .map_err(kube_err(format!(
            "creating ResourceClaimTemplate {namespace}/{name}"
        )))?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let mut manifest = objects[1].clone();
    if let Some(node) = node {
        manifest["spec"]["affinity"] = on_node(node);
    }
    let pod = serde_json::from_value(manifest).map_err(|e| Error::Manifest {
        source_name: name.into(),
        detail: e.to_string(),
    })?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(kube_err(format!("creating Pod {namespace}/{name}")))?;
    Ok(())
}

/// A pod affinity that holds it to `node` (by name, whatever labels the node has).
pub fn on_node(node: &str) -> serde_json::Value {
    serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}
        ]}]
    }}})
}

/// Whether the scheduler said it found no node for the pod (`PodScheduled=False`,
/// reason `Unschedulable`: object state, not the message's text).
pub fn unschedulable(p: &k8s_openapi::api::core::v1::Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        })
}

/// Creates a namespace (idempotent).
pub async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.to_string());
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!("creating namespace {name}"))(e)),
    }
}

/// A client that authenticates as ServiceAccount `namespace/name` (created if missing) with
/// a real token from the TokenRequest API, so the requests go through RBAC like the
/// component's would in a cluster.
pub async fn service_account_client(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
) -> Result<Client> {
    let token = service_account_token(cp, namespace, name, None).await?;
    let mut config = cp.admin_config().await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).map_err(kube_err("building a ServiceAccount client"))
}

async fn service_account_token(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    bound: Option<k8s_openapi::api::authentication::v1::BoundObjectReference>,
) -> Result<String> {
    let admin = cp.admin_client().await?;
    create_namespace(&admin, namespace).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some(name.to_string());
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => {
            return Err(kube_err(format!(
                "creating ServiceAccount {namespace}/{name}"
            ))(e));
        }
    }
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            // Long enough for any test or demo session.
            expiration_seconds: Some(24 * 3600),
            bound_object_ref: bound,
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = sas
        .create_token_request(name, &PostParams::default(), &req)
        .await
        .map_err(kube_err(format!(
            "requesting a token for {namespace}/{name}"
        )))?
        .status
        .and_then(|s| s.token)
        .unwrap_or_default();
    Ok(token)
}

/// Writes a kubeconfig that authenticates as ServiceAccount `namespace/name` (created if
/// missing), for a component started as a separate process.
pub async fn service_account_kubeconfig(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    path: &Path,
) -> Result<()> {
    let token = service_account_token(cp, namespace, name, None).await?;
    write_token_kubeconfig(cp, namespace, name, &token, path)
}

/// Like [`service_account_kubeconfig`], but the token is bound to a Pod object of the
/// ServiceAccount on `node` (created here, as the DaemonSet's pod would be), so the API
/// server knows which node the caller runs on. Node-scoped permissions such as
/// `associated-node:patch` on `resourceclaims/driver` (writing `status.devices` of claims
/// allocated on that node) only work with such a token.
pub async fn node_bound_kubeconfig(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    node: &str,
    path: &Path,
) -> Result<()> {
    let admin = cp.admin_client().await?;
    create_namespace(&admin, namespace).await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin, namespace);
    let pod_name = format!("{name}-{node}");
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/name": name}},
        "spec": {"nodeName": node, "serviceAccountName": name,
                 "containers": [{"name": "plugin", "image": "tessera-plugin:dev"}]}
    }))
    .map_err(|e| Error::Manifest {
        source_name: pod_name.clone(),
        detail: e.to_string(),
    })?;
    let pod = match pods.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(kube::Error::Api(s)) if s.code == 409 => pods
            .get(&pod_name)
            .await
            .map_err(kube_err(format!("reading Pod {namespace}/{pod_name}")))?,
        Err(e) => return Err(kube_err(format!("creating Pod {namespace}/{pod_name}"))(e)),
    };
    let bound = k8s_openapi::api::authentication::v1::BoundObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod_name.clone()),
        uid: pod.metadata.uid.clone(),
    };
    let token = service_account_token(cp, namespace, name, Some(bound)).await?;
    write_token_kubeconfig(cp, namespace, name, &token, path)
}

fn write_token_kubeconfig(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    token: &str,
    path: &Path,
) -> Result<()> {
    let admin = std::fs::read_to_string(cp.kubeconfig_path()).map_err(|e| Error::Manifest {
        source_name: cp.kubeconfig_path().display().to_string(),
        detail: e.to_string(),
    })?;
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&admin).map_err(|e| Error::Manifest {
        source_name: "admin kubeconfig".into(),
        detail: e.to_string(),
    })?;
    kc["users"][0]["name"] = format!("{namespace}-{name}").into();
    kc["users"][0]["user"] = serde_yaml::from_str(&format!("token: {token}")).unwrap_or_default();
    kc["contexts"][0]["context"]["user"] = format!("{namespace}-{name}").into();
    let text = serde_yaml::to_string(&kc).unwrap_or_default();
    std::fs::write(path, text).map_err(|e| Error::Manifest {
        source_name: path.display().to_string(),
        detail: e.to_string(),
    })
}

/// Waits until pod `namespace/name` is Running.
pub async fn wait_pod_running(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<k8s_openapi::api::core::v1::Pod> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    wait_for(
        &pods,
        name,
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running")
        },
        &format!("pod {namespace}/{name} to run"),
        timeout,
    )
    .await
}

/// Waits until `cond` holds for the named object.
pub async fn wait_for<K, C>(
    api: &Api<K>,
    name: &str,
    cond: C,
    what: &str,
    timeout: Duration,
) -> Result<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    C: Condition<K>,
{
    let fut = await_condition(api.clone(), name, cond);
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(Some(obj))) => Ok(obj),
        Ok(Ok(None)) => Err(Error::Timeout {
            what: format!("{what} (object {name} was deleted)"),
            seconds: timeout.as_secs(),
        }),
        Ok(Err(e)) => Err(Error::Manifest {
            source_name: name.to_string(),
            detail: format!("watch failed while waiting for {what}: {e}"),
        }),
        Err(_) => Err(Error::Timeout {
            what: what.to_string(),
            seconds: timeout.as_secs(),
        }),
    }
}

/// Installs CRDs and waits until the API server serves them.
pub async fn install_crds(client: &Client, crds: &[CustomResourceDefinition]) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("tessera-e2e").force();
    for crd in crds {
        let name = crd.name_any();
        api.patch(&name, &pp, &Patch::Apply(crd))
            .await
            .map_err(kube_err(format!("installing CRD {name}")))?;
    }
    for crd in crds {
        let name = crd.name_any();
        wait_for(
            &api,
            &name,
            conditions::is_crd_established(),
            &format!("CRD {name} to be established"),
            Duration::from_secs(30),
        )
        .await?;
    }
    Ok(())
}

/// Outcome of applying one manifest document.
#[derive(Debug)]
pub struct Applied {
    /// `Kind/name`.
    pub object: String,
}

/// Applies every document of a (multi-document) YAML file with server-side apply, as
/// `kubectl apply --server-side` would; with `dry_run` nothing is stored but the API server
/// still runs admission and validation (CEL rules included).
pub async fn apply_yaml(
    client: &Client,
    discovery: &Discovery,
    source_name: &str,
    yaml: &str,
    dry_run: bool,
) -> Result<Vec<Applied>> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value: serde_json::Value =
            serde::Deserialize::deserialize(doc).map_err(|e| Error::Manifest {
                source_name: source_name.to_string(),
                detail: e.to_string(),
            })?;
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(value).map_err(|e| Error::Manifest {
            source_name: source_name.to_string(),
            detail: e.to_string(),
        })?;
        let types = obj.types.clone().ok_or_else(|| Error::Manifest {
            source_name: source_name.to_string(),
            detail: "a document has no apiVersion/kind".into(),
        })?;
        let gvk = GroupVersionKind::try_from(&types).map_err(|e| Error::Manifest {
            source_name: source_name.to_string(),
            detail: e.to_string(),
        })?;
        let (ar, caps): (_, ApiCapabilities) =
            discovery.resolve_gvk(&gvk).ok_or_else(|| Error::Manifest {
                source_name: source_name.to_string(),
                detail: format!(
                    "the API server does not serve {}/{}",
                    types.api_version, types.kind
                ),
            })?;
        let name = obj.name_any();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => Api::all_with(client.clone(), &ar),
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or("default"),
                &ar,
            ),
        };
        let mut pp = PatchParams::apply("tessera-e2e");
        pp.dry_run = dry_run;
        api.patch(&name, &pp, &Patch::Apply(&obj))
            .await
            .map_err(kube_err(format!(
                "applying {} {name} from {source_name}",
                types.kind
            )))?;
        out.push(Applied {
            object: format!("{}/{name}", types.kind),
        });
    }
    Ok(out)
}

/// Applies every `*.yaml` file of a directory (sorted by name) but its `kustomization.yaml`.
pub async fn apply_dir(client: &Client, dir: &Path, dry_run: bool) -> Result<Vec<Applied>> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .map_err(kube_err("running API discovery"))?;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::Manifest {
            source_name: dir.display().to_string(),
            detail: e.to_string(),
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        // A directory's kustomization (config/rbac, config/deviceclasses) lists its files
        // for `kubectl apply -k`; it is no object for the API server.
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| Error::Manifest {
            source_name: f.display().to_string(),
            detail: e.to_string(),
        })?;
        out.extend(apply_yaml(client, &discovery, &f.display().to_string(), &text, dry_run).await?);
    }
    Ok(out)
}

/// The events about object `name` in `namespace`, oldest first, each as
/// "`reason`: `message` (×`count`)".
pub async fn events_for(client: &Client, namespace: &str, name: &str) -> Result<Vec<String>> {
    use k8s_openapi::api::core::v1::Event;
    let mut events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map_err(kube_err("listing events"))?
        .items;
    events.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    Ok(events
        .into_iter()
        .map(|e| {
            format!(
                "{}: {} (×{})",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
                e.count.unwrap_or(1)
            )
        })
        .collect())
}
